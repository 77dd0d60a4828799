r"""Certified intervals for acceptance quantities when only the top-k entries of ``p`` and ``q`` are known.

Serving stacks log the ``k`` largest probabilities of the target ``p`` and of the draft ``q`` at each
position (vLLM returns up to 20), not the full vectors. At such a position every quantity of
:mod:`theory.multidraft` and :mod:`theory.verifiers` depends on the unknown tail, so this module returns the
interval ``[low, high]`` of its values over every *completion* consistent with the log:

* ``p`` is known on the logged ids ``K_p``; every other entry lies in :math:`[0, a]` with ``a`` the smallest
  logged ``p`` (the log is a top-k list, so nothing unlogged is larger), and they sum to the remaining
  mass :math:`r_p = 1 - p(K_p)`; likewise ``q`` with ``K_q``, ``b`` and :math:`r_q`; ``V`` is known.

Tokens fall in four classes: ``A`` (both logged), ``B_p`` (only ``p`` logged), ``B_q`` (only ``q`` logged)
and the :math:`c = V - |K_p \cup K_q|` tokens logged by neither. The proofs of every formula below are in
``docs/truncated_logs.md``; what is proven is:

=====================================  ===========================================================
quantity                               interval
=====================================  ===========================================================
:math:`\sum \min(p, q)` (``overlap``)  exact at both ends
:math:`\alpha^*_{iid}`, ``n >= 2``     ``low`` exact when the tails fit disjointly
                                       (:math:`\lceil r_p/a\rceil + \lceil r_q/b\rceil \le c`),
                                       else a valid lower bound; ``high`` a valid upper bound
:math:`\alpha^*_{wor}`, ``n >= 2``     valid outer bounds (``low``: the "dust" bound, at least the i.i.d. low)
greedy, spechub verifiers              exact at both ends (given the top ``n - 1`` of ``q`` are logged)
optimal verifier                       the :math:`\alpha^*_{iid}` interval
rrs, kseq, nss, naive                  ``low`` exact when the tails fit disjointly, else a valid bound;
                                       ``high`` a valid upper bound
rrs_wor                                valid outer bounds (``low``: the first-rejection bound)
=====================================  ===========================================================

The verifiers' intervals are in :mod:`theory.truncated_verifiers` (re-exported here).

Every interval is exact (``low == high``) when nothing is unknown (``k = V``, or zero remaining mass).
:class:`Interval` carries ``exact_low`` / ``exact_high`` flags per position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from theory.checks import as_choice, as_count
from theory.draft_laws import acceptance_by_draft_count
from theory.multidraft import _ratio_order, _sorted, _wor_inclusion

__all__ = [
    "Interval",
    "TopKPositions",
    "TRUNCATED_QUANTITIES",
    "optimal_acceptance_interval",
    "overlap_interval",
    "top_k_positions",
    "truncated_interval",
    "verifier_acceptance_interval",
]

#: Tolerance on the logged mass (float32 log-probabilities round at about 1e-7 per entry).
MASS_TOLERANCE = 1e-4
#: Names :func:`truncated_interval` accepts: the overlap, the two optima and every verifier.
TRUNCATED_QUANTITIES = (
    "overlap",
    "iid",
    "wor",
    "nss",
    "naive",
    "rrs",
    "rrs_wor",
    "kseq",
    "spechub",
    "greedy",
    "optimal",
)


@dataclass(frozen=True)
class Interval:
    """Per-position certified interval: every completion's value lies in ``[low, high]``.

    ``exact_low`` (``exact_high``) marks positions where ``low`` (``high``) is attained by a completion, so
    the end is the true extremum and not only a bound.
    """

    low: np.ndarray
    high: np.ndarray
    exact_low: np.ndarray
    exact_high: np.ndarray

    @property
    def width(self) -> np.ndarray:
        return self.high - self.low


@dataclass(frozen=True)
class TopKPositions:
    r"""A validated batch of truncated positions, aligned on the union of the logged ids (``B`` rows, ``m`` slots).

    Attributes
    ----------
    p, q : (B, m) float64
        Logged probabilities on the slots (0 where that side is not logged).
    known_p, known_q : (B, m) bool
        Which side is logged at a slot (a slot logged by neither side is padding).
    p_cap, q_cap : (B,)
        ``a`` and ``b``: upper bounds on every unlogged entry (the smallest logged value).
    p_rest, q_rest : (B,)
        :math:`r_p, r_q`, the unlogged mass.
    unlogged : (B,) int
        ``c``: tokens logged by neither side.
    top_q : (B, m) bool
        The slots of the ``q``-largest logged tokens in the order :func:`theory.draft_laws.top_tokens` uses
        (value, then smaller id); used by the greedy and SpecHub laws.
    ids : (B, m) int64
        Token id of each slot (-1 for padding).
    vocab_size : int
    """

    p: np.ndarray
    q: np.ndarray
    known_p: np.ndarray
    known_q: np.ndarray
    p_cap: np.ndarray
    q_cap: np.ndarray
    p_rest: np.ndarray
    q_rest: np.ndarray
    unlogged: np.ndarray
    ids: np.ndarray
    vocab_size: int

    def __len__(self) -> int:
        return self.p.shape[0]

    @property
    def complete(self) -> np.ndarray:
        """Rows whose completion is unique (no unlogged mass on either side)."""
        return (self.p_rest <= 0) & (self.q_rest <= 0)


def _side(ids, values, rest, name: str, vocab: int):
    ids = np.asarray(ids)
    values = np.asarray(values, dtype=np.float64)
    if ids.ndim == 1:
        ids, values = ids[None], values[None]
    if ids.ndim != 2 or values.shape != ids.shape:
        raise ValueError(
            f"{name}_ids and {name}_values must be (B, k) arrays of one shape, got {ids.shape} and {values.shape}"
        )
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{name}_ids must be integer token ids, got dtype {ids.dtype}")
    valid = ids >= 0
    if np.any(ids >= vocab) or np.any(ids < -1):
        raise ValueError(f"{name}_ids must lie in [0, vocab_size = {vocab}) (or -1 for padding)")
    if (
        not np.all(np.isfinite(values[valid]))
        or np.any(values[valid] < 0)
        or np.any(values[valid] > 1 + MASS_TOLERANCE)
    ):
        raise ValueError(f"{name}_values must be finite probabilities in [0, 1] at logged ids")
    values = np.where(valid, np.minimum(values, 1.0), 0.0)
    ordered = np.sort(np.where(valid, ids, -1 - np.arange(ids.shape[1])), axis=1)
    if np.any(ordered[:, 1:] == ordered[:, :-1]):
        raise ValueError(f"{name}_ids repeat a token id within a position")
    count = valid.sum(axis=1)
    if np.any(count == 0):
        raise ValueError(f"{name}_ids: every position needs at least one logged token")
    total = values.sum(axis=1)
    if np.any(total > 1 + MASS_TOLERANCE):
        raise ValueError(f"{name}_values sum to more than 1 at a position (largest {total.max():.6g})")
    implied = np.clip(1.0 - total, 0.0, None)
    if rest is None:
        rest = implied
    else:
        rest = np.broadcast_to(np.asarray(rest, dtype=np.float64), total.shape)
        if not np.all(np.isfinite(rest)) or np.any(np.abs(rest - implied) > MASS_TOLERANCE):
            raise ValueError(
                f"{name}_rest must equal 1 - sum({name}_values) within {MASS_TOLERANCE:g} at every position"
            )
        rest = np.clip(rest, 0.0, None)
    cap = np.where(valid, values, np.inf).min(axis=1)
    if np.any(rest > cap * (vocab - count) + MASS_TOLERANCE):
        raise ValueError(
            f"{name}_values: the remaining mass cannot fit under the smallest logged value on the "
            f"{vocab}-token vocabulary (is this a top-k list of a normalised distribution?)"
        )
    whole = count == vocab  # every token logged: the completion is the log itself, renormalised
    values = np.where(whole[:, None], values / np.where(total > 0, total, 1.0)[:, None], values)
    rest = np.where(whole, 0.0, rest)
    return ids, values, valid, rest, cap


def top_k_positions(
    p_ids, p_values, q_ids, q_values, vocab_size: int, *, p_rest=None, q_rest=None
) -> TopKPositions:
    """Validate and align a batch of top-k logs into a :class:`TopKPositions`.

    Parameters
    ----------
    p_ids, p_values : (B, k_p)
        Token ids and probabilities of the target's logged entries; ``-1`` ids are padding (ragged rows).
    q_ids, q_values : (B, k_q)
        The same for the draft (the ids need not match the target's; ``k_q`` may differ from ``k_p``).
    vocab_size : int
        ``V``.
    p_rest, q_rest : (B,) optional
        The unlogged mass of each side when the logger stored it; checked against ``1 - sum(values)``.

    Raises ``ValueError`` naming the argument for ids outside ``[0, V)``, repeated ids, negative, NaN or
    too-large values, a sum above 1, or a remaining mass that cannot fit under the smallest logged value.
    """
    vocab = as_count(vocab_size, "vocab_size")
    p_ids, p_values, p_valid, p_rest, p_cap = _side(p_ids, p_values, p_rest, "p", vocab)
    q_ids, q_values, q_valid, q_rest, q_cap = _side(q_ids, q_values, q_rest, "q", vocab)
    if p_ids.shape[0] != q_ids.shape[0]:
        raise ValueError(
            f"p_ids and q_ids must have the same number of positions, got {p_ids.shape[0]} and {q_ids.shape[0]}"
        )
    rows, kp = p_ids.shape
    # Merge the two sides by sorting their ids: a token logged by both appears twice, adjacently.
    ids = np.concatenate([np.where(p_valid, p_ids, vocab), np.where(q_valid, q_ids, vocab)], axis=1)
    side = np.concatenate([np.zeros_like(p_ids, dtype=bool), np.ones_like(q_ids, dtype=bool)], axis=1)
    values = np.concatenate([p_values, q_values], axis=1)
    order = np.argsort(ids * 2 + side, axis=1, kind="stable")
    ids, side, values = (np.take_along_axis(x, order, axis=1) for x in (ids, side, values))
    twin = np.zeros_like(side)
    twin[:, :-1] = (ids[:, :-1] == ids[:, 1:]) & (ids[:, :-1] < vocab)  # p entry followed by its q entry
    dropped = np.zeros_like(side)
    dropped[:, 1:] = twin[:, :-1]
    p = np.where(~side, values, 0.0)
    q = np.where(side, values, 0.0)
    q[:, :-1] = np.where(twin[:, :-1], values[:, 1:], q[:, :-1])
    real = (ids < vocab) & ~dropped
    known_p = real & (~side)
    known_q = real & (side | twin)
    p, q = np.where(real, p, 0.0), np.where(real, q, 0.0)
    distinct = real.sum(axis=1)
    return TopKPositions(
        p=p,
        q=q,
        known_p=known_p,
        known_q=known_q,
        p_cap=np.where(np.isfinite(p_cap), p_cap, 0.0),
        q_cap=np.where(np.isfinite(q_cap), q_cap, 0.0),
        p_rest=p_rest,
        q_rest=q_rest,
        unlogged=vocab - distinct,
        ids=np.where(real, ids, -1),
        vocab_size=vocab,
    )


# ----------------------------------------------------------------------------------------------------------
# sum min(p, q): exact at both ends


def _needed(mass: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Fewest entries of size at most ``cap`` that hold ``mass`` (0 for no mass)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        count = np.ceil(mass / cap - 1e-9)
    return np.where(mass <= 0, 0, np.where(cap > 0, count, np.inf))


def _overlap_bounds(p, q, known_p, known_q, a, b, r_p, r_q, c):
    r"""Exact ``(low, high)`` of :math:`\sum \min(p, q)` over completions (``q`` need not sum to 1 here).

    high: :math:`\sum_A \min(p, q) + \max_{w} [w + \min(u_p, r_q - w) + \min(u_q, r_p - w)]` with
    :math:`u_p = \sum_{B_p} \min(p, b)`, :math:`u_q = \sum_{B_q} \min(q, a)` and
    :math:`0 \le w \le \min(c\,\min(a, b), r_p, r_q)` (the overlap placed on tokens logged by neither side).

    low: :math:`\sum \min(p, q) = \min_H [q(H) + p(H^c)]` and the two minima commute, which gives
    :math:`\sum_A \min(p, q) + \min_{m_1, m_2, j} [P_{m_1} + Q_{m_2} + (r_q - b(m_1 + c - j))_+ + (r_p - a(m_2 + j))_+]`
    (:math:`P_{m}` the sum of the ``m`` smallest ``p`` on :math:`B_p`, :math:`Q_m` likewise on :math:`B_q`);
    it is :math:`\sum_A \min(p, q)` when :math:`\lceil r_p/a\rceil + \lceil r_q/b\rceil \le c`.
    """
    both = known_p & known_q
    only_p = known_p & ~known_q
    only_q = known_q & ~known_p
    base = np.where(both, np.minimum(p, q), 0.0).sum(axis=1)
    high = _overlap_high(p, q, known_p, known_q, a, b, r_p, r_q, c, base)
    low = base.copy()
    tight = _needed(r_p, a) + _needed(r_q, b) > c
    for row in np.flatnonzero(tight):
        low[row] += _overlap_low_search(
            np.sort(p[row, only_p[row]]),
            np.sort(q[row, only_q[row]]),
            a[row],
            b[row],
            r_p[row],
            r_q[row],
            int(c[row]),
        )
    return low, high


def _overlap_high(p, q, known_p, known_q, a, b, r_p, r_q, c, base=None):
    """The exact ``high`` of :func:`_overlap_bounds` alone (vectorised; ``base`` = the sum over ``A`` if known)."""
    only_p = known_p & ~known_q
    only_q = known_q & ~known_p
    if base is None:
        base = np.where(known_p & known_q, np.minimum(p, q), 0.0).sum(axis=1)
    u_p = np.where(only_p, np.minimum(p, b[:, None]), 0.0).sum(axis=1)
    u_q = np.where(only_q, np.minimum(q, a[:, None]), 0.0).sum(axis=1)
    w_max = np.minimum(np.minimum(c * np.minimum(a, b), r_p), r_q)
    w = np.clip(np.minimum(r_q - u_p, r_p - u_q), 0.0, w_max)
    return base + w + np.minimum(u_p, r_q - w) + np.minimum(u_q, r_p - w)


def _overlap_low_search(p_only, q_only, a, b, r_p, r_q, c) -> float:
    """``min over (m1, m2, j)`` of the low formula of :func:`_overlap_bounds` (one row, small tails)."""
    m1 = np.arange(p_only.size + 1)[:, None, None]
    m2 = np.arange(q_only.size + 1)[None, :, None]
    p_sums = np.concatenate([[0.0], np.cumsum(p_only)])[:, None, None]
    q_sums = np.concatenate([[0.0], np.cumsum(q_only)])[None, :, None]
    # The hinge terms are convex in j: the minimum is at 0, c, or next to a kink.
    kinks = []
    for kink in (m1 + c - (r_q / b if b > 0 else np.inf), (r_p / a if a > 0 else np.inf) - m2):
        kink = np.broadcast_to(kink, (m1.size, m2.size, 1))
        kinks += [np.floor(kink), np.ceil(kink)]
    shape = (m1.size, m2.size, 1)
    j = np.clip(np.concatenate([np.zeros(shape), np.full(shape, c), *kinks], axis=2), 0, c)
    j = np.where(np.isfinite(j), j, 0)
    value = p_sums + q_sums + np.maximum(r_q - b * (m1 + c - j), 0.0) + np.maximum(r_p - a * (m2 + j), 0.0)
    return float(value.min())


def overlap_interval(positions: TopKPositions) -> Interval:
    r"""Exact interval of :math:`\beta = \sum_y \min(p(y), q(y))` (single-draft acceptance; Leviathan et al.,
    ICML 2023, arXiv:2211.17192) over completions. Formulas: :func:`_overlap_bounds`."""
    s = positions
    low, high = _overlap_bounds(
        s.p, s.q, s.known_p, s.known_q, s.p_cap, s.q_cap, s.p_rest, s.q_rest, s.unlogged
    )
    exact = np.ones(len(s), dtype=bool)
    return Interval(np.clip(low, 0, 1), np.clip(high, 0, 1), exact, exact)


# ----------------------------------------------------------------------------------------------------------
# alpha* for i.i.d. and without-replacement drafts


def _pessimistic(s: TopKPositions):
    """Vectors of the worst case: ``q = 0`` on ``B_p``, ``p = 0`` on ``B_q``, plus a ``p``-tail token with
    ``q = 0`` and a ``q``-tail token with ``p = 0`` (the two tails on disjoint tokens)."""
    p = np.where(s.known_p, s.p, 0.0)
    q = np.where(s.known_q, s.q, 0.0)
    tails_p = np.stack([s.p_rest, np.zeros(len(s))], axis=1)
    tails_q = np.stack([np.zeros(len(s)), s.q_rest], axis=1)
    return np.concatenate([p, tails_p], axis=1), np.concatenate([q, tails_q], axis=1)


def _optimistic(s: TopKPositions, draft: str):
    r"""Vectors of the upper bound: ``H`` ranges over logged-``q`` tokens, with :math:`\hat p = a` where ``p``
    is unlogged; for ``"wor"`` one more token holds the rest of ``q``'s mass and is never worth taking."""
    p_hat = np.where(s.known_q, np.where(s.known_p, s.p, np.minimum(s.p_cap, s.p_rest)[:, None]), 0.0)
    q = np.where(s.known_q, s.q, 0.0)
    if draft == "iid":
        return p_hat, q
    rest = np.clip(1.0 - q.sum(axis=1), 0.0, None)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q > 0, p_hat / q, 0.0).max(axis=1)
    return (
        np.concatenate([p_hat, (rest * (2.0 * ratio + 2.0) + 2.0 * (rest > 0))[:, None]], axis=1),
        np.concatenate([q, rest[:, None]], axis=1),
    )


