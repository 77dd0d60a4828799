r"""Certified intervals of each verifier's acceptance on truncated (top-k) positions.

The setting and notation are those of :mod:`theory.truncated` (``A`` the tokens logged on both sides, ``a``,
``b`` the caps, :math:`r_p, r_q` the unlogged masses, ``c`` the tokens logged by neither side). Proofs:
``docs/truncated_logs.md``, section 4. Three facts carry the verifiers of :mod:`theory.verifiers`:

* **RRS as a function of one curve.** With :math:`h(s) = \sum_y \min(p(y), s\,q(y))`, RRS with ``n`` i.i.d.
  drafts (SpecInfer, Miao et al., ASPLOS 2024, arXiv:2305.09781) accepts :math:`h(s_{n+1})` with
  :math:`s_1 = 0`, :math:`s_{j+1} = s_j + 1 - h(s_j)` (``s_j`` sums the probabilities of reaching draft
  ``1..j-1``). Its value only grows when ``h`` grows by a non-decreasing function, and ``s`` only shrinks.
* **K-SEQ as a function of one curve.** K-SEQ (SpecTr, Sun et al., NeurIPS 2023, arXiv:2310.15141) accepts
  :math:`\max_{\rho \in [1, n]} \min(1 - (1 - h(\rho)/\rho)^n,\; h(\rho))`, non-decreasing in ``h`` pointwise.
* **Without replacement helps RRS.** :math:`\alpha_{rrs\_wor}(p, q) \ge \alpha_{rrs}(p, q)` for every pair.

Every completion's ``h`` lies between :math:`h_A(s) = \sum_A \min(p, s q)` (which it exceeds by a
non-decreasing function) and :math:`h_+(s)`, the exact largest overlap of ``p`` with ``s q`` over
completions (:func:`theory.truncated._overlap_high`). The pessimistic completion (``q = 0`` where only ``p``
is logged and vice versa, the two tails on disjoint unlogged tokens) has :math:`h = h_A`, and it is a
completion whenever the tails fit (:math:`\lceil r_p/a\rceil + \lceil r_q/b\rceil \le c`, always at LM
vocabulary sizes): there the low ends of rrs, kseq, naive and nss are attained.
"""

from __future__ import annotations

import numpy as np

from theory.checks import as_choice, as_count
from theory.draft_laws import acceptance_by_draft_count
from theory.truncated import (
    TRUNCATED_QUANTITIES,
    Interval,
    TopKPositions,
    _needed,
    _overlap_bounds,
    _overlap_high,
    truncated_interval,
)
from theory.verifiers import verifier
from theory.verifiers.iid import KSEQ_BISECTION_STEPS

__all__ = ["verifier_acceptance_interval"]

#: K-SEQ's validity tolerance, the same as the dense verifier's (so the pessimistic value matches it exactly).
KSEQ_TOLERANCE = 1e-13
#: Logged draft tokens whose without-replacement gain enters the rrs_wor low (:func:`_rrs_wor_low`); any subset
#: gives a valid bound, the tokens of largest rejection weight carry almost all of it.
RRS_WOR_GAIN_TOKENS = 8


class _Curves:
    r"""The two envelopes of :math:`h(s) = \sum_y \min(p(y), s\,q(y))` over completions, batched over rows."""

    def __init__(self, s: TopKPositions):
        both = s.known_p & s.known_q
        self.s = s
        self.p_both = np.where(both, s.p, 0.0)
        self.q_both = np.where(both, s.q, 0.0)

    def low(self, scale: np.ndarray) -> np.ndarray:
        r""":math:`h_A(s) = \sum_A \min(p, s q)` (every completion's ``h`` exceeds it by a non-decreasing function)."""
        return np.minimum(self.p_both, scale[:, None] * self.q_both).sum(axis=1)

    def low_many(self, scale: np.ndarray) -> np.ndarray:
        r""":math:`h_A` at several points per row, ``scale`` (B, G) -> (B, G)."""
        return np.minimum(self.p_both[:, None, :], scale[:, :, None] * self.q_both[:, None, :]).sum(axis=2)

    def beta_low(self, rho: np.ndarray) -> np.ndarray:
        r""":math:`h_A(\rho)/\rho` written as :math:`\sum_A \min(p/\rho, q)`, the dense K-SEQ's own arithmetic."""
        return np.minimum(self.p_both / rho[:, None], self.q_both).sum(axis=1)

    def high(self, scale: np.ndarray) -> np.ndarray:
        r""":math:`h_+(s)`: the exact largest :math:`\sum \min(p, s q)` over completions (caps and tail scaled)."""
        s = self.s
        return _overlap_high(
            s.p,
            s.q * scale[:, None],
            s.known_p,
            s.known_q,
            s.p_cap,
            s.q_cap * scale,
            s.p_rest,
            s.q_rest * scale,
            s.unlogged,
        )


