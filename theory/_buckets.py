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
   could hold a nearly tight prefix or where grouping could cost acceptance: a group's tokens take an edge of
   their bucket as ratio (the lower one above the minimiser, the upper one below), which moves the gap of every
   prefix through the group, relative to the minimiser, by its *push* :math:`u_c = p_c - e_c q_c` (above) or
   :math:`e_{c+1} q_c - p_c` (below), so a bucket is grouped only when :math:`LB_b - G_{min} > \mathrm{TIGHT} +
   \sum u_c` over the grouped buckets ``c`` between it and the minimiser (itself included), with
   :math:`G_{min}` the smallest gap at a bucket boundary; the light tokens of the other buckets form one item
   per bucket, carrying the bucket's edges as ratio bounds.

The items come back in ratio order (a group before the heavy singletons of its bucket: no prefix inside a
grouped bucket is nearly tight, whatever the order there). Only the items are sorted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from theory import _native

#: Mantissa bits of ``p/q`` in the coarse and the fine bucket keys (``2**bits`` buckets per octave).
COARSE_BITS, FINE_BITS = 3, 8
_SPLIT = 1 << (FINE_BITS - COARSE_BITS)  # fine buckets per coarse bucket
_SHIFT = 52 - FINE_BITS
#: Block length of :func:`prefix_sums`.
BLOCK = 256
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


_WORKSPACE = threading.local()


