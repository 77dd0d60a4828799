r"""Ratio buckets: shrink an LM-sized pair to the few hundred *items* that the optimal verifier's build needs.

The build of :func:`theory.optimal_verifier` works on the ratio order :math:`\rho = p/q`, but at LM vocabulary
sizes almost every token is light and far, in ratio, from every nearly tight prefix. Such tokens can share one
race weight without changing exactness (the race only sees their group, and given the group the token is a
draw from :math:`q` restricted to it, so each token gets :math:`r_y = q_y\, r_g / q_g`), and a full sort of the
vocabulary is not needed to place them. This module:

1. buckets the support by the top bits of :math:`\rho`'s float64 representation (monotone in :math:`\rho \ge 0`;
   ``bits`` mantissa bits, so every token of bucket ``b`` has :math:`e_b \le \rho < e_{b+1}` with
   :math:`e_{b+1} / e_b \le 1 + 2^{-\mathrm{bits}}`), with bucket masses from ``bincount``;
2. bounds the gap :math:`p(H) - q(H)^n` of every ratio prefix ending inside bucket ``b`` from below by
   :math:`LB_b = \min(P_{<b} - Q_{<b}^n,\ P_{<b} + e_b q_b - Q_{\le b}^n)` (such a prefix holds all earlier
   buckets and tokens of ``b`` of draft mass ``x`` and target mass at least :math:`e_b x`; the bound is concave
   in ``x``); coarse buckets (:data:`COARSE_BITS`) that fail the test below are split into fine ones
   (:data:`FINE_BITS`) and the test is rerun;
3. keeps as single tokens the heavy ones (``max(p, q) >=`` ``group_below``) and every token of a bucket that
   could hold a nearly tight prefix or where grouping could cost acceptance: a bucket is grouped only when
   :math:`LB_b - G_{min} > \mathrm{TIGHT} + \sum \delta_c p_c` over the grouped buckets ``c`` between it and
   the minimiser, with :math:`G_{min}` the smallest gap at a bucket boundary and :math:`\delta_c = 2^{-bits}`
   the largest relative loss of replacing a token's ratio by its bucket's edge; the light tokens of the other
   buckets form one item per bucket, carrying the bucket's edges as ratio bounds.

The items come back in ratio order (a group before the heavy singletons of its bucket: no prefix inside a
grouped bucket is nearly tight, whatever the order there). Only the items are sorted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Mantissa bits of ``p/q`` in the coarse and the fine bucket keys (``2**bits`` buckets per octave).
COARSE_BITS, FINE_BITS = 3, 8
_SPLIT = 1 << (FINE_BITS - COARSE_BITS)  # fine buckets per coarse bucket
_SHIFT = 52 - FINE_BITS
#: Absolute margin on the grouping test, far above the round-off of the bucket-level gaps.
MARGIN = 1e-14


@dataclass(frozen=True)
class Items:
    """Items in ratio order and the map back to the tokens of the support.

    ``p``, ``q``: item masses; ``low``, ``high``: bounds on the ratio of every token of the item (the ratio
    itself for a single token); ``single``: the item is one token; ``count``: tokens per item; ``item``: the
    item of each support token; ``p_tokens``, ``q_tokens``: the support's masses.
    """

    p: np.ndarray
    q: np.ndarray
    low: np.ndarray
    high: np.ndarray
    single: np.ndarray
    count: np.ndarray
    item: np.ndarray
    p_tokens: np.ndarray
    q_tokens: np.ndarray


def _edge(keys: np.ndarray) -> np.ndarray:
    """The ratio at the start of fine key ``keys`` (the float64 whose top bits they are)."""
    return (keys.astype(np.int64) << _SHIFT).view(np.float64)


def singletons(ps: np.ndarray, qs: np.ndarray) -> Items:
    """Every token its own item, sorted by ratio (the exact path)."""
    ratio = ps / qs
    order = np.argsort(ratio, kind="stable")
    item = np.empty(order.shape[0], dtype=np.int64)
    item[order] = np.arange(order.shape[0])
    ones = np.ones(order.shape[0], dtype=bool)
    return Items(ps[order], qs[order], ratio[order], ratio[order], ones, ones.astype(np.int64), item, ps, qs)


def _groupable(bucket_p, bucket_q, edge, width, n: int, tight: float) -> np.ndarray:
    """Which buckets (in ratio order, masses ``bucket_p``, ``bucket_q``, lower ratio edges ``edge``, relative
    widths ``width``) may be grouped: no nearly tight prefix inside, and their grouping loss covered by the
    slack (module docstring)."""
    buckets = bucket_p.shape[0]
    head_p = np.concatenate([[0.0], np.cumsum(bucket_p)])
    head_q = np.minimum(np.concatenate([[0.0], np.cumsum(bucket_q)]), 1.0)
    power = head_q.copy()
    for _ in range(n - 1):
        power *= head_q
    boundary = head_p - power  # gap after the buckets < b, b = 0..buckets
    lowest = min(float(boundary.min()), 0.0)
    cut = int(np.argmin(boundary))
    # A prefix ending inside bucket b holds the buckets < b and tokens of b of q-mass x <= q_b and p-mass
    # >= e_b x, so its gap is >= P_{<b} + e_b x - (Q_{<b} + x)^n, concave in x: LB_b is the smaller of the
    # two ends. Slack: LB_b over the smallest gap at a boundary. Grouping bucket b costs at most
    # width_b p_b of it on every prefix through b (its tokens get the bucket's edge as ratio): first the
    # buckets whose own loss fits, then those whose slack also covers the loss of all such buckets between
    # them and the minimising boundary (a superset of the groups kept, so the bound holds for them).
    with np.errstate(invalid="ignore", over="ignore"):  # edge = inf on p > 0 = q buckets (none here)
        inner = np.where(bucket_q > 0, head_p[:-1] + edge * bucket_q - power[1:], head_p[1:] - power[1:])
    slack = np.minimum(boundary[:-1], inner) - lowest - tight - MARGIN
    loss = width * bucket_p * (slack > width * bucket_p)
    total = np.concatenate([[0.0], np.cumsum(loss)])
    between = np.where(np.arange(buckets) < cut, total[cut] - total[:-1], total[1:] - total[cut])
    return slack > between


def bucketed(ps: np.ndarray, qs: np.ndarray, n: int, group_below: float, tight: float) -> Items:
    """Items for a support with masses ``ps``, ``qs`` (``qs > 0``): see the module docstring.

    Two levels: coarse buckets (:data:`COARSE_BITS`), then the coarse buckets that cannot be grouped are
    split into their fine buckets (:data:`FINE_BITS`, relative width ``2**-FINE_BITS``) and the test is rerun
    on the mixed sequence, so that only tokens very close (in ratio) to a nearly tight prefix stay single.
    Only the passes over the vocabulary that cannot be avoided run on every token (the keys, one gather per
    level, five bincounts, the item map); the split buckets, the heavy tokens and the singles are handled on
    their own (small) index sets.
    """
    fine = np.divide(ps, qs).view(np.int64)
    np.right_shift(fine, _SHIFT, out=fine)  # the ratio's top bits: monotone in the ratio
    coarse = fine >> (FINE_BITS - COARSE_BITS)
    base = int(coarse.min())
    coarse -= base
    count = np.bincount(coarse)
    # Dense index of the non-empty coarse buckets (ratio ranges can span thousands of empty ones).
    nonempty = np.flatnonzero(count)
    dense = np.zeros(count.shape[0], dtype=np.int64)
    dense[nonempty] = np.arange(nonempty.shape[0])
    index = dense[coarse]
    occupied = nonempty.shape[0]
    coarse_p = np.bincount(index, weights=ps, minlength=occupied)
    coarse_q = np.bincount(index, weights=qs, minlength=occupied)
    coarse_count = count[nonempty]
    coarse_edge = _edge((nonempty + base) * _SPLIT)
    coarse_ok = _groupable(coarse_p, coarse_q, coarse_edge, 2.0**-COARSE_BITS, n, tight)
    # Slots in ratio order: each groupable coarse bucket is one, the others split into their fine buckets
    # (only their tokens are visited). Slot keys: coarse index * _SPLIT + fine offset (0 for a coarse slot).
    split = np.flatnonzero(~coarse_ok[index])
    offset = fine[split] - (coarse[split] + base) * _SPLIT
    split_key = index[split] * _SPLIT + offset
    fine_slots, split_inverse = np.unique(split_key, return_inverse=True)
    coarse_slots = np.flatnonzero(coarse_ok) * _SPLIT
    used = np.sort(np.concatenate([coarse_slots, fine_slots]))
    slots = used.shape[0]
    # Dense slot of every token: the coarse slot's number, then the split tokens' fine slots.
    slot_of_coarse = np.zeros(occupied, dtype=np.int64)
    slot_of_coarse[coarse_ok] = np.searchsorted(used, coarse_slots)
    slot = slot_of_coarse[index]
    fine_number = np.searchsorted(used, fine_slots)
    slot[split] = fine_number[split_inverse]
    # Slot masses: the coarse bucket's, or summed over the split tokens of the fine slot.
    slot_p, slot_q = np.zeros(slots), np.zeros(slots)
    slot_count = np.zeros(slots, dtype=np.int64)
    numbered = slot_of_coarse[coarse_ok]
    slot_p[numbered], slot_q[numbered] = coarse_p[coarse_ok], coarse_q[coarse_ok]
    slot_count[numbered] = coarse_count[coarse_ok]
    slot_p[fine_number] = np.bincount(split_inverse, weights=ps[split], minlength=fine_slots.shape[0])
    slot_q[fine_number] = np.bincount(split_inverse, weights=qs[split], minlength=fine_slots.shape[0])
    slot_count[fine_number] = np.bincount(split_inverse, minlength=fine_slots.shape[0])
    coarse_slot = coarse_ok[used // _SPLIT]
    width = np.where(coarse_slot, 2.0**-COARSE_BITS, 2.0**-FINE_BITS)
    # Absolute fine keys of each slot's edges.
    low_key = (nonempty[used // _SPLIT] + base) * _SPLIT + used % _SPLIT
    slot_low = _edge(low_key)
    slot_high = _edge(low_key + np.where(coarse_slot, _SPLIT, 1))
    ok = _groupable(slot_p, slot_q, slot_low, width, n, tight)
    # Single tokens: the heavy ones and every token of a slot that cannot be grouped.
    singles = np.flatnonzero(~ok[slot])
    heavy = np.r_[np.flatnonzero(ps >= group_below), np.flatnonzero(qs >= group_below)]
    singles = np.unique(np.r_[singles, heavy])
    # Group key: the slot, or the spare bin ``slots`` for tokens kept single.
    group_key = slot.copy()
    group_key[singles] = slots
    group_p = np.bincount(group_key, weights=ps, minlength=slots + 1)[:-1]
    group_q = np.bincount(group_key, weights=qs, minlength=slots + 1)[:-1]
    group_count = slot_count - np.bincount(slot[singles], minlength=slots)
    groups = np.flatnonzero(group_count)
    # Sort items by (slot, ratio) with each group first in its slot.
    single_ratio = ps[singles] / qs[singles]
    item_key = np.concatenate([groups, slot[singles]])
    item_rank = np.concatenate([np.full(groups.shape[0], -np.inf), single_ratio])
    order = np.lexsort((item_rank, item_key))
    item_p = np.concatenate([group_p[groups], ps[singles]])[order]
    item_q = np.concatenate([group_q[groups], qs[singles]])[order]
    low = np.concatenate([slot_low[groups], single_ratio])[order]
    high = np.concatenate([slot_high[groups], single_ratio])[order]
    single = np.concatenate([np.zeros(groups.shape[0], bool), np.ones(singles.shape[0], bool)])[order]
    items_count = np.concatenate([group_count[groups], np.ones(singles.shape[0], np.int64)])[order]
    position = np.empty(order.shape[0], dtype=np.int64)
    position[order] = np.arange(order.shape[0])
    group_item = np.zeros(slots + 1, dtype=np.int64)
    group_item[groups] = position[: groups.shape[0]]
    item = group_item[group_key]
    item[singles] = position[groups.shape[0] :]
    return Items(item_p, item_q, low, high, single, items_count, item, ps, qs)