def _rrs_bounds(curves: _Curves, n: int):
    r"""RRS (i.i.d.) ``(low, high)``: :math:`h_A(S_{n+1})` and :math:`h_+(S_{n+1})`, ``S`` run on :math:`h_A`."""
    rows = len(curves.s)
    total, reach = np.zeros(rows), np.ones(rows)  # S_j and M_j = 1 - h_A(S_j)
    for _ in range(n):
        total = total + reach
        reach = 1.0 - curves.low(total)
    return curves.low(total), curves.high(total)


def _rrs_wor_low(curves: _Curves, n: int, overlap_low: np.ndarray) -> np.ndarray:
    r"""RRS without replacement: a certified low that keeps the gain of the first rejected draft.

    For every completion (docs/truncated_logs.md, section 4, Lemma F) the acceptance is at least
    :math:`\sum_x \pi_x V(\kappa_x)`, :math:`\pi_x = (q - p)_+(x)/(1 - r)` the law of the first rejected draft,
    :math:`\kappa_x = 1 - q(x)` and :math:`V(\kappa) = h_A(U_n)` with :math:`U_1 = 1`,
    :math:`U_{j+1} = U_j + (1 - h_A(U_j))/\kappa`. :math:`V` is non-increasing in :math:`\kappa` and
    :math:`V(1) = h_A(S_{n+1})` is the i.i.d. RRS low, so dropping any ``x`` keeps a bound: this sums the
    :data:`RRS_WOR_GAIN_TOKENS` logged ``q`` tokens of largest certain rejection weight
    :math:`w_x \le (q - p)_+(x)` (``q - p`` on ``A``, :math:`q - \min(a, r_p)` on :math:`B_q`), with
    :math:`\pi_x \ge w_x/(1 - \beta_{low})`.
    """
    s = curves.s
    rows = len(s)
    cap = np.minimum(s.p_cap, s.p_rest)[:, None]
    weight = np.where(s.known_q, np.maximum(s.q - np.where(s.known_p, s.p, cap), 0.0), 0.0)
    count = min(RRS_WOR_GAIN_TOKENS, weight.shape[1])
    chosen = np.argsort(-weight, axis=1, kind="stable")[:, :count]
    weight = np.take_along_axis(weight, chosen, axis=1)
    kappa = 1.0 - np.take_along_axis(s.q, chosen, axis=1)
    kappa = np.where(weight > 0, np.maximum(kappa, np.finfo(float).tiny), 1.0)
    rest = 1.0 - overlap_low
    share = np.where(rest[:, None] > 0, weight / np.where(rest > 0, rest, 1.0)[:, None], 0.0)
    kappa = np.concatenate([np.ones((rows, 1)), kappa], axis=1)  # column 0: V(1)
    reach = np.ones_like(kappa)  # U_j
    for _ in range(n - 1):
        reach = reach + (1.0 - curves.low_many(reach)) / kappa
    value = curves.low_many(reach)
    gain = np.maximum(value[:, 1:] - value[:, :1], 0.0)  # V(kappa) >= V(1) holds exactly; clip round-off
    return value[:, 0] + (np.minimum(share, 1.0) * gain).sum(axis=1)


def _kseq_value(beta, n: int, rows: int, upper: bool) -> np.ndarray:
    r"""K-SEQ's acceptance for the curve :math:`\beta(\rho)` (``beta(rho)`` returns ``(rows,)``).

    The dense verifier's bisection for the smallest valid :math:`\rho \in [1, n]`
    (:math:`1 - (1 - \beta)^n \le \rho\beta`); ``upper=False`` returns :math:`1 - (1 - \beta)^n` at the valid end
    (the dense value), ``upper=True`` at the last invalid point, an upper bound on
    :math:`\max_\rho \min(1 - (1 - \beta)^n, \rho\beta)` for a curve known only pointwise from above.
    """

    def sides(rho):
        value = beta(rho)
        return 1.0 - (1.0 - value) ** n, rho * value

    low, high = np.ones(rows), np.full(rows, float(n))
    left, right = sides(low)
    done = left <= right + KSEQ_TOLERANCE
    high = np.where(done, low, high)
    for _ in range(KSEQ_BISECTION_STEPS):
        middle = 0.5 * (low + high)
        left, right = sides(middle)
        ok = left <= right + KSEQ_TOLERANCE
        high = np.where(ok, middle, high)
        low = np.where(ok, low, middle)
    return sides(low if upper else high)[0]


