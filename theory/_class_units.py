r"""Units of one priority class of the optimal verifier: which items share a race weight, and their targets.

A class of :func:`theory.optimal_verifier` holds hundreds to tens of thousands of items (single tokens or ratio
buckets, :mod:`theory._buckets`). The race fit (:func:`theory._race.fit_log_weights`) works on *units*, groups
of items sharing one weight; its Newton system is dense, :math:`O(U^2)` memory and :math:`O(U^3)` time in the
number ``U`` of units. Grouping items never touches exactness (the verifier uses the exact marginal of the final
weights; a unit's tokens share its selection in proportion to ``q``), only the reachable acceptance: a unit's
tokens all get the ratio :math:`r/q` of the unit, so a unit spanning several target ratios loses
:math:`\sum_y (r_y - p_y)_+` above the minimiser (mirror image below), reported as the build's shortfall.

This module makes the units (:func:`_units`), their water-filled targets (:func:`_unit_targets`, with the level
of :func:`_fill_level`) and bounds their number (:func:`_cap_units`, at most :data:`MAX_UNITS` per class):
merging units adjacent in the order of their target ratio and summing their targets keeps the targets in the
race polytope (every constraint of the coarser partition is one of the finer; reference note
``optimal_verifier.md``, section 5), so only acceptance can drop, never feasibility or exactness.
"""

from __future__ import annotations

import numpy as np

from theory._buckets import head_sums, tail_sums

#: Prefixes whose gap is within this of the minimum count as tight (they become class cuts).
TIGHT = 1e-13
#: Classes with at most this many tokens give every token its own unit.
MAX_OWN_UNITS = 96
#: In larger classes, tokens with ``max(p, q)`` at least this get their own unit (at most ``MAX_OWN_UNITS``).
OWN_UNIT_MASS = 1e-4
#: Units per class at most (:func:`_cap_units`): bounds the race fit's dense Newton system to
#: ``MAX_UNITS**2`` entries (2 MB per matrix, ~0.2 s per build at most). Real SmolLM2 pairs fit at most 96
#: units; very peaked synthetic pairs asked for 4000--49000 (34 s and 2--23 GB per build before the cap), and
#: 256 would cost one synthetic pair 1.4e-4 of acceptance where 512 reaches alpha* (its fit needs 474).
MAX_UNITS = 512


def _fill_level(ratio: np.ndarray, weight: np.ndarray, mass: float, above: bool) -> float:
    r"""Level ``c`` with :math:`\sum_i \min(\rho_i, c)\, w_i` (``above``) or :math:`\sum_i \max(\rho_i, c)\, w_i`
    equal to ``mass``, for ``ratio`` sorted increasingly, solved exactly on the piecewise-linear fill.

    ``above``: with the first ``j`` items below ``c`` the sum is :math:`\sum_{i<j} \rho_i w_i + c \sum_{i \ge j}
    w_i`; ``j`` is found by comparing ``mass`` with the sums at the breakpoints :math:`c = \rho_j`. Returns
    ``inf`` when even :math:`\sum \rho_i w_i` falls short. Otherwise the mirror image (``-inf`` if too much).
    """
    size = ratio.shape[0]
    product = ratio * weight
    head_p, head_q = head_sums(product), head_sums(weight)
    tail_p, tail_q = tail_sums(product), tail_sums(weight)
    if above:
        at_breaks = head_p[1:] + ratio * tail_q[1:]
        below = int(np.searchsorted(at_breaks, mass, side="left"))
        return (mass - head_p[below]) / tail_q[below] if below < size else np.inf
    at_breaks = ratio * head_q[:-1] + tail_p[:-1]
    raised = int(np.searchsorted(at_breaks, mass, side="right"))
    return (mass - tail_p[raised]) / head_q[raised] if raised > 0 else -np.inf


def _units(ps: np.ndarray, qs: np.ndarray, slack: np.ndarray, bins: int) -> np.ndarray:
    r"""Unit label of each token of a large class.

    Tokens with ``max(p, q) >= OWN_UNIT_MASS`` (the heaviest :data:`MAX_OWN_UNITS`) are alone; the others
    share ``bins`` equal bins of ``log(p/q)`` over the class, each split by quarter octaves of the token's
    *slack* :math:`s = \mathrm{gap}_k - \min \mathrm{gap}` (the smaller of its two prefixes). A target that
    moves the prefix excess :math:`E(k) = r^*(T_k) - p(T_k)` by ``d`` stays in the race polytope while
    :math:`E(k) \ge -s_k`; a unit whose slack varies by a factor :math:`2^{1/4}` moves it by less than about a
    fifth of the local slack, so units near a nearly tight prefix get finer (reference note, section 5:
    "never let a unit straddle a nearly tight prefix").
    """
    size = ps.shape[0]
    labels = np.full(size, -1, dtype=np.int64)
    heavy = np.flatnonzero(np.maximum(ps, qs) >= OWN_UNIT_MASS)
    if heavy.size > MAX_OWN_UNITS:
        heavy = heavy[np.argsort(-np.maximum(ps[heavy], qs[heavy]))[:MAX_OWN_UNITS]]
    labels[heavy] = np.arange(heavy.size)
    light = np.flatnonzero(labels < 0)
    if light.size:
        with np.errstate(divide="ignore"):
            log_ratio = np.log(ps[light] / qs[light])
        finite = np.isfinite(log_ratio)
        values = log_ratio if finite.all() else log_ratio[finite]
        low, high = (values.min(), values.max()) if values.size else (0.0, 0.0)
        edges = np.linspace(low, high, bins + 1)[1:-1]
        ratio_bin = np.where(finite, np.searchsorted(edges, log_ratio) + 1, 0)
        octave = np.floor(4.0 * np.log2(np.maximum(slack[light], TIGHT) / TIGHT)).astype(np.int64)
        labels[light] = heavy.size + ratio_bin * 512 + np.minimum(octave, 511)
    return _compact(labels)


