"""What a speculative decoder saw and did, step by step, in a form :mod:`theory` can consume.

A decoding *step* is one target forward pass: the drafter proposes a token tree (a chain is a path, plain
decoding is the root alone), the target scores every node at once, the verifier walks down from the root and
commits the accepted path plus one token drawn from the target (the correction, or the bonus token when the
walk ends at a leaf). :class:`StepLog` records one step; :class:`GenerationResult` one generation with the
ecosystem's summary metrics:

* tokens per step :math:`\\tau` = emitted tokens / target forward passes (the bonus token included, so plain
  decoding has :math:`\\tau = 1`; Spec-Bench's "#mean accepted tokens", Xia et al., ACL Findings 2024,
  arXiv 2401.07851, and vLLM's "mean acceptance length");
* per-position acceptance rate: the fraction of drafting steps whose accepted path reached depth ``i + 1``
  (vLLM's ``num_accepted_tokens_per_pos / num_drafts``);
* tokens per second: generated tokens / wall time (prefill included).

The target and draft distributions at each *expanded* node (a node whose children were drafted, i.e. each
drafted position) can be kept in three modes: ``"none"``; ``"topk:K"`` (for each position, the union of the
``K`` most likely tokens of ``p`` and of ``q`` with both probabilities there, plus each side's
remaining mass);
``"full"`` (float32 vectors kept in memory, never written to JSON).
:func:`step_distributions` turns either into
numpy ``(p, q)`` arrays that :func:`theory.acceptance_rate` and friends accept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = [
    "DistributionLog",
    "GenerationResult",
    "StepLog",
    "parse_log_mode",
    "record_distributions",
    "step_distributions",
]


def parse_log_mode(mode: str) -> tuple[str, int]:
    """Parse ``"none" | "full" | "topk:K"`` into ``(kind, K)`` (``K = 0`` unless top-k), else ``ValueError``."""
    if mode in ("none", "full"):
        return mode, 0
    if isinstance(mode, str) and mode.startswith("topk:"):
        count = mode[len("topk:") :]
        if count.isdigit() and int(count) >= 1:
            return "topk", int(count)
    raise ValueError(
        f"log_distributions must be 'none', 'full' or 'topk:K' with an integer K >= 1; got {mode!r}"
    )


@dataclass
class DistributionLog:
    """Target ``p`` and draft ``q`` at one step's drafted positions (row ``i`` = ``expanded[i]``).

    ``kind == "full"``: ``p`` and ``q`` are float32 tensors of shape ``(m, V)``; ``ids`` is ``None``.
    ``kind == "topk"``: ``ids`` is an int64 tensor ``(m, k)`` of token ids (the union of both top-K sets,
    padded with ``-1``), ``p`` and ``q`` hold the probabilities at those ids (0 at padding), and ``p_rest``,
    ``q_rest`` the mass outside them.
    """

    kind: str
    p: torch.Tensor
    q: torch.Tensor
    ids: torch.Tensor | None = None
    p_rest: torch.Tensor | None = None
    q_rest: torch.Tensor | None = None


def record_distributions(p: torch.Tensor, q: torch.Tensor, mode: str) -> DistributionLog | None:
    """Keep ``p`` and ``q`` (both ``(m, V)``) as ``mode`` asks; ``None`` for ``"none"``."""
    kind, k = parse_log_mode(mode)
    if kind == "none":
        return None
    p = p.detach().to("cpu", torch.float32)
    q = q.detach().to("cpu", torch.float32)
    if kind == "full":
        return DistributionLog("full", p.clone(), q.clone())
    k = min(k, p.shape[-1])
    union = torch.cat([torch.topk(p, k, dim=-1).indices, torch.topk(q, k, dim=-1).indices], dim=-1)
    rows = []
    for row in union:
        unique = torch.unique(row)
        rows.append(torch.cat([unique, unique.new_full((2 * k - unique.numel(),), -1)]))
    ids = torch.stack(rows) if rows else union
    safe = ids.clamp_min(0)
    valid = ids >= 0
    p_kept = torch.where(valid, p.gather(-1, safe), 0.0)
    q_kept = torch.where(valid, q.gather(-1, safe), 0.0)
    return DistributionLog(
        "topk",
        p_kept,
        q_kept,
        ids,
        (1.0 - p_kept.sum(-1)).clamp_min(0.0),
        (1.0 - q_kept.sum(-1)).clamp_min(0.0),
    )


def step_distributions(step: StepLog) -> tuple[np.ndarray, np.ndarray]:
    """The logged ``(p, q)`` of one step as float64 numpy arrays of shape ``(m, V')``, rows summing to 1.

    Row ``i`` belongs to the drafted position ``step.expanded[i]`` (``p`` = target, ``q`` = the draft
    distribution the children of that node were drawn from). In ``"full"`` mode ``V'`` is the vocabulary.
    In ``"topk:K"`` mode the columns are the logged token ids followed by one *rest* bucket holding the
    remaining mass of each side: :math:`\\sum_x \\min(p, q)` over these columns is then exact on the logged
    tokens and over-counts the rest by at most :math:`\\min(p_{rest}, q_{rest})`, an upper bound on the true
    acceptance. Rows are renormalised in float64 only to remove float32 rounding (< 1e-4).

    Deterministic drafters (prompt lookup) log one-hot ``q``: their drafts are not samples, and lossless
    verification treats ``q`` as one-hot.
    """
    log = step.distributions
    if log is None:
        raise ValueError(
            "step has no logged distributions; generate with log_distributions='full' or 'topk:K'"
        )
    if log.kind == "full":
        p, q = log.p.double().numpy(), log.q.double().numpy()
    else:
        p = torch.cat([log.p.double(), log.p_rest.double()[:, None]], dim=-1).numpy()
        q = torch.cat([log.q.double(), log.q_rest.double()[:, None]], dim=-1).numpy()
    return p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)


@dataclass
class StepLog:
    """One decoding step (one target forward pass).

    Attributes
    ----------
    tokens, parents : list[int]
        The draft tree that was verified: node 0 is the root (the last committed token, not yet in the
        target's cache), ``parents[0] == -1``. A chain of ``gamma`` drafts is
        ``parents = [-1, 0, ..., gamma-1]``.
    accepted_path : list[int]
        Node indices from the root down to the deepest accepted node.
    emitted : list[int]
        Tokens committed by this step: the accepted drafts, then the target's correction or bonus token.
    expanded : list[int]
        The nodes whose children were drafted (the drafted positions), in the order of the logged rows.
    accepted : list[bool]
        ``accepted[d]`` is whether the accepted path reached depth ``d + 1``, for every drafted depth.
    distributions : DistributionLog or None
        Target and draft distributions at the ``expanded`` nodes (see :func:`step_distributions`).
    deterministic_drafts : bool
        The drafter's ``q`` is one-hot (prompt lookup): drafts are not samples.
    """

    tokens: list[int]
    parents: list[int]
    accepted_path: list[int]
    emitted: list[int]
    expanded: list[int]
    accepted: list[bool]
    distributions: DistributionLog | None = None
    deterministic_drafts: bool = False

    @property
    def n_accepted(self) -> int:
        """Number of accepted drafted tokens (the emitted bonus/correction token excluded)."""
        return len(self.accepted_path) - 1

    @property
    def n_drafted(self) -> int:
        """Number of drafted tokens verified (tree nodes other than the root)."""
        return len(self.tokens) - 1

    def to_json(self) -> dict:
        """A JSON-ready dict (distributions left out: they stay in memory)."""
        return {
            "tokens": self.tokens,
            "parents": self.parents,
            "accepted_path": self.accepted_path,
            "n_accepted": self.n_accepted,
            "emitted": self.emitted,
            "accepted": self.accepted,
            "deterministic_drafts": self.deterministic_drafts,
        }


@dataclass
class GenerationResult:
    """One generation: the tokens, the per-step logs, and the summary metrics.

    ``tau`` is emitted tokens / target forward passes (decoding steps; the prefill is not a step) and counts
    the bonus token, so plain decoding has ``tau == 1``. ``acceptance_per_position[i]`` is the fraction of
    steps that drafted at least one token whose accepted path reached depth ``i + 1``.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    steps: list[StepLog]
    wall_time: float
    prefill_time: float
    text: str = ""
    decoder: str = ""
    settings: dict = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tau(self) -> float:
        """Mean tokens per target forward pass, :math:`\\tau`, bonus token included."""
        return sum(len(s.emitted) for s in self.steps) / max(len(self.steps), 1)

    @property
    def acceptance_per_position(self) -> list[float]:
        """vLLM's per-position acceptance rate: accepted at depth ``i + 1`` / steps that drafted."""
        drafting = [s for s in self.steps if s.n_drafted > 0]
        depth = max((len(s.accepted) for s in drafting), default=0)
        counts = np.zeros(depth)
        for s in drafting:
            counts[: len(s.accepted)] += s.accepted
        return (counts / max(len(drafting), 1)).tolist()

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafted tokens / drafted tokens (vLLM's "draft acceptance rate"), 0 if none."""
        drafted = sum(s.n_drafted for s in self.steps)
        return sum(s.n_accepted for s in self.steps) / drafted if drafted else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.n_tokens / self.wall_time if self.wall_time > 0 else float("inf")

    def summary(self) -> dict:
        """The metrics and the output, without the per-step logs."""
        return {
            "decoder": self.decoder,
            "settings": self.settings,
            "token_ids": self.token_ids,
            "text": self.text,
            "n_tokens": self.n_tokens,
            "steps": len(self.steps),
            "tau": self.tau,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_per_position": self.acceptance_per_position,
            "tokens_per_second": self.tokens_per_second,
            "wall_time": self.wall_time,
            "prefill_time": self.prefill_time,
        }

    def to_json(self) -> dict:
        """The summary plus every step's log (without the distribution tensors)."""
        return {
            **self.summary(),
            "prompt_ids": self.prompt_ids,
            "step_logs": [s.to_json() for s in self.steps],
        }