def _kseq_bounds(curves: _Curves, n: int):
    r"""K-SEQ ``(low, high)``: its value on :math:`h_A` (the pessimistic completion) and on :math:`h_+`."""
    rows = len(curves.s)
    low = _kseq_value(curves.beta_low, n, rows, upper=False)
    high = _kseq_value(lambda rho: curves.high(rho) / rho, n, rows, upper=True)
    return low, high


def _nss_bounds(s: TopKPositions, n: int):
    r"""NSS ``(low, high)`` for :math:`\sum_y p(y) f(q(y))`, :math:`f(x) = 1 - (1 - x)^n` (concave, increasing).

    low: :math:`\sum_A p f(q)`. high: :math:`\sum_A p f(q) + f(\tilde b)(p(B_p) + r_p) +
    \max_x \sum_{B_q} x_j (f(q_j) - f(\tilde b))` over :math:`x_j \in [0, a]`, :math:`\sum x_j \le r_p`
    (greedy, largest ``q_j`` first), :math:`\tilde b = \min(b, r_q)` bounding every unlogged ``q``.
    """
    both = s.known_p & s.known_q
    only_p = s.known_p & ~s.known_q
    only_q = s.known_q & ~s.known_p
    gain = 1.0 - (1.0 - s.q) ** n
    low = np.where(both, s.p * gain, 0.0).sum(axis=1)
    cap_gain = 1.0 - (1.0 - np.minimum(s.q_cap, s.q_rest)) ** n
    ranked = np.sort(np.where(only_q, gain, -1.0), axis=1)[:, ::-1]  # B_q by f(q), largest first
    filled = np.clip(s.p_rest[:, None] - s.p_cap[:, None] * np.arange(ranked.shape[1]), 0.0, s.p_cap[:, None])
    extra = np.where(ranked >= 0, filled * np.maximum(ranked - cap_gain[:, None], 0.0), 0.0).sum(axis=1)
    outside = np.where(only_p, s.p, 0.0).sum(axis=1) + s.p_rest
    return low, low + cap_gain * outside + extra


def _naive_low(s: TopKPositions, n: int) -> np.ndarray:
    r"""The naive rule's :math:`\sum_A [\min(p, q) + (p - q)_+ (1 - (1 - q)^{n-1})]` (every other term is >= 0)."""
    both = s.known_p & s.known_q
    terms = np.minimum(s.p, s.q) + np.maximum(s.p - s.q, 0.0) * (1.0 - (1.0 - s.q) ** (n - 1))
    return np.where(both, terms, 0.0).sum(axis=1)


def _closed_form_interval(s: TopKPositions, n: int) -> Interval:
    r"""Exact interval of the greedy/SpecHub optimum :math:`p(T) + \sum_{x \notin T} \min(p, q/(1 - q(T)))`.

    With ``T`` (the top ``n - 1`` of ``q``) logged, this is :math:`\sum \min(p, q'')` for :math:`q'' = 1` on
    ``T`` and :math:`q/(1 - q(T))` elsewhere, whose unlogged entries are at most :math:`b/(1 - q(T))` and sum
    to :math:`r_q/(1 - q(T))`: :func:`theory.truncated._overlap_bounds` applies. Rows where ``T`` is not
    certainly logged (fewer than ``n - 1`` logged ``q`` above the cap ``b`` while ``q`` has unlogged mass) get
    ``[0, 1]``.
    """
    rows = len(s)
    in_top = np.zeros(s.q.shape, dtype=bool)
    sure = np.ones(rows, dtype=bool)
    if n > 1:
        key = np.where(s.known_q, s.q, -1.0)
        order = np.lexsort((np.where(s.ids >= 0, s.ids, np.iinfo(np.int64).max), -key), axis=1)[:, : n - 1]
        np.put_along_axis(in_top, order, True, axis=1)
        in_top &= s.known_q
        smallest_top = np.where(in_top, s.q, np.inf).min(axis=1)
        sure = (in_top.sum(axis=1) == n - 1) & ((smallest_top > s.q_cap) | (s.q_rest <= 0))
    scale = 1.0 - np.where(in_top, s.q, 0.0).sum(axis=1)
    scale = np.where(scale > 0, scale, 1.0)
    q2 = np.where(in_top, 1.0, s.q / scale[:, None])
    low, high = _overlap_bounds(
        s.p, q2, s.known_p, s.known_q, s.p_cap, s.q_cap / scale, s.p_rest, s.q_rest / scale, s.unlogged
    )
    low = np.where(sure, np.clip(low, 0, 1), 0.0)
    high = np.where(sure, np.clip(high, 0, 1), 1.0)
    return Interval(low, high, sure, sure)