def _padded(p: np.ndarray, q: np.ndarray, width: int):
    """Zero columns up to ``width`` (the without-replacement bounds read the top ``n - 1`` entries of a row)."""
    extra = max(0, width - p.shape[1])
    return np.pad(p, ((0, 0), (0, extra))), np.pad(q, ((0, 0), (0, extra)))


def _dust_low(s: TopKPositions, n: int) -> np.ndarray:
    r"""Without-replacement lower bound :math:`1 + \min_S [p_D(S) - Q_{dust}(S; r_q)]`: the pessimistic vectors
    (``p = 0`` where unlogged, the ``p`` tail on a token with ``q = 0``) with ``q``'s unlogged mass as a Poisson
    "dust" of rate :math:`r_q` inside every set.

    Valid because (docs/truncated_logs.md, section 3) :math:`Q_{wor}(H)` is at most the inclusion probability with
    the unlogged ``q`` mass in ``H`` replaced by that dust; the minimum over ``S`` is attained on ratio prefixes
    (the limit of ``M`` dust tokens of ``r_q/M``, each with ``p = 0``), each prefix holding all the dust, and
    :math:`Q_{dust}` is computed directly (:func:`theory._wor.wor_prefix_inclusion`), without splitting the dust.
    """
    p, q = _padded(
        np.concatenate([np.where(s.known_p, s.p, 0.0), s.p_rest[:, None]], axis=1),
        np.concatenate([np.where(s.known_q, s.q, 0.0), np.zeros((len(s), 1))], axis=1),
        n + 1,
    )
    order = _ratio_order(p, q)
    p_sorted, q_sorted = np.take_along_axis(p, order, axis=1), np.take_along_axis(q, order, axis=1)
    target_mass = np.zeros((len(s), p.shape[1] + 1))
    np.cumsum(p_sorted, axis=1, out=target_mass[:, 1:])
    gap = target_mass - _wor_inclusion(target_mass, q_sorted, n, dust=np.asarray(s.q_rest, dtype=np.float64))
    return np.clip(1.0 + np.nanmin(gap, axis=1), 0.0, 1.0)


