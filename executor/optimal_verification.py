"""The run-time optimal multi-draft verifier in torch: the executor's twin of :func:`theory.optimal_verifier`.

The build (priority classes, race weights and the exact selection marginal ``r``) runs in numpy on the host,
one row at a time (:func:`theory.optimal_verifier.optimal_tables`, on the tensors' own memory when they are
float64 on the CPU: numpy measured faster than torch for its few-hundred-item fit and its bincounts); the step
itself runs in torch on the tensors' device with the caller's :class:`torch.Generator`:

1. among the drafts in the highest priority class present, select draft ``i`` with probability
   :math:`w(x_i) / \\sum_j w(x_j)` (the law of the first exponential clock to ring);
2. accept the selected ``y`` with probability :math:`\\min(1, p(y)/r(y))` (written ``u r(y) < p(y)``);
3. otherwise output a draw from :math:`(p - r)_+ / \\|(p - r)_+\\|_1`.

Lossless because ``r`` is the exact marginal of step 1 (Khisti et al., arXiv 2410.18234), and its acceptance is
:math:`\\sum \\min(p, r) = \\alpha^*` up to the build's reported shortfall (``docs/verifiers.md``).
"""

from __future__ import annotations

import numpy as np
import torch

from executor.sampling import _draw
from theory.optimal_verifier import optimal_tables

__all__ = ["build_tables", "verify_optimal"]


def build_tables(p: torch.Tensor, q: torch.Tensor, n: int) -> dict[str, torch.Tensor]:
    """The per-row tables of the numpy build, as float64/int64 tensors on ``p``'s device.

    Keys: ``class_id``, ``log_weight``, ``marginal`` (``r``), each of shape ``p.shape``. On the CPU the rows
    are handed to numpy and back without copies (float64 tensors share memory with their arrays); the
    residual :math:`(p - r)_+` is left to :func:`verify_optimal`, which forms it only on a rejection.
    """
    vocab = p.shape[-1]
    flat_p, flat_q = p.reshape(-1, vocab), q.reshape(-1, vocab)
    # A batch of one repeated pair (Monte Carlo over many steps of one position) is built once.
    repeated = flat_p.shape[0] > 1 and bool((flat_p == flat_p[:1]).all() and (flat_q == flat_q[:1]).all())
    rows = 1 if repeated else flat_p.shape[0]
    host_p = flat_p[:rows].detach().to("cpu", torch.float64).numpy()
    host_q = flat_q[:rows].detach().to("cpu", torch.float64).numpy()
    built = [optimal_tables(host_p[i], host_q[i], n) for i in range(rows)]
    tables = {}
    for key in ("class_id", "log_weight", "marginal"):
        value = torch.from_numpy(
            np.stack([getattr(b, key) for b in built]) if rows > 1 else getattr(built[0], key)
        )
        tables[key] = value.to(p.device).expand(flat_p.shape).reshape(p.shape)
    return tables


def selection_probabilities(tables: dict[str, torch.Tensor], drafts: torch.Tensor) -> torch.Tensor:
    """``(..., n)`` probability that each draft position wins the race (0 outside the top class present)."""
    classes = tables["class_id"].gather(-1, drafts)
    logs = tables["log_weight"].gather(-1, drafts)
    top = classes == classes.max(dim=-1, keepdim=True).values
    logs = torch.where(top, logs, torch.full_like(logs, -torch.inf))
    return torch.softmax(logs, dim=-1)


def _accepts(uniform: torch.Tensor, numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    return uniform * denominator < numerator


def verify_optimal(
    p: torch.Tensor,
    q: torch.Tensor,
    drafts: torch.Tensor,
    generator: torch.Generator,
    tables=None,
    accepts=_accepts,
) -> torch.Tensor:
    """One verification step for i.i.d. drafts; returns the output token (shape ``drafts.shape[:-1]``).

    ``p``, ``q``: ``(..., V)`` float64 target and draft distributions; ``drafts``: ``(..., n)`` int64, drawn
    i.i.d. from ``q``; ``tables``: a precomputed :func:`build_tables` (built here when ``None``); ``accepts``:
    the accept test ``accepts(u, numerator, denominator)`` (``executor.verification`` passes its shared one).
    """
    if tables is None:
        tables = build_tables(p, q, drafts.shape[-1])
    chosen = selection_probabilities(tables, drafts)
    position = _draw(chosen, generator)
    selected = drafts.gather(-1, position.unsqueeze(-1)).squeeze(-1)
    r = tables["marginal"].gather(-1, selected.unsqueeze(-1)).squeeze(-1)
    target = p.gather(-1, selected.unsqueeze(-1)).squeeze(-1)
    uniform = torch.rand(selected.shape, generator=generator, device=p.device, dtype=torch.float64)
    accept = accepts(uniform, target, r)
    if bool(accept.all()):  # the residual is only formed (and drawn from) when a row rejects
        return selected
    residual = tables.get("residual")
    if residual is None:
        residual = (p.to(torch.float64) - tables["marginal"]).clamp_min(0.0)
        empty = residual.sum(dim=-1, keepdim=True) <= 0  # r = p: a row that never rejects
        residual = torch.where(empty, p.to(torch.float64), residual)
    return torch.where(accept, selected, _draw(residual, generator))