def verifier_acceptance_interval(
    positions: TopKPositions, name: str, n: int, *, known: dict | None = None
) -> Interval:
    r"""Interval of a verifier's acceptance (:mod:`theory.verifiers`) over completions.

    * ``"greedy"``, ``"spechub"`` (``n = 2``): exact, :func:`_closed_form_interval` (each attains its law's
      optimum, Hu et al. ICLR 2025, arXiv:2502.18779).
    * ``"optimal"``: its acceptance is :math:`\alpha^*_{iid}`: :func:`theory.truncated.optimal_acceptance_interval`.
    * ``"rrs"``: :math:`[h_A(S_{n+1}),\, \min(h_+(S_{n+1}), \text{high}(\alpha^*_{iid}))]` (:func:`_rrs_bounds`);
      ``"rrs_wor"``: the first-rejection low (:func:`_rrs_wor_low`, at least RRS's low), high of
      :math:`\alpha^*_{wor}`; ``"kseq"``: its value on :math:`h_A` and on :math:`h_+` (:func:`_kseq_bounds`),
      the high capped by :math:`\alpha^*_{iid}`'s; each low also at least :math:`\sum\min(p, q)`'s low.
    * ``"nss"``: :func:`_nss_bounds`; ``"naive"``: :func:`_naive_low` to :math:`\alpha^*_{iid}`'s high.

    ``exact_low`` is set for rrs, kseq, nss and naive where the tails fit disjointly (the pessimistic
    completion attains the low end); every end is exact on complete rows. ``known`` may hold already computed
    intervals for these positions and this ``n`` under the keys ``"overlap"``, ``"iid"`` and ``"wor"``, to
    avoid computing them again.
    """
    name = as_choice(name, "name", TRUNCATED_QUANTITIES[3:])
    n = as_count(n, "n")
    s = positions
    known = {} if known is None else known

    def bound(quantity: str) -> Interval:
        if quantity not in known:
            known[quantity] = truncated_interval(s, quantity, n)
        return known[quantity]

    if name in ("greedy", "spechub"):
        if name == "spechub" and n != 2:
            raise ValueError(f"n must be 2 for the spechub verifier, got {n}")
        return _closed_form_interval(s, n)
    if name == "optimal":
        return bound("iid")
    if n == 1 and name in ("rrs", "naive", "kseq", "rrs_wor"):
        return bound("overlap")  # one draft: every one of them is speculative sampling
    fits = _needed(s.p_rest, s.p_cap) + _needed(s.q_rest, s.q_cap) <= s.unlogged
    exact_low = fits.copy()
    if name in ("rrs", "rrs_wor", "kseq"):
        curves = _Curves(s)
        lower, upper = (_kseq_bounds if name == "kseq" else _rrs_bounds)(curves, n)
        lower = np.maximum(lower, bound("overlap").low)
        if name == "rrs_wor":  # the i.i.d. RRS low plus the first rejection's gain; its high is alpha*_wor's
            lower = np.maximum(lower, _rrs_wor_low(curves, n, bound("overlap").low))
            upper = bound("wor").high.copy()
            exact_low[:] = False
        else:
            upper = np.minimum(upper, bound("iid").high)
    elif name == "nss":
        lower, upper = _nss_bounds(s, n)
        upper = np.minimum(upper, bound("iid").high)
    else:  # naive
        lower, upper = _naive_low(s, n), bound("iid").high.copy()
    complete = s.complete
    limit = verifier(name).max_exact_vocab(n)
    if limit is not None and s.p.shape[1] > limit:
        complete = np.zeros_like(complete)
    exact_high = complete.copy()
    if complete.any():
        exact = acceptance_by_draft_count(
            _dense(s, complete), _dense(s, complete, "q"), n, verifier(name).draft, verifier(name).acceptance
        )
        lower[complete] = upper[complete] = exact
        exact_low |= complete
    return Interval(lower, np.maximum(upper, lower), exact_low, exact_high)


def _dense(s: TopKPositions, rows: np.ndarray, side: str = "p") -> np.ndarray:
    """Complete rows as ``(r, m)`` vectors on their slots (their unlogged entries are all zero)."""
    values = s.p[rows] if side == "p" else s.q[rows]
    return values / values.sum(axis=1, keepdims=True)