def optimal_acceptance_interval(
    positions: TopKPositions, n: int, *, draft: str = "iid", wor_low: str = "dust"
) -> Interval:
    r"""Interval of :math:`\alpha^* = 1 + \min_H [p(H) - Q(H)]` (Hu et al., ICLR 2025, arXiv:2502.18779) over
    completions, for ``draft`` ``"iid"`` (:math:`Q(H) = q(H)^n`) or ``"wor"``.

    low (``"iid"``): :math:`1 + \min_H [p_-(H) - q_+(H)^n]`, the two minima commuted, with
    :math:`p_-(H)` the least ``p(H)`` and :math:`q_+(H)` the largest ``q(H)`` over completions; bounded below
    by :math:`\alpha^*` of the pessimistic vectors (:func:`_pessimistic`), equal to it when the tails fit on
    disjoint unlogged tokens. low (``"wor"``): the ``"iid"`` low, since :math:`Q_{wor}(H) \le q(H)^n`, and with
    ``wor_low="dust"`` (default) the larger :func:`_dust_low` (the Poisson-dust bound, computed directly on the
    ``k_p + k_q + 1`` entries).

    high: :math:`\max \min \le \min \max`: :math:`1 + \min_{H \subseteq K_q} [\hat p(H) - Q(H)]` with
    :math:`\hat p = p` on ``A`` and ``min(a, r_p)`` on :math:`B_q`; for ``H`` inside the logged ``q`` tokens
    ``Q(H)`` is known (it depends on ``q`` on ``H`` only). Minimised over ratio prefixes (optimal for
    ``"iid"``, an upper bound on the minimum for ``"wor"``).

    ``n = 1`` returns :func:`overlap_interval` (exact). Positions with no unlogged mass are exact.
    """
    draft = as_choice(draft, "draft", ("iid", "wor"))
    wor_low = as_choice(wor_low, "wor_low", ("iid", "dust"))
    n = as_count(n, "n")
    if n == 1:
        return overlap_interval(positions)
    s = positions
    low = _sorted(*_pessimistic(s), n, "iid")
    if draft == "wor" and wor_low == "dust":
        low = np.maximum(low, _dust_low(s, n))
    high = _sorted(*_padded(*_optimistic(s, draft), n + 1), n, draft)
    exact_low = (_needed(s.p_rest, s.p_cap) + _needed(s.q_rest, s.q_cap) <= s.unlogged) & (draft == "iid")
    exact_high = np.zeros(len(s), dtype=bool)
    complete = s.complete
    if complete.any():  # the log determines the row: one exact value at both ends
        low[complete] = high[complete] = acceptance_by_draft_count(
            s.p[complete], s.q[complete], n, draft, lambda p, q, k: _sorted(*_padded(p, q, k + 1), k, draft)
        )
    exact_low |= complete
    exact_high |= complete
    high = np.maximum(high, low)  # round-off only: the bounds are ordered
    return Interval(low, high, exact_low, exact_high)


def truncated_interval(positions: TopKPositions, quantity: str, n: int = 1, **options) -> Interval:
    """Dispatch by name: ``"overlap"``, ``"iid"``, ``"wor"`` (:math:`\\alpha^*`; ``options`` go to
    :func:`optimal_acceptance_interval`) or a verifier name."""
    quantity = as_choice(quantity, "quantity", TRUNCATED_QUANTITIES)
    if quantity == "overlap":
        return overlap_interval(positions)
    if quantity in ("iid", "wor"):
        return optimal_acceptance_interval(positions, n, draft=quantity, **options)
    return verifier_acceptance_interval(positions, quantity, n)


# The verifiers' intervals build on the functions above (imported last: that module imports this one).
from theory.truncated_verifiers import verifier_acceptance_interval  # noqa: E402