def _compact(labels: np.ndarray) -> np.ndarray:
    """Labels renumbered ``0, 1, ...`` in increasing order: ``np.unique(labels, return_inverse=True)[1]``
    as one sort, a comparison and a search (about 60% of ``np.unique``'s cost at these sizes)."""
    ordered = np.sort(labels)
    first = np.empty(ordered.shape[0], dtype=bool)
    first[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return np.searchsorted(ordered[first], labels)


def _unit_targets(labels, qs, ratio, capped, mass: float, above: bool):
    r"""Unit masses and water-filled unit targets :math:`\rho_u Q_u`, :math:`\rho_u = \min(m_u, c')` (``above``,
    :math:`m_u` the unit's smallest ratio bound; mirror image below), units at the level merged; the item-level
    fill summed per unit when no level reaches ``mass``. Returns the (relabelled) labels too."""
    unit_q = np.bincount(labels, weights=qs)
    extreme = np.full(unit_q.shape[0], np.inf if above else -np.inf)
    (np.minimum if above else np.maximum).at(extreme, labels, ratio)
    order = np.argsort(extreme)
    level = _fill_level(extreme[order], unit_q[order], mass, above)
    if np.isfinite(level):
        unit_bound = np.minimum(extreme, level) if above else np.maximum(extreme, level)
        at_level = extreme >= level if above else extreme <= level
        relabel = _compact(np.where(at_level, -1, np.arange(unit_q.shape[0])))
        unit_target = np.bincount(relabel, weights=unit_bound * unit_q)
        labels = relabel[labels]
        return labels, np.bincount(labels, weights=qs), unit_target
    order = np.argsort(ratio, kind="stable")
    level = _fill_level(ratio[order], qs[order], mass, above)
    target = np.minimum(capped, level * qs) if above else np.maximum(capped, level * qs)
    return labels, unit_q, np.bincount(labels, weights=target)


def _cap_units(labels: np.ndarray, qs: np.ndarray, unit_q: np.ndarray, unit_target: np.ndarray, cap: int):
    r"""At most ``cap`` units: units adjacent in the order of their target ratio :math:`\rho = t/Q` merged, their
    masses and targets summed. Returns ``labels``, ``unit_q``, ``unit_target`` (unchanged when within the cap).

    Feasibility is kept: every race-polytope constraint of the merged partition is one of the finer partition.
    Merging blocks ``A``, ``B`` gives their tokens the common ratio :math:`(T_A + T_B)/(Q_A + Q_B)` and costs
    :math:`\frac{Q_A Q_B}{Q_A + Q_B} |\rho_A - \rho_B|` of acceptance (the tokens pushed above ``p`` above the
    minimiser, below it under the minimiser). Greedy in rounds: each round merges the neighbouring blocks
    whose cost is a local minimum along the chain (non-overlapping pairs), cheapest first, until ``cap``
    blocks remain; equal ratios (the water-filled level) merge for free.
    """
    units = unit_q.shape[0]
    if units <= cap:
        return labels, unit_q, unit_target
    order = np.argsort(unit_target / unit_q, kind="stable")
    block_q, block_t = unit_q[order], unit_target[order]
    member = np.arange(units)  # block of each unit, in chain order
    while block_q.shape[0] > cap:
        ratio = block_t / block_q
        joint = block_q[:-1] + block_q[1:]
        with np.errstate(invalid="ignore", over="ignore"):
            cost = block_q[:-1] * block_q[1:] / joint * np.abs(np.diff(ratio))
        cost[np.isnan(cost)] = np.inf
        # Local minima (ties broken to the left) are pairwise disjoint.
        left = np.r_[np.inf, cost[:-1]]
        right = np.r_[cost[1:], np.inf]
        candidates = np.flatnonzero((cost < left) & (cost <= right) | (cost <= left) & (cost < right))
        candidates = (
            candidates[np.r_[True, np.diff(candidates) > 1]] if candidates.size else np.argmin(cost)[None]
        )
        take = candidates[np.argsort(cost[candidates], kind="stable")[: block_q.shape[0] - cap]]
        start = np.ones(block_q.shape[0], dtype=np.int64)
        start[0] = 0
        start[take + 1] = 0
        new = np.cumsum(start)
        block_q = np.bincount(new, weights=block_q)
        block_t = np.bincount(new, weights=block_t)
        member = new[member]
    merged = np.empty(units, dtype=np.int64)
    merged[order] = member
    labels = merged[labels]
    return labels, np.bincount(labels, weights=qs, minlength=cap), np.bincount(merged, weights=unit_target)
