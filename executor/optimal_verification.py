"""The run-time optimal multi-draft verifier in torch: the executor's twin of :func:`theory.optimal_verifier`.

The build (priority classes, race weights and the exact selection marginal ``r``) runs in numpy, one row at a
time (:func:`theory.optimal_verifier.optimal_tables`); the step itself runs in torch on the tensors' device with
the caller's :class:`torch.Generator`:

1. among the drafts in the highest priority class present, select draft ``i`` with probability
   :math:`w(x_i) / \\sum_j w(x_j)` (the law of the first exponential clock to ring);
2. accept the selected ``y`` with probability :math:`\\min(1, p(y)/r(y))` (written ``u r(y) < p(y)``);
3. otherwise output a draw from :math:`(p - r)_+ / \\|(p - r)_+\\|_1`.

Lossless because ``r`` is the exact marginal of step 1 (Khisti et al., arXiv 2410.18234), and its acceptance is
:math:`\\sum \\min(p, r) = \\alpha^*` up to the build's reported shortfall (``docs/verifiers.md``).

Devices. On the CPU the build works on the tensors' own memory (float64 tensors and arrays share it) and hands
back arrays without copies: numpy measured faster than torch there (bincounts with weights, the few-hundred-item
fit; ``docs/benchmarks/optimal_verifier.md``). On another device the vocabulary-sized inputs cross to the host
once (``p`` and ``q`` of the rows to build, one copy each) and ``r`` and the token-to-item map come back once;
the class and race weight of each *item* (a ratio bucket or a single token, a few hundred) are all the step
needs besides them, so the per-token class and weight tables never cross. Every tensor of the tables is created
on ``p``'s device. A single CPU row (every decoding step) is verified in numpy on the tables' memory
(:func:`_verify_one_row_on_host`): the same steps and the same uniforms in the same order as the torch path,
so the same token (tested seed by seed against it), at ~0.2 ms instead of ~0.6.
"""

from __future__ import annotations

import numpy as np
import torch

from executor.sampling import _draw
from theory._buckets import scratch
from theory.optimal_verifier import optimal_tables

__all__ = ["build_tables", "verify_optimal"]


def build_tables(p: torch.Tensor, q: torch.Tensor, n: int) -> dict[str, torch.Tensor]:
    """The per-row tables of the numpy build, as float64/int64 tensors on ``p``'s device.

    Keys: ``marginal`` (``r``, shape ``p.shape``), ``item`` (the item of every token, ``p.shape``),
    ``item_class`` and ``item_log_weight`` (``(..., I)``: priority class and race log-weight of every item, rows
    padded with class -1 and weight 0 to the largest item count). The residual :math:`(p - r)_+` is left to
    :func:`verify_optimal`, which forms it only on a rejection.
    """
    vocab = p.shape[-1]
    flat_p, flat_q = p.reshape(-1, vocab), q.reshape(-1, vocab)
    # A batch of one repeated pair (Monte Carlo over many steps of one position) is built once.
    repeated = flat_p.shape[0] > 1 and bool((flat_p == flat_p[:1]).all() and (flat_q == flat_q[:1]).all())
    rows = 1 if repeated else flat_p.shape[0]
    host_p = flat_p[:rows].detach().to("cpu", torch.float64).numpy()
    host_q = flat_q[:rows].detach().to("cpu", torch.float64).numpy()
    # The unit fit only: one weight per token (item_fit) reaches alpha* on close full-vocabulary drafts but
    # costs 1-2 s a build at V = 49,152 (docs/benchmarks/optimal_verifier.md); its shortfall is reported.
    built = [optimal_tables(host_p[i], host_q[i], n, item_fit=False) for i in range(rows)]
    items = [_item_form(b, vocab) for b in built]
    width = max(item_class.shape[0] for _, item_class, _ in items)
    item_class = np.full((rows, width), -1, dtype=np.int64)
    item_log_weight = np.full((rows, width), -np.inf)
    for row, (_, classes, logs) in enumerate(items):
        item_class[row, : classes.shape[0]], item_log_weight[row, : logs.shape[0]] = classes, logs
    per_token = {
        "marginal": built[0].marginal if rows == 1 else np.stack([b.marginal for b in built]),
        "item": items[0][0] if rows == 1 else np.stack([item for item, _, _ in items]),
    }
    tables = {}
    on_host = p.device.type == "cpu"  # ~10 us per torch call: no-op moves and views skipped (one row, CPU)
    for key, value in per_token.items():
        tensor = torch.from_numpy(value) if on_host else torch.from_numpy(value).to(p.device)
        tables[key] = tensor if tensor.shape == p.shape else tensor.expand(flat_p.shape).reshape(p.shape)
    for key, value in (("item_class", item_class), ("item_log_weight", item_log_weight)):
        tensor = torch.from_numpy(value) if on_host else torch.from_numpy(value).to(p.device)
        tables[key] = tensor.expand(flat_p.shape[0], width).reshape(*p.shape[:-1], width)
    return tables


