r"""Ratio buckets: shrink an LM-sized pair to the few hundred *items* that the optimal verifier's build needs.

The build of :func:`theory.optimal_verifier` works on the ratio order :math:`\rho = p/q`, but at LM vocabulary
sizes almost every token is light and far, in ratio, from every nearly tight prefix. Such tokens can share one
race weight without changing exactness (the race only sees their group, and given the group the token is a
draw from :math:`q` restricted to it, so each token gets :math:`r_y = q_y\, r_g / q_g`), and a full sort of the
vocabulary is not needed to place them. This module:

1. buckets the support by the top bits of :math:`\rho`'s float64 representation (monotone in :math:`\rho \ge 0`;
   :data:`BUCKET_BITS` mantissa bits, so every token of bucket ``b`` has :math:`e_b \le \rho < e_{b+1}` with
   :math:`e_{b+1} / e_b \le 1 + 2^{-\mathrm{BUCKET\_BITS}}`), with bucket masses from ``bincount``;
2. bounds the gap :math:`p(H) - q(H)^n` of every ratio prefix ending inside bucket ``b`` from below by
   :math:`LB_b = P_{<b} - Q_{\le b}^n` (such a prefix holds all earlier buckets and part of ``b``);
3. keeps as single tokens the heavy ones (``max(p, q) >=`` ``group_below``) and every token of a bucket that
   could hold a nearly tight prefix or where grouping could cost acceptance: a bucket is grouped only when
   :math:`LB_b - G_{min} > \mathrm{TIGHT} + \delta\, p(\text{buckets between it and the minimiser})`, with
   :math:`G_{min}` the smallest gap at a bucket boundary and :math:`\delta = 2^{-\mathrm{BUCKET\_BITS}}` the
   largest relative loss of replacing a token's ratio by its bucket's edge; the light tokens of the other
   buckets form one item per bucket, carrying the bucket's edges as ratio bounds.

The items come back in ratio order (a group before the heavy singletons of its bucket: no prefix inside a
grouped bucket is nearly tight, whatever the order there). Only the items are sorted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Mantissa bits of ``p/q`` in the bucket key (``2**BUCKET_BITS`` buckets per octave).
BUCKET_BITS = 3
_SHIFT = 52 - BUCKET_BITS
#: Relative width of a bucket, the largest relative error of a bucket edge as a token's ratio.
WIDTH = 2.0**-BUCKET_BITS
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
    return (keys.astype(np.int64) << _SHIFT).view(np.float64)


def singletons(ps: np.ndarray, qs: np.ndarray) -> Items:
    """Every token its own item, sorted by ratio (the exact path)."""
    ratio = ps / qs
    order = np.argsort(ratio, kind="stable")
    item = np.empty(order.shape[0], dtype=np.int64)
    item[order] = np.arange(order.shape[0])
    ones = np.ones(order.shape[0], dtype=bool)
    return Items(
        ps[order], qs[order], ratio[order], ratio[order], ones, ones.astype(np.int64), item, ps, qs
    )


def bucketed(ps: np.ndarray, qs: np.ndarray, n: int, group_below: float, tight: float) -> Items:
    """Items for a support with masses ``ps``, ``qs`` (``qs > 0``): see the module docstring."""
    ratio = ps / qs
    key = ratio.view(np.int64) >> _SHIFT
    base = int(key.min())
    key = key - base
    buckets = int(key.max()) + 1
    bucket_p = np.bincount(key, weights=ps, minlength=buckets)
    bucket_q = np.bincount(key, weights=qs, minlength=buckets)
    # Gaps at bucket boundaries and the lower bounds LB_b, in float64 over a few hundred buckets (they only
    # decide which buckets are grouped, with a margin far above their round-off).
    head_p = np.concatenate([[0.0], np.cumsum(bucket_p)])
    head_q = np.minimum(np.concatenate([[0.0], np.cumsum(bucket_q)]), 1.0)
    power = head_q.copy()
    for _ in range(n - 1):
        power *= head_q
    boundary = head_p - power  # gap after the buckets < b, b = 0..buckets
    lowest = min(float(boundary.min()), 0.0)
    inside = head_p[:-1] - power[1:]  # LB_b
    cut = int(np.argmin(boundary))
    # p-mass between each bucket and the minimising boundary (the bucket included).
    between = np.where(np.arange(buckets) < cut, head_p[cut] - head_p[:-1], head_p[1:] - head_p[cut])
    groupable = inside - lowest > tight + WIDTH * between + MARGIN
    # Group key: the bucket, or the spare bin ``buckets`` for tokens kept single.
    group_key = np.where(groupable[key] & (np.maximum(ps, qs) < group_below), key, buckets)
    singles = np.flatnonzero(group_key == buckets)
    group_p = np.bincount(group_key, weights=ps, minlength=buckets + 1)[:-1]
    group_q = np.bincount(group_key, weights=qs, minlength=buckets + 1)[:-1]
    group_count = np.bincount(group_key, minlength=buckets + 1)[:-1]
    groups = np.flatnonzero(group_count)
    # Sort items by (bucket, ratio) with each group first in its bucket.
    item_key = np.concatenate([groups, key[singles]])
    item_rank = np.concatenate([np.full(groups.shape[0], -np.inf), ratio[singles]])
    order = np.lexsort((item_rank, item_key))
    item_p = np.concatenate([group_p[groups], ps[singles]])[order]
    item_q = np.concatenate([group_q[groups], qs[singles]])[order]
    low = np.concatenate([_edge(groups + base), ratio[singles]])[order]
    high = np.concatenate([_edge(groups + base + 1), ratio[singles]])[order]
    single = np.concatenate([np.zeros(groups.shape[0], bool), np.ones(singles.shape[0], bool)])[order]
    count = np.concatenate([group_count[groups], np.ones(singles.shape[0], np.int64)])[order]
    position = np.empty(order.shape[0], dtype=np.int64)
    position[order] = np.arange(order.shape[0])
    group_item = np.zeros(buckets + 1, dtype=np.int64)
    group_item[groups] = position[: groups.shape[0]]
    item = group_item[group_key]
    item[singles] = position[groups.shape[0] :]
    return Items(item_p, item_q, low, high, single, count, item, ps, qs)
