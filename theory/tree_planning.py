"""Hardware-aware choice of a token tree's size and depth (Sequoia's tree optimizer).

The target verifies a tree of ``n`` nodes in ``target_time(n)`` seconds (flat while the hardware is memory
bound, then roughly linear); the draft builds it one level per forward pass, ``draft_time`` seconds each.
The planner maximises tokens per second over the sizes where ``target_time`` is known and every depth up to
``max_depth`` (Chen et al., "Sequoia", NeurIPS 2024, arXiv 2402.12374, §4.1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np

from theory.checks import as_choice, as_count, as_nonnegative
from theory.trees import Tree, _sequoia_table, as_acceptance

__all__ = [
    "TreePlan",
    "PlanCandidate",
    "plan_tree",
    "drafting_seconds",
    "as_time_table",
    "TREE_COST_CONVENTIONS",
]

#: How many draft passes a tree of ``d`` drafted levels is charged.
#: ``"drafted-levels"`` (default): ``d`` passes, one per drafted level (the root's distribution comes from the
#: previous step's verification). ``"sequoia-repo"``: ``d + 1``, the levels counted with the root, as
#: ``tree_search.py`` of the Sequoia repository does (``x = (levels * draft_time + target_time[n]) / G``).
TREE_COST_CONVENTIONS = ("drafted-levels", "sequoia-repo")

#: Relative difference below which two speedups count as a tie in :func:`plan_tree` (as in
#: :data:`theory.length.TIE_TOLERANCE` for draft lengths).
TIE_TOLERANCE = 1e-12


def as_time_table(target_time, name: str = "target_time", max_size: int | None = None) -> dict[int, float]:
    """Turn a verification-time model into ``{size: seconds}``.

    ``target_time`` is a mapping ``{n: seconds}`` (only those sizes are candidates), a callable ``n ->
    seconds`` (evaluated on ``1 .. max_size``) or a number (the same time for every size). Times must be
    finite and non-negative, and the time for one token must be positive (it is the baseline).
    """
    if isinstance(target_time, Mapping):
        items = list(target_time.items())
    elif callable(target_time):
        if max_size is None:
            raise ValueError(f"{name} is a callable; the sizes to evaluate it on are unknown")
        items = [(n, target_time(n)) for n in range(1, max_size + 1)]
    elif isinstance(target_time, Real) and not isinstance(target_time, bool):
        if max_size is None:
            raise ValueError(f"{name} is a number; the sizes it applies to are unknown")
        items = [(n, target_time) for n in range(1, max_size + 1)]
    else:
        raise ValueError(
            f"{name} must be a mapping size -> seconds, a callable or a number, got {target_time!r}"
        )
    table = {}
    for size, seconds in items:
        if isinstance(size, bool) or not isinstance(size, Integral) or size < 1:
            raise ValueError(f"{name} has a size {size!r}; sizes must be integers >= 1")
        table[int(size)] = as_nonnegative(seconds, f"{name}[{size}]")
    if max_size is not None:
        table = {n: t for n, t in table.items() if n <= max_size}
    if 1 not in table:
        raise ValueError(f"{name} must give the time to verify 1 token (the autoregressive baseline)")
    if table[1] <= 0:
        raise ValueError(f"{name}[1] must be positive (it is the autoregressive baseline), got {table[1]}")
    return dict(sorted(table.items()))


@dataclass(frozen=True)
class PlanCandidate:
    """One (size, depth) pair the planner scored."""

    size: int
    depth: int
    expected_tokens: float
    step_time: float
    speedup: float


@dataclass(frozen=True)
class TreePlan:
    """The chosen tree and how it was chosen.

    ``speedup = (target_time(1) + plain_overhead) * expected_tokens / step_time``, the tokens per second
    against autoregressive decoding, with ``step_time`` the step's passes plus ``step_overhead`` (both
    overheads 0 unless given); ``alternatives`` lists every scored (size, depth) pair, best first (the chosen
    one included).
    """

    tree: Tree
    expected_tokens: float
    speedup: float
    step_time: float
    convention: str
    alternatives: tuple[PlanCandidate, ...]

    @property
    def size(self) -> int:
        return self.tree.size

    @property
    def depth(self) -> int:
        return self.tree.depth

    @property
    def time_per_token(self) -> float:
        return self.step_time / self.expected_tokens


def _level_times(draft_time) -> tuple[float, ...]:
    """``draft_time`` as per-level pass seconds (a number is every level's), checked."""
    if isinstance(draft_time, Real) and not isinstance(draft_time, bool):
        return (as_nonnegative(draft_time, "draft_time"),)
    if isinstance(draft_time, (str, bytes)) or not isinstance(draft_time, Sequence) or not draft_time:
        raise ValueError(
            f"draft_time must be a number or a non-empty sequence of numbers, got {draft_time!r}"
        )
    return tuple(as_nonnegative(t, f"draft_time[{k}]") for k, t in enumerate(draft_time))


def _drafting(level_times: tuple[float, ...], passes: int) -> float:
    """Seconds of a step's first ``passes`` draft passes (the last level's time repeated beyond the table),
    written as ``passes * last + sum(t_k - last)`` so that one time gives exactly ``passes * t``."""
    last = level_times[-1]
    return float(passes * last + sum(t - last for t in level_times[:passes]))


def drafting_seconds(draft_time: float | Sequence[float], passes: int) -> float:
    """Seconds of a step's first ``passes`` draft passes, as :func:`plan_tree` charges them: ``passes *
    draft_time`` for a number, the sum of the first ``passes`` entries of a sequence (its last entry repeated
    beyond it) otherwise."""
    return _drafting(_level_times(draft_time), as_count(passes, "passes", minimum=0))


def plan_tree(
    acc,
    target_time: Mapping[int, float] | Callable[[int], float],
    draft_time: float | Sequence[float],
    *,
    max_budget: int,
    max_depth: int,
    max_width: int | None = None,
    convention: str = "drafted-levels",
    step_overhead: float = 0.0,
    plain_overhead: float = 0.0,
) -> TreePlan:
    """Choose the tree size ``n`` and depth ``d`` that maximise tokens per second (Sequoia §4.1).

    .. math:: \\mathrm{Speedup}(n, d) = \\frac{(t(1) + o_1)\\, G(n, d)}{t(n) + \\sum_{k < d} t_{draft}(k) + o}

    where ``G(n, d)`` is :func:`~theory.trees.optimal_tree`'s value with ``n`` nodes and depth at most ``d``
    (Chen et al., Sequoia, NeurIPS 2024, arXiv 2402.12374, §4.1; the paper divides by ``t(1)`` so that
    ``c = t_draft / t(1)``). Only pairs whose optimal tree has depth exactly ``d`` are scored: a shallower
    tree is scored at its own depth, where it costs less. The overheads are what a step spends beyond its
    forward passes (masks, probabilities, verification, bookkeeping): ``o`` for a drafting step (``d >= 1``),
    :math:`o_1` for a plain decoding step, which is the ``n = 1, d = 0`` candidate (speedup 1). Sequoia's
    formula is ``o = o_1 = 0``; on a CPU a sampled step's few milliseconds are a sizeable part of a pass.

    Ties: every pair whose speedup is within :data:`TIE_TOLERANCE` (relative) of the best counts as best, and
    the smallest size, then the smallest depth, among them is chosen. Exact ties are common (a tree whose
    extra expected tokens exactly pay for its draft time) and round-off makes them differ in the last bits,
    so the choice never depends on the order of floating-point operations. ``alternatives`` starts with the
    chosen plan; the others follow by decreasing speedup.

    Parameters
    ----------
    acc : array_like
        Acceptance vector or per-depth matrix, as for :func:`~theory.trees.optimal_tree`.
    target_time : mapping or callable
        Seconds to verify ``n`` tokens: a table ``{n: seconds}`` (the candidate sizes; it must contain 1) or a
        callable evaluated on ``1 .. max_budget`` (measured by the executor).
    draft_time : float or sequence of float
        Seconds per draft forward pass (one per drafted level), or the seconds of each level's pass in turn,
        the last repeated beyond the sequence (a drafter's first pass of a step also reads the tokens the
        last step committed, and can cost more than the later ones: ``specbound validate`` measures them).
    max_budget, max_depth : int
        Largest tree size (root included) and largest number of drafted levels considered.
    max_width : int, optional
        Most children per node.
    convention : {"drafted-levels", "sequoia-repo"}
        ``"drafted-levels"`` charges ``d`` draft passes; ``"sequoia-repo"`` charges ``d + 1`` (levels with the
        root), the cost in the Sequoia repository's ``tree_search.py``, so that its demo configuration
        (``max_depth`` 10 there counts the root, i.e. ``max_depth=9`` here) gives the repository's tree.
    step_overhead, plain_overhead : float
        Seconds a drafting step and a plain decoding step spend beyond their forward passes (``>= 0``,
        default 0), e.g. as ``specbound bench`` measures them in its calibration decoding.
    """
    matrix = as_acceptance(acc)
    per_depth = np.ndim(acc) == 2
    max_budget = as_count(max_budget, "max_budget")
    max_depth = as_count(max_depth, "max_depth", minimum=0)
    level_times = _level_times(draft_time)
    convention = as_choice(convention, "convention", TREE_COST_CONVENTIONS)
    step_overhead = as_nonnegative(step_overhead, "step_overhead")
    plain_overhead = as_nonnegative(plain_overhead, "plain_overhead")
    times = as_time_table(target_time, "target_time", max_size=max_budget)
    if per_depth and max_depth > matrix.shape[0]:
        raise ValueError(f"max_depth={max_depth} exceeds the {matrix.shape[0]} rows of the acceptance matrix")
    largest = max(times)
    extra_passes = 1 if convention == "sequoia-repo" else 0
    baseline = times[1] + plain_overhead

    # values[d][n] = G(n, d); trees are rebuilt from the table that produced the value.
    if per_depth:  # each depth limit shifts the rows every subtree sees: one programme per limit
        lookup = [(_sequoia_table(acc, largest, d, max_width)[0], d) for d in range(max_depth + 1)]
    else:  # one programme gives every depth limit at once: state d is "at most d more levels"
        deepest = min(max_depth, largest - 1)  # deeper limits cannot bind on `largest` nodes
        table, _ = _sequoia_table(acc, largest, deepest, max_width, every_depth=True)
        lookup = [(table, min(d, deepest)) for d in range(max_depth + 1)]

    candidates = []
    for n, verify_time in times.items():
        previous = -np.inf
        for d in range(min(max_depth, n - 1) + 1):
            table, state = lookup[d]
            value = float(table.best[n, state])
            if not value > previous:  # infeasible, or the optimal tree is shallower than d
                continue
            previous = value
            overhead = step_overhead if d > 0 else plain_overhead
            step_time = verify_time + _drafting(level_times, d + extra_passes) + overhead
            speedup = np.inf if step_time == 0 else baseline * value / step_time
            candidates.append(PlanCandidate(n, d, value, step_time, speedup))
    best = max(candidate.speedup for candidate in candidates)
    ties = [c for c in candidates if c.speedup >= best * (1.0 - TIE_TOLERANCE)]
    chosen = min(ties, key=lambda c: (c.size, c.depth))
    ranked = [
        chosen,
        *sorted((c for c in candidates if c is not chosen), key=lambda c: (-c.speedup, c.size, c.depth)),
    ]
    table, state = lookup[chosen.depth]
    return TreePlan(
        tree=table.tree(chosen.size, state),
        expected_tokens=chosen.expected_tokens,
        speedup=chosen.speedup,
        step_time=chosen.step_time,
        convention=convention,
        alternatives=tuple(ranked),
    )