def _item_form(built, vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item of every token, class of every item, log-weight of every item) of one row's build."""
    if built.item is None:  # n = 1 and other builds with per-token tables: every token its own item
        return np.arange(vocab), built.item_class, built.item_log_weight
    return built.item, built.item_class, built.item_log_weight


def selection_probabilities(tables: dict[str, torch.Tensor], drafts: torch.Tensor) -> torch.Tensor:
    """``(..., n)`` probability that each draft position wins the race (0 outside the top class present)."""
    index = tables["item"].gather(-1, drafts)
    classes = tables["item_class"].gather(-1, index)
    logs = tables["item_log_weight"].gather(-1, index)
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
        if p.device.type == "cpu" and p.numel() == p.shape[-1]:
            return _verify_one_row_on_host(p, drafts, generator, tables, accepts)
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


def _verify_one_row_on_host(p, drafts, generator, tables, accepts) -> torch.Tensor:
    """:func:`verify_optimal` for one row on the CPU, in numpy on the tables' memory.

    The same steps on the same numbers with the generator's uniforms drawn in the same order (selection, coin,
    residual), so the output is the torch path's: a decoding step verifies one row, and the torch path's ~20
    calls on tensors of ``n`` entries cost ~0.5 ms, as much as the rest of an RRS step's verification. The
    residual and its cumulative sum are formed in the build's two vocabulary-sized buffers kept per thread
    (:func:`theory._buckets.scratch`: a fresh 400 kB array costs ~100 page faults on first touch, more than the
    arithmetic).
    """
    item, item_class, item_log_weight, marginal = (
        tables[key].numpy().reshape(-1) for key in ("item", "item_class", "item_log_weight", "marginal")
    )
    tokens = drafts.numpy().reshape(-1)
    index = item[tokens]
    classes = item_class[index]
    logs = np.where(classes == classes.max(), item_log_weight[index], -np.inf)
    chosen = np.exp(logs - logs.max())
    chosen /= chosen.sum()  # torch.softmax's two steps
    selected = int(tokens[_host_draw(np.cumsum(chosen), generator)])
    target_row = p.reshape(-1)
    target, r = float(target_row[selected]), float(marginal[selected])
    if accepts(float(torch.rand((), dtype=torch.float64, generator=generator)), target, r):
        return torch.tensor(selected, dtype=torch.int64).reshape(drafts.shape[:-1])
    given = tables.get("residual")
    target_row = target_row.numpy()
    residual, cdf = scratch(marginal.shape[0])  # the build's per-thread temporaries; no table is one of them
    if given is not None:
        np.cumsum(given.numpy().reshape(-1), out=cdf)
    else:
        np.subtract(target_row, marginal, out=residual)  # float32 targets widen exactly to float64
        np.maximum(residual, 0.0, out=residual)
        np.cumsum(residual, out=cdf)
        if cdf[-1] <= 0:  # r = p: a row that never rejects (the torch path's empty residual)
            np.cumsum(target_row, dtype=np.float64, out=cdf)
    return torch.tensor(_host_draw(cdf, generator), dtype=torch.int64).reshape(drafts.shape[:-1])


def _host_draw(cdf: np.ndarray, generator: torch.Generator) -> int:
    """:func:`executor.sampling._draw` of one row given its cumulative sum (the same uniform and search)."""
    total = cdf[-1]
    uniform = float(torch.rand((), dtype=torch.float64, generator=generator))
    return int(np.searchsorted(cdf, min(uniform * total, np.nextafter(total, 0.0)), side="right"))