def scratch(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Two reusable ``(size,)`` float64 arrays of this thread (contents undefined), for vocabulary-sized
    temporaries that never leave a build (or, after it, the executor's verification step on one row).

    A fresh 400 kB array is handed out by ``mmap`` or a freshly trimmed heap and costs ~100 page faults on
    first touch (measured 0.5--1.3 ms of system time per V = 49152 build); arrays kept from one build to the
    next are touched once. They grow to the largest ``size`` seen and are per thread, so concurrent builds do
    not share them.
    """
    arrays = getattr(_WORKSPACE, "arrays", None)
    if arrays is None or arrays[0].shape[0] < size:
        arrays = (np.empty(size), np.empty(size))
        _WORKSPACE.arrays = arrays
    return arrays[0][:size], arrays[1][:size]


def prefix_sums(values: np.ndarray) -> np.ndarray:
    """``[0, v_0, v_0 + v_1, ...]`` in float64, accurate to a few ulps: float64 sums inside blocks of
    :data:`BLOCK`, block offsets summed in extended precision and rounded once (a plain cumulative sum over
    5e4 tokens drifts by ~6e-14)."""
    size = values.shape[0]
    padded = np.zeros(-(-size // BLOCK) * BLOCK)
    padded[:size] = values
    blocks = padded.reshape(-1, BLOCK)
    inner = np.cumsum(blocks, axis=1)
    offsets = np.zeros(blocks.shape[0], dtype=np.longdouble)
    offsets[1:] = np.cumsum(inner[:, -1].astype(np.longdouble))[:-1]
    out = np.empty(size + 1)
    out[0] = 0.0
    out[1:] = (inner + offsets.astype(np.float64)[:, None]).ravel()[:size]
    return out


def head_sums(values: np.ndarray) -> np.ndarray:
    """``[0, v_0, v_0 + v_1, ...]``: ``np.cumsum`` with a leading 0, bitwise ``np.r_[0, np.cumsum(values)]``
    without ``np.r_``'s ~20 us of index-trick overhead (a dozen calls per build)."""
    out = np.zeros(values.shape[0] + 1, dtype=values.dtype)
    np.cumsum(values, out=out[1:])
    return out


def tail_sums(values: np.ndarray) -> np.ndarray:
    """``[..., v_{-2} + v_{-1}, v_{-1}, 0]``: the sums of each suffix, accumulated from the end."""
    out = np.zeros(values.shape[0] + 1, dtype=values.dtype)
    np.cumsum(values[::-1], out=out[-2::-1])
    return out


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


def _groupable(bucket_p, bucket_q, light_p, light_q, low, high, n: int, tight: float) -> np.ndarray:
    """Which buckets (in ratio order: masses ``bucket_p``, ``bucket_q``, of which ``light_p``, ``light_q`` are
    the light tokens a group would hold; ratio edges ``low``, ``high``) may be grouped: no nearly tight prefix
    inside, and the pushes of the groups covered by the slack (module docstring)."""
    buckets = bucket_p.shape[0]
    head_p = head_sums(bucket_p)
    head_q = np.minimum(head_sums(bucket_q), 1.0)
    power = head_q.copy()
    for _ in range(n - 1):
        power *= head_q
    boundary = head_p - power  # gap after the buckets < b, b = 0..buckets
    lowest = min(float(boundary.min()), 0.0)
    cut = int(np.argmin(boundary))
    # A prefix ending inside bucket b holds the buckets < b and tokens of b of q-mass x <= q_b and p-mass
    # >= e_b x, so its gap is >= P_{<b} + e_b x - (Q_{<b} + x)^n, concave in x: LB_b is the smaller of the
    # two ends. Slack: LB_b over the smallest gap at a boundary. A group's tokens get an edge of its bucket as
    # ratio (the lower above the minimising boundary, the upper below), which moves the gap of every prefix
    # through the group, relative to the minimising one, by the group's push p - low q or high q - p. First
    # the buckets whose own push fits, then those whose slack also covers the pushes of all such buckets
    # between them and the minimising boundary (a superset of the groups kept, so the bound holds for them).
    below = np.arange(buckets) < cut
    with np.errstate(invalid="ignore", over="ignore"):  # edge = inf on p > 0 = q buckets (none here)
        inner = np.where(bucket_q > 0, head_p[:-1] + low * bucket_q - power[1:], head_p[1:] - power[1:])
        push = np.where(below, high * light_q - light_p, light_p - low * light_q)
    slack = np.minimum(boundary[:-1], inner) - lowest - tight - MARGIN
    # Each push is >= 0 token by token; as a difference of two bucket sums it can round below that. Clipped at
    # 0 and raised by 2 ulps of p: a push still underestimated can only cost acceptance (within the shortfall
    # check's 1e-9 and its exact-path fallback), never exactness.
    push = np.maximum(push, 0.0) + 4e-16 * light_p
    fits = slack > push  # False on a NaN push
    total = head_sums(np.where(fits, push, 0.0))
    between = np.where(below, total[cut] - total[:-1], total[1:] - total[cut])
    return fits & (slack > between)


#: The constants :func:`bucketed` hands to its native twin (:mod:`theory._native`).
NATIVE_CONSTANTS = {"MARGIN": MARGIN, "SHIFT": _SHIFT, "FINE_BITS": FINE_BITS, "COARSE_BITS": COARSE_BITS}


def item_arrays(items: Items) -> tuple:
    """``(p, q, low, high, single, count, item)`` of ``items``: what the native twin returns."""
    return items.p, items.q, items.low, items.high, items.single, items.count, items.item


def bucketed(ps: np.ndarray, qs: np.ndarray, n: int, group_below: float, tight: float, absent=None) -> Items:
    """Items for a support with masses ``ps``, ``qs`` (``qs > 0``): see the module docstring and
    :func:`_bucketed`. Runs as C++ where it is built (:mod:`theory._native`, bitwise the same items), else numpy.
    """
    native = _native.bucketed(ps, qs, n, group_below, tight, absent, NATIVE_CONSTANTS)
    if native is not None:
        return Items(*native, ps, qs)
    return _bucketed(ps, qs, n, group_below, tight, absent)


def _bucketed(ps: np.ndarray, qs: np.ndarray, n: int, group_below: float, tight: float, absent=None) -> Items:
    """Items for a support with masses ``ps``, ``qs`` (``qs > 0``): see the module docstring; the specification
    of the native twin.

    ``absent``: indices of tokens left out (``q = 0`` or negligible), for a whole row passed as it is (no copy of
    its support):
    they join no item and get the item index one past the last; every item is the same as for the support.

    Two levels: coarse buckets (:data:`COARSE_BITS`), then the coarse buckets that cannot be grouped are
    split into their fine buckets (:data:`FINE_BITS`, relative width ``2**-FINE_BITS``) and the test is rerun
    on the mixed sequence, so that only tokens very close (in ratio) to a nearly tight prefix stay single.
    Passes over the whole vocabulary (the build's cost at LM sizes): the keys, the heavy test, three
    bincounts of the coarse keys and one gather of each token's item. The heavy tokens (always single) get a
    key of their own first, so the bucket sums are those of the light tokens, which are the groups' masses
    (summed over the same tokens in the same order as a bincount of the items would); the whole-bucket masses
    of the grouping test add the few heavy tokens back (positive terms). Everything else runs on buckets,
    slots (addressed by their absolute starting fine key, so that a token's slot is the last slot key at or
    below its own) or the small sets of split, heavy and single tokens.
    """
    fine_buffer, coarse_buffer = scratch(ps.shape[0])  # no fresh vocabulary-sized temporaries
    missing = absent is not None and absent.shape[0] > 0
    if missing:
        # p/0 = inf, 0/0 = nan, p/1e-310 overflows: absent tokens are rekeyed below.
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            fine = np.divide(ps, qs, out=fine_buffer).view(np.int64)
    else:
        fine = np.divide(ps, qs, out=fine_buffer).view(np.int64)
    np.right_shift(fine, _SHIFT, out=fine)  # the ratio's top bits: monotone in the ratio
    # < 2**15: bincounts over absolute keys stay small
    coarse = np.right_shift(fine, FINE_BITS - COARSE_BITS, out=coarse_buffer.view(np.int64))
    # Coarse keys relative to the smallest present one: the bucket arrays span the row's ratio range (a few
    # thousand keys) instead of all 2**14 keys, and stay below malloc's mmap threshold (each fresh 128 kB
    # bucket array cost ~32 page faults, ~0.3 ms per build over five of them).
    base = int(coarse.min())  # absent tokens (p/0 = inf, 0/0 = nan) have the largest keys, p = 0 ones key 0
    if missing:
        coarse[absent] = base
    top = int(coarse.max()) - base
    heavy_key, absent_key = top + 1, top + 2  # above every present key: heavy tokens, then absent ones
    np.subtract(coarse, base, out=coarse)
    heavy = np.flatnonzero((ps >= group_below) | (qs >= group_below))
    if missing:
        coarse[absent] = absent_key  # the last key: its bucket is dropped from every test and item
        heavy = heavy[coarse[heavy] != absent_key]
    heavy_fine = fine[heavy]
    heavy_coarse = (heavy_fine >> (FINE_BITS - COARSE_BITS)) - base
    coarse[heavy] = heavy_key
    count = np.bincount(coarse, minlength=heavy_key + 1)  # light tokens per bucket
    light_p = np.bincount(coarse, weights=ps, minlength=count.shape[0])
    light_q = np.bincount(coarse, weights=qs, minlength=count.shape[0])
    heavy_p, heavy_q = ps[heavy], qs[heavy]
    every = count[:heavy_key].copy()
    np.add.at(every, heavy_coarse, 1)
    nonempty = np.flatnonzero(every)
    bucket_p, bucket_q = light_p[nonempty], light_q[nonempty]
    if heavy.shape[0]:
        position = np.searchsorted(nonempty, heavy_coarse)
        np.add.at(bucket_p, position, heavy_p)
        np.add.at(bucket_q, position, heavy_q)
    edges = _edge((nonempty + base) * _SPLIT)
    nonempty_ok = _groupable(
        bucket_p,
        bucket_q,
        light_p[nonempty],
        light_q[nonempty],
        edges,
        _edge((nonempty + base + 1) * _SPLIT),
        n,
        tight,
    )
    coarse_ok = np.zeros(count.shape[0], dtype=bool)
    coarse_ok[nonempty[nonempty_ok]] = True
    coarse_ok[heavy_key:] = True  # heavy and absent tokens are never split
    # Light tokens of the coarse buckets to split and their fine keys (only these tokens are visited), and
    # the heavy tokens of those buckets.
    if nonempty_ok.all():
        split = np.zeros(0, dtype=np.int64)
    else:
        split = np.flatnonzero(~coarse_ok[coarse])
    heavy_split = ~coarse_ok[heavy_coarse]
    fine_slots, inverse = np.unique(
        np.concatenate([fine[split], heavy_fine[heavy_split]]), return_inverse=True
    )
    split_inverse = inverse[: split.shape[0]]
    # Slots in ratio order, keyed by their first absolute fine key: the groupable coarse buckets and the fine
    # buckets of the split ones.
    used = np.sort(np.concatenate([(nonempty[nonempty_ok] + base) * _SPLIT, fine_slots]))
    slots = used.shape[0]
    coarse_slot = coarse_ok[(used >> (FINE_BITS - COARSE_BITS)) - base]
    fine_number = np.searchsorted(used, fine_slots)
    group_p, group_q = np.zeros(slots), np.zeros(slots)  # light masses and counts of each slot
    light_count = np.zeros(slots, dtype=np.int64)
    whole = (used[coarse_slot] >> (FINE_BITS - COARSE_BITS)) - base
    group_p[coarse_slot], group_q[coarse_slot], light_count[coarse_slot] = (
        light_p[whole],
        light_q[whole],
        count[whole],
    )
    group_p[fine_number] = np.bincount(split_inverse, weights=ps[split], minlength=fine_slots.shape[0])
    group_q[fine_number] = np.bincount(split_inverse, weights=qs[split], minlength=fine_slots.shape[0])
    light_count[fine_number] = np.bincount(split_inverse, minlength=fine_slots.shape[0])
    heavy_slot = np.searchsorted(used, heavy_fine, side="right") - 1
    slot_p, slot_q = group_p.copy(), group_q.copy()
    np.add.at(slot_p, heavy_slot, heavy_p)
    np.add.at(slot_q, heavy_slot, heavy_q)
    slot_low = _edge(used)
    slot_high = _edge(used + np.where(coarse_slot, _SPLIT, 1))
    ok = _groupable(slot_p, slot_q, group_p, group_q, slot_low, slot_high, n, tight)
    # Heavy tokens stay single wherever they are; every token of a slot that cannot be grouped is single.
    grouped_count = np.where(ok, light_count, 0)
    single_count = light_count - grouped_count + np.bincount(heavy_slot, minlength=slots)
    has_group = grouped_count > 0
    # Item positions: each slot's group first, then its singles in ratio order.
    first = head_sums(has_group + single_count)[:-1]
    group_item = np.where(has_group, first, -1)
    items = int(first[-1] + has_group[-1] + single_count[-1]) if slots else 0
    # Every token's group item (-1: single), by one gather over the coarse keys; split tokens patched.
    coarse_item = np.full(count.shape[0], -1, dtype=np.int64)
    coarse_item[whole] = group_item[coarse_slot]
    if missing:
        coarse_item[absent_key] = items
    item = np.take(coarse_item, coarse)
    split_item = group_item[fine_number[split_inverse]]
    item[split] = split_item
    if ok[coarse_slot].all():  # the singles are the heavy tokens and split tokens of slots not grouped
        singles = np.sort(np.concatenate([heavy, split[split_item < 0]]))
    else:  # a whole coarse bucket failed the second test: its tokens are single too
        singles = np.flatnonzero(item < 0)
    single_slot = np.searchsorted(used, fine[singles], side="right") - 1
    single_ratio = ps[singles] / qs[singles]
    order = np.lexsort((single_ratio, single_slot))
    singles, single_slot, single_ratio = singles[order], single_slot[order], single_ratio[order]
    # Rank of each single within its slot: position in the sorted list minus the slot's first single.
    slot_start = np.searchsorted(single_slot, np.arange(slots))
    rank = np.arange(singles.shape[0]) - slot_start[single_slot]
    single_item = first[single_slot] + has_group[single_slot] + rank
    item[singles] = single_item
    groups = group_item[has_group]
    item_p, item_q = np.empty(items), np.empty(items)
    item_p[groups], item_q[groups] = group_p[has_group], group_q[has_group]
    item_p[single_item], item_q[single_item] = ps[singles], qs[singles]
    is_single = np.ones(items, dtype=bool)
    is_single[groups] = False
    low, high = np.empty(items), np.empty(items)
    low[groups], high[groups] = slot_low[has_group], slot_high[has_group]
    low[single_item], high[single_item] = single_ratio, single_ratio
    item_count = np.ones(items, dtype=np.int64)
    item_count[groups] = grouped_count[has_group]
    return Items(item_p, item_q, low, high, is_single, item_count, item, ps, qs)
