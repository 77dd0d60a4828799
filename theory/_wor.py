r"""Inclusion probabilities of successive sampling (draws without replacement) on every ratio-order prefix.

For a draft distribution ``q`` and a token set ``H`` with mass :math:`x = q(H)` and complement mass
:math:`s = 1 - x`, the probability that the first ``n`` successive draws all land in ``H`` is

.. math:: Q_n(H) = P(x_1, \dots, x_n \in H), \qquad
          P(\bar x) = \prod_{j=1}^{n} \frac{q(x_j)}{1 - \sum_{l<j} q(x_l)} .

The minimisation of :math:`p(H) - Q_n(H)` only needs ``Q_n`` on the prefixes ``H_k`` of one fixed token order
(Hu et al., "Towards Optimal Multi-draft Speculative Decoding", ICLR 2025, arXiv:2502.18779), so the functions
here take ``q`` already permuted into that order and return ``Q_n(H_k)`` for the requested prefixes ``k = 0..K``,
batched over the leading axis; :func:`wor_prefix_minimiser` evaluates only as many prefixes as it takes to find
the minimum of :math:`P_k - Q_n(H_k)`.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

#: Step of the trapezoid rule in ``u = ln t``. The integrand is analytic in the strip ``|Im u| < pi/2``, so the
#: discretisation error decays like ``exp(-2 pi d / h)`` for any ``d < pi/2`` (the constant grows as
#: ``d -> pi/2``). Measured against the exact ``n = 2`` formula at V = 50,000 and against enumeration
#: (n = 3..8): 3e-14 at h = 0.2, 4e-14 at h = 0.25, 8e-13 at h = 0.3, 3e-9 at h = 0.4 (so d ~ 1.3); but at
#: h = 0.25 the n = 8 values on LM-sized rows moved by 1.4e-12, so the step stays at 0.2.
QUADRATURE_STEP = 0.2
#: Mass of the integral dropped at each end of the ``t`` range.
TRUNCATION_ERROR = 1e-14
#: Smallest complement mass ``s`` that sets the upper end of the grid (``t_max = ln(1/eps) / s`` must stay
#: finite); prefixes with ``0 < s`` below it lose up to ``exp(-s t_max)`` of ``Q``. The grid then spans
#: ~3,500 points, but only the points where some prefix still has fewer than n sure tokens are integrated.
SMALLEST_COMPLEMENT = 1e-300
#: Largest clock value ``q_i t`` (over the grid points in use) of a token whose elementary symmetric sums are
#: taken from the moment series rather than from the recursion; it bounds ``w_i <= e^0.5 - 1``. Larger values
#: move tokens from the recursion to the series but need more terms (n = 8, LM-sized rows: 1.17 s at 0.1,
#: 0.60 s at 0.5, 0.58 s at 1.0 for 32 rows).
SMALL_CLOCK = 0.5
#: Relative truncation error allowed per token in the moment series of ``w_i^m``.
SERIES_TOLERANCE = 1e-17
#: Absolute error allowed in ``P(N_H(t) < n)`` where a Poisson "dust" component (see ``dust``) holds at least
#: :func:`_dust_sure_rate` expected points: there the integrand is taken as if ``n`` points had surely arrived.
DUST_NEGLIGIBLE = 1e-17
#: Prefixes evaluated per round of :func:`wor_prefix_minimiser`, and per block of :func:`wor_prefix_inclusion`.
PREFIX_BATCH = 64


def wor_prefix_inclusion_two(
    q_sorted: np.ndarray, suffix: np.ndarray, dust: np.ndarray | None = None
) -> np.ndarray:
    r"""Exact :math:`Q_2(H_k)` for every prefix, :math:`O(V)` per row.

    .. math:: Q_2(H) = \sum_{i \ne j \in H} q_i \frac{q_j}{1 - q_i} = x - s \sum_{i \in H} \frac{q_i}{1 - q_i}

    (sum the second draw over ``H \ {i}``: :math:`(x - q_i)/(1 - q_i) = 1 - s/(1 - q_i)`). With a Poisson
    "dust" of rate ``r`` inside every prefix (the limit of ``M`` tokens of mass ``r/M``, ``M -> oo``; a dust
    point depletes nothing, so the second draw follows it in ``H`` with probability ``x``) the sum gains ``r``:
    :math:`Q_2 = r x + \sum_i q_i (1 - s/(1 - q_i)) = x - s\,(r + \sum_{i \in H} q_i/(1 - q_i))`.

    Parameters
    ----------
    q_sorted : (B, V) draft probabilities in prefix order, each ``q_i < 1``, summing to 1 (with ``dust``).
    suffix : (B, V + 1) complement masses ``s_k = sum(q_sorted[:, k:])`` (suffix sums are accurate when small).
    dust : optional (B,) rate of the dust in every prefix (``x = r + q(H_k)``); None for no dust.

    Returns
    -------
    (B, V + 1) array, column ``k`` is :math:`Q_2(H_k)`, clipped to :math:`[0, x^2]` against round-off.
    """
    mass = np.concatenate([np.zeros_like(q_sorted[:, :1]), np.cumsum(q_sorted, axis=-1)], axis=-1)
    if dust is not None:
        mass += dust[:, None]
    # 1 - q_i as the mass of the other tokens (sums of positive terms): 1 - q_i itself cancels when q_i ~ 1.
    others = mass[:, :-1] + suffix[:, 1:]
    # Only a row's largest q can have a complement so small that q / (1 - q) overflows (every other token's
    # complement holds the largest q): its term enters as q * (s / (1 - q)), and s <= 1 - q on the prefixes
    # that hold it. Without this, q = (1, 1e-310, 1e-311) gave inf * 0 = NaN and an optimum of 1.
    rows = np.arange(q_sorted.shape[0])
    top = np.argmax(q_sorted, axis=-1)
    top_q, top_others = q_sorted[rows, top], others[rows, top]
    elsewhere = q_sorted > 0
    elsewhere[rows, top] = False
    terms = np.divide(q_sorted, others, out=np.zeros_like(q_sorted), where=elsewhere)
    odds = np.zeros_like(mass)
    np.cumsum(terms, axis=-1, out=odds[:, 1:])
    if dust is not None:
        odds += dust[:, None]
    inclusion = mass - suffix * odds
    holds_top = (np.arange(mass.shape[1])[None, :] > top[:, None]) & (top_others[:, None] > 0)
    share = np.divide(suffix, top_others[:, None], out=np.zeros_like(suffix), where=holds_top)
    inclusion -= top_q[:, None] * share
    return np.clip(inclusion, 0.0, mass * mass)


def wor_prefix_inclusion(
    q_sorted: np.ndarray,
    suffix: np.ndarray,
    n: int,
    prefixes: np.ndarray | None = None,
    dust: np.ndarray | None = None,
) -> np.ndarray:
    r""":math:`Q_n(H_k)` on the requested prefixes ``k``, any ``n >= 2``, by an exponential-clock quadrature.

    Successive sampling is the arrival order of independent exponential clocks :math:`E_i \sim
    \mathrm{Exp}(q_i)`; the complement ``G`` rings first at rate ``s``. Hence

    .. math:: Q_n(H) = P(T^H_n < E_G) = \int_0^\infty s e^{-s t}\, P(N_H(t) \ge n)\, dt
              = \int_{-\infty}^{\infty} s t e^{-s t} \left(1 - e^{-\lambda} \sum_{j<n} e_j(w)\right) du,

    with :math:`t = e^u`, :math:`N_H(t)` the Poisson-binomial count of clocks of ``H`` rung by ``t``,
    :math:`w_i = e^{q_i t} - 1`, :math:`\lambda = t\,q(H)` and :math:`e_j` the elementary symmetric sums, the
    coefficients of :math:`\prod_{i \in H} (1 + w_i z)`. That product is split in two exact factors:

    * tokens with :math:`q_i t > 0.5` somewhere on the grid in use (a few hundred to a few thousand): the
      prefix recursion :math:`e_j(H_k) = \sum_{i \le k} w_i\, e_{j-1}(H_{i-1})`, cumulative sums of positive
      terms, one pass per ``j``;
    * all other tokens, through their power sums :math:`p_m = \sum_i w_i^m`, ``m < n``, from the moment series
      :math:`w^m = (e^a - 1)^m = \sum_{r \ge m} c_{m r} a^r` (:math:`c_{mr} = m!\,S(r, m)/r!`, ``S`` the
      Stirling numbers of the second kind), so that :math:`p_m = \sum_r c_{mr} t^r \sum_i q_i^r` needs one
      prefix sum of :math:`q^r` per ``r`` and no work per token and grid point; then Newton's identities give
      :math:`e_j`. Truncation after ``R`` terms: :math:`m!\,S(r, m) \le m^r`, so the relative error of each
      :math:`w_i^m` is at most :math:`m^{R+1} c^{R+1-m} e^{mc}/(R+1)!` for :math:`a \le c` (``R`` is chosen to
      make it :data:`SERIES_TOLERANCE`). Newton's identities alternate in sign, but with
      :math:`w_i \le e^{0.5} - 1` the rounding error, times :math:`e^{-\lambda}`, stays at ~2e-16 even in
      the worst case of many equal tokens at the largest clock (checked for ``n = 8`` and 1..200 tokens).

    A token with :math:`q_i t` above :math:`\theta` (36 for ``n <= 8``) counts as surely rung, which keeps
    :math:`e_j` finite and costs at most :math:`e^{-\theta}` per token: with ``c`` sure tokens in ``H``,
    :math:`P(N_H(t) < n) = e^{-\lambda'} \sum_{j < n - c} e_j(w')` over the others, and it is 0 once
    ``c >= n``. Grid points beyond that for every requested prefix, or beyond :math:`s t = \ln(1/\epsilon)`,
    are left out of both factors (their ``P(N < n)`` is 0, or their weight below :math:`\epsilon`).

    Error analysis. The trapezoid rule in ``u`` with step :data:`QUADRATURE_STEP` on this integrand (analytic
    and bounded in the strip :math:`|\mathrm{Im}\, u| < \pi/2`, decaying like :math:`e^{(n+1)u}` as
    :math:`u \to -\infty` and doubly exponentially as :math:`u \to \infty`) has a discretisation error
    :math:`O(e^{-2\pi d/h})`. The range is cut where the dropped mass is below :data:`TRUNCATION_ERROR`:
    below :math:`t_{lo} = ((n+1)!\,\epsilon)^{1/(n+1)}` since :math:`P(N_H(t) \ge n) \le (xt)^n/n!`, and
    above :math:`t_{hi} = \ln(1/\epsilon)/s_{min}` since the tail is :math:`e^{-s t_{hi}}`; each row gets
    its own grid, from the smallest ``s`` among its requested prefixes. Measured against exact enumeration,
    the exact ``n = 2`` formula and the exact ``O(V^2)`` ``n = 3`` formula the error is below 1e-13 (tests).

    Poisson dust. With ``dust`` (rate ``r`` per row), every prefix also holds a Poisson process of rate ``r``
    (the limit of ``M`` tokens of ``r/M`` each): :math:`N_H(t)` gains an independent Poisson(:math:`rt`) count,
    whose generating function :math:`e^{-rt} e^{rtz}` multiplies the product above, i.e. :math:`\lambda` and the
    first power sum :math:`p_1` both gain :math:`rt` exactly (the higher power sums of ``M`` tokens of
    ``r/M`` vanish as ``M -> oo``). Where :math:`rt` exceeds :func:`_dust_sure_rate` the Poisson count alone is
    below ``n`` with probability at most :data:`DUST_NEGLIGIBLE`, and the integrand is taken with
    :math:`P(N_H(t) < n) = 0` there. Prefixes with fewer than ``n`` tokens then need the quadrature too
    (:math:`Q_n(H_0) = r^n`).

    Parameters
    ----------
    q_sorted : (B, K) draft probabilities in prefix order (the tokens to the right of ``K`` only matter
        through ``suffix``).
    suffix : (B, K + 1) complement masses ``s_k`` of every prefix ``k = 0..K``.
    n : number of drafts, ``>= 2``.
    prefixes : optional (B, K + 1) bool mask of the prefixes whose value is needed (others are returned as
        NaN); the grid then only covers their ``s`` range.
    dust : optional (B,) dust rate ``r >= 0`` of each row (None: no dust).

    Returns
    -------
    (B, K + 1) array of :math:`Q_n(H_k)`; ``1`` where ``s_k = 0`` and ``0`` for ``k < n`` without dust.
    """
    if prefixes is None:
        prefixes = np.ones(suffix.shape, dtype=bool)
    dust = np.zeros(len(suffix)) if dust is None else np.asarray(dust, dtype=np.float64)
    inclusion = np.full(suffix.shape, np.nan)
    for row, (q_row, suffix_row, wanted) in enumerate(zip(q_sorted, suffix, prefixes, strict=True)):
        reads = _fill_trivial_prefixes(inclusion[row], suffix_row, n, wanted, dust[row] > 0)
        if reads.size:
            evaluate = _PrefixInclusion(q_row, suffix_row, n, reads, float(dust[row]))
            for start in range(0, reads.size, PREFIX_BATCH):
                block = reads[start : start + PREFIX_BATCH]
                inclusion[row, block] = evaluate(block)
    return inclusion


def wor_prefix_minimiser(
    target_mass: np.ndarray,
    q_sorted: np.ndarray,
    suffix: np.ndarray,
    n: int,
    candidates: np.ndarray,
    inclusion_bound: np.ndarray,
    dust: np.ndarray | None = None,
) -> np.ndarray:
    r""":math:`Q_n(H_k)` on enough of the ``candidates`` prefixes to contain a minimiser of :math:`P_k - Q_n(H_k)`.

    Batched over rows (a 1-D input is one row). The trivial prefixes (:math:`Q = 0` below ``n`` tokens,
    :math:`Q = 1` at ``s = 0``) are filled for every row at once. Rows with at most :data:`PREFIX_BATCH`
    prefixes that need the quadrature are settled by one round, which evaluates them all: those rows are
    evaluated together (:func:`theory._wor_rows.evaluate_rows`); the others enter the branch and bound row by
    row. Each row keeps its own grid, so its values do not depend on the other rows of the batch.

    Branch and bound on one row. :math:`Q_n(H_k)` grows with ``k``, so for a prefix ``k`` between evaluated
    prefixes, :math:`P_k - Q_n(H_k) \ge P_k - \min(Q_n(H_b), \bar Q_k)`, ``b`` the next evaluated prefix and
    :math:`\bar Q_k` = ``inclusion_bound`` (any upper bound on :math:`Q_n(H_k)`). Prefixes whose bound is not
    below the best evaluated value are dropped; the others are evaluated in rounds of :data:`PREFIX_BATCH`
    spread evenly over them (plus the one with the smallest bound), until none is left. The minimum over the
    evaluated prefixes is then the minimum over all candidates, up to the quadrature error of the bounds.

    Parameters
    ----------
    target_mass : (B, K + 1) or (K + 1,) :math:`P_k`.
    q_sorted, suffix : (B, K), (B, K + 1) as in :func:`wor_prefix_inclusion` (or one row of each).
    n : number of drafts, ``>= 2``.
    candidates : (B, K + 1) bool, the prefixes that may be minimisers.
    inclusion_bound : (B, K + 1) upper bounds on :math:`Q_n(H_k)`.
    dust : optional (B,) (or scalar for one row) Poisson dust rate in every prefix, as in
        :func:`wor_prefix_inclusion` (None: no dust).

    Returns
    -------
    (B, K + 1) (or (K + 1,)) array of :math:`Q_n(H_k)` on the evaluated prefixes, NaN elsewhere.
    """
    if np.ndim(suffix) == 1:
        return wor_prefix_minimiser(
            *(np.asarray(x)[None] for x in (target_mass, q_sorted, suffix)),
            n,
            np.asarray(candidates)[None],
            np.asarray(inclusion_bound)[None],
            None if dust is None else np.asarray(dust, dtype=np.float64).reshape(1),
        )[0]
    dust = np.zeros(len(suffix)) if dust is None else np.asarray(dust, dtype=np.float64)
    dusty = dust > 0
    inclusion = np.full(suffix.shape, np.nan)
    inclusion[candidates & (suffix <= 0)] = 1.0
    head = inclusion[:, :n]  # a view
    head[candidates[:, :n] & ~dusty[:, None]] = 0.0  # with dust, Q > 0 below n tokens
    needed = candidates & (suffix > 0)
    needed[~dusty, :n] = False
    # Rows with at most PREFIX_BATCH reads are settled by the first round, which evaluates them all: together.
    few = np.count_nonzero(needed, axis=1) <= PREFIX_BATCH
    evaluate_rows(inclusion, needed & few[:, None], q_sorted, suffix, n, dust)
    for row in np.flatnonzero(needed.any(axis=1) & ~few):
        _branch_and_bound(
            inclusion[row],
            np.flatnonzero(needed[row]),
            target_mass[row],
            q_sorted[row],
            suffix[row],
            n,
            inclusion_bound[row],
            float(dust[row]),
        )
    return inclusion


from theory._wor_rows import evaluate_rows  # noqa: E402  (it reads this module's helpers)


def _branch_and_bound(inclusion, reads, target_mass, q_sorted, suffix, n, inclusion_bound, dust) -> None:
    """Fill ``inclusion`` (one row, trivial prefixes already set) on the ``reads`` it takes to find the minimum."""
    evaluate = _PrefixInclusion(q_sorted, suffix, n, reads, dust)
    evaluated = np.zeros(reads.size, dtype=bool)
    undecided = np.ones(reads.size, dtype=bool)  # neither evaluated nor ruled out
    # The last read is evaluated first, so every open read has an evaluated one after it.
    chosen = np.unique(np.r_[np.linspace(0, reads.size - 1, PREFIX_BATCH).astype(np.int64), reads.size - 1])
    while True:
        inclusion[reads[chosen]] = evaluate(reads[chosen])
        evaluated[chosen], undecided[chosen] = True, False
        best = np.nanmin(target_mass - inclusion)
        left = np.flatnonzero(undecided)
        done = reads[evaluated]
        following = done[np.searchsorted(done, reads[left])]
        bound = target_mass[reads[left]] - np.minimum(inclusion_bound[reads[left]], inclusion[following])
        # Ruled out for good: best only decreases and the bound only grows as evaluations get closer.
        undecided[left[bound >= best]] = False
        left, bound = left[bound < best], bound[bound < best]
        if left.size == 0:
            return
        spread = left[np.linspace(0, left.size - 1, min(PREFIX_BATCH, left.size)).astype(np.int64)]
        chosen = np.unique(np.r_[spread, left[np.argmin(bound)]])


def _fill_trivial_prefixes(
    inclusion: np.ndarray, suffix: np.ndarray, n: int, wanted: np.ndarray, dusty: bool = False
) -> np.ndarray:
    """Set ``Q = 0`` (fewer than ``n`` tokens, no dust) and ``Q = 1`` (``s = 0``) on the wanted prefixes of one row.

    Returns the other wanted prefixes (sorted), which need the quadrature.
    """
    inclusion[wanted & (suffix <= 0)] = 1.0
    needed = wanted & (suffix > 0)
    if not dusty:
        inclusion[:n][wanted[:n]] = 0.0
        needed[:n] = False
    return np.flatnonzero(needed)


def _sure_threshold(n: int, tokens: int) -> float:
    """``q t`` above which a token counts as surely drawn by time ``t`` (error ``exp(-threshold)``).

    Capped so that the elementary symmetric sums ``e_j``, ``j < n``, of ``w = expm1(q t)`` stay below 1e300:
    ``e_j <= (tokens * e**threshold)**j``.
    """
    return min(36.0, 690.0 / max(n - 1, 1) - math.log(max(tokens, 1)))


@cache
def _dust_sure_rate(n: int) -> float:
    r"""Smallest rate ``mu`` (in steps of 1/8) with :math:`P(\mathrm{Poisson}(\mu) < n) \le` :data:`DUST_NEGLIGIBLE`.

    The probability decreases in ``mu``, so it stays below the tolerance for every larger ``mu``.
    """
    rate = float(n)
    while math.exp(-rate) * sum(rate**j / math.factorial(j) for j in range(n)) > DUST_NEGLIGIBLE:
        rate += 0.125
    return rate


def _log_grid(n: int, smallest_complement: float) -> tuple[np.ndarray, np.ndarray]:
    """Points ``t_m`` and trapezoid weights in ``u = ln t`` (step <= :data:`QUADRATURE_STEP`) of one row."""
    u_low = math.log((math.factorial(n + 1) * TRUNCATION_ERROR) ** (1.0 / (n + 1)))
    u_high = math.log(math.log(1.0 / TRUNCATION_ERROR) / max(smallest_complement, SMALLEST_COMPLEMENT))
    points = math.ceil((u_high - u_low) / QUADRATURE_STEP) + 1
    step = (u_high - u_low) / (points - 1)
    weights = np.full(points, step)
    weights[[0, -1]] *= 0.5
    return np.exp(u_low + step * np.arange(points)), weights


@cache
def _series_coefficients(n: int) -> np.ndarray:
    r"""``c[m, r]``, the coefficient of ``a^r`` in ``(e^a - 1)^m`` for ``m < n``, ``r <= R`` (positive terms).

    ``R`` is the smallest order with :math:`(n-1)^{R+1} c^{R+2-n} e^{(n-1)c}/(R+1)! \le` the tolerance,
    ``c`` = :data:`SMALL_CLOCK`: the relative truncation error of every :math:`w^m`, ``m < n``.
    """
    top = max(n - 1, 1)
    order = top
    while (
        top ** (order + 1)
        * SMALL_CLOCK ** (order + 1 - top)
        * math.exp(top * SMALL_CLOCK)
        / math.factorial(order + 1)
        > SERIES_TOLERANCE
    ):
        order += 1
    first = np.array([0.0] + [1.0 / math.factorial(r) for r in range(1, order + 1)])  # e^a - 1
    coefficients = np.zeros((n, order + 1))
    coefficients[0, 0] = 1.0
    for m in range(1, n):
        coefficients[m] = np.convolve(coefficients[m - 1], first)[: order + 1]
    coefficients.flags.writeable = False  # cached and shared
    return coefficients


class _PrefixInclusion:
    r""":math:`Q_n(H_k)` of one row at any of the prefixes ``reads`` (see :func:`wor_prefix_inclusion`).

    The grid, the split of the tokens and the recursion over the large-clock tokens are set up once, for all of
    ``reads``; each call then costs :math:`O(\text{grid} \cdot n \cdot R)` per requested prefix.
    """

    def __init__(self, q: np.ndarray, suffix: np.ndarray, n: int, reads: np.ndarray, dust: float = 0.0):
        self.suffix, self.n, self.dust = suffix, n, dust
        self.grid, self.weights = _log_grid(n, float(suffix[reads].min()))
        threshold = _sure_threshold(n, q.size)
        q = q[: int(reads[-1])]

        # Grid points where some read prefix has fewer than n sure tokens and s t <= ln(1/eps): a leading block.
        # Beyond theta / (n-th largest q before the first read) every read has n sure tokens.
        first = int(reads[0])
        if first >= n:
            nth_largest = np.partition(q[:first], first - n)[first - n]
            usable = int(
                np.searchsorted(self.grid * nth_largest, threshold, "right")
            )  # t <= theta / nth_largest
        else:  # only with dust: a read with fewer than n tokens never has n sure ones
            usable = self.grid.size
        capable = np.flatnonzero(q * self.grid[max(usable - 1, 0)] > threshold)
        sure_by_then = np.cumsum(q[capable, None] * self.grid[:usable] > threshold, axis=0)  # (S, M)
        nth_sure = np.full(self.grid.size, q.size)
        if capable.size:
            reaches = sure_by_then[-1] >= n
            nth_sure[:usable][reaches] = capable[np.argmax(sure_by_then[:, reaches] >= n, axis=0)]
        nth_sure[usable:] = -1
        latest = np.searchsorted(reads, nth_sure, side="right") - 1  # the largest read k <= n-th sure, or -1
        smallest_complement = suffix[reads[np.maximum(latest, 0)]]
        alive = (latest >= 0) & (smallest_complement * self.grid <= math.log(1.0 / TRUNCATION_ERROR))
        if dust > 0:  # beyond, the dust alone has n points but for DUST_NEGLIGIBLE
            alive &= dust * self.grid <= _dust_sure_rate(n)
        self.points = int(np.flatnonzero(alive)[-1]) + 1 if alive.any() else 0
        t = self.grid[: self.points]

        # Large-clock tokens: prefix recursion, states after each of them, (J + 1, n, M').
        scale = t[-1] if self.points else 1.0
        large = q * scale > SMALL_CLOCK
        self.large_positions = np.flatnonzero(large)
        clock = q[large, None] * t  # (J, M')
        sure = clock > threshold
        with np.errstate(over="ignore"):
            spread = np.expm1(clock)
        spread[sure] = 0.0
        states = np.zeros((self.large_positions.size + 1, n, self.points))
        states[:, 0] = 1.0
        for j in range(1, n):
            np.cumsum(spread * states[:-1, j - 1], axis=0, out=states[1:, j])
        self.states = states
        self.sure_count = np.zeros((self.large_positions.size + 1, self.points), dtype=np.int64)
        np.cumsum(sure, axis=0, out=self.sure_count[1:])
        # q mass of the large-clock tokens that are not sure at each grid point
        self.unsure_mass = np.zeros((self.large_positions.size + 1, self.points))
        np.cumsum(np.where(sure, 0.0, q[large, None]), axis=0, out=self.unsure_mass[1:])

        # Small-clock tokens: prefix sums of (q scale)^r <= SMALL_CLOCK^r, r = 1..R, and the series in t/scale.
        coefficients = _series_coefficients(n)
        orders = coefficients.shape[1] - 1
        small = np.where(large, 0.0, q) * scale
        powers = np.empty((orders, q.size))
        powers[0] = small
        for r in range(1, orders):
            np.multiply(powers[r - 1], small, out=powers[r])
        self.moments = np.zeros((orders, q.size + 1))
        np.cumsum(powers, axis=1, out=self.moments[:, 1:])
        self.scale = scale
        ratio_powers = (t / scale)[None, :] ** np.arange(1, orders + 1)[:, None]  # (R, M')
        # (n - 1, R, M'): the power sum p_m at the prefixes is moments^T @ series[m - 1]
        self.series = coefficients[1:, 1:, None] * ratio_powers

    def __call__(self, prefixes: np.ndarray) -> np.ndarray:
        n, t = self.n, self.grid[: self.points]
        below = np.zeros((prefixes.size, self.grid.size))
        if self.points:
            # number of large-clock tokens before each prefix end
            index = np.searchsorted(self.large_positions, prefixes)
            moments = self.moments[:, prefixes].T  # (b, R)
            power_sums = [moments @ self.series[m] for m in range(n - 1)]  # p_1..p_{n-1}, (b, M')
            if self.dust > 0:  # the Poisson dust: p_1 gains r t, higher power sums nothing
                power_sums[0] = power_sums[0] + self.dust * t
            # Newton's identities: j e_j = sum_{i=1..j} (-1)^(i-1) e_{j-i} p_i, for the small-clock tokens.
            small_sums = [np.ones_like(power_sums[0])]
            for j in range(1, n):
                total = sum((-1) ** (i - 1) * small_sums[j - i] * power_sums[i - 1] for i in range(1, j + 1))
                small_sums.append(total / j)
            large_sums = self.states[index]  # (b, n, M')
            count = self.sure_count[index]
            # lambda of the non-sure tokens: the small-clock mass is the first moment
            rate = t * (moments[:, :1] / self.scale + self.unsure_mass[index])
            if self.dust > 0:
                rate = rate + self.dust * t
            probability = np.zeros_like(rate)
            for j in range(n):
                coefficient = sum(large_sums[:, i] * small_sums[j - i] for i in range(j + 1))
                probability += np.where(count + j < n, coefficient, 0.0)  # e_j enters P(N < n) iff j + c < n
            below[:, : self.points] = np.exp(-rate) * probability
        s = self.suffix[prefixes, None]
        integrand = self.weights * s * self.grid * np.exp(-s * self.grid) * (1.0 - below)
        return integrand.sum(axis=1)
