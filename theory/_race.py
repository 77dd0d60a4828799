r"""The exponential race among i.i.d. drafts of one priority class: its selection marginal and its weights.

``n`` drafts are drawn i.i.d. from ``q``. A *class* ``C`` is a set of tokens split into *units* ``u`` (groups of
tokens sharing one weight :math:`w_u = e^{\lambda_u}`) with draft masses :math:`Q_u`; drafts in lower classes
have total mass ``x`` and drafts in higher classes pre-empt ``C``. When ``C`` is the highest class among the
drafts, each draft of ``C`` starts an :math:`\mathrm{Exp}(w)` clock and the first to ring is selected. Since the
drafts are independent, the probability that the selected draft lies in unit ``u`` is the one-dimensional
integral (reference note ``optimal_verifier.md``, section 4)

.. math:: r_u = n\, Q_u w_u \int_0^\infty e^{-t w_u}\, \varphi(t)^{n-1}\, dt, \qquad
          \varphi(t) = x + \sum_v Q_v e^{-t w_v},

with :math:`\sum_u r_u = (x + Q_C)^n - x^n` (differentiate :math:`\varphi^n`). For ``n = 2`` it is the
Bradley--Terry sum :math:`r_u = 2 Q_u [x + \sum_v Q_v\, w_u / (w_u + w_v)]`, used here in closed form. For
``n >= 3`` the integral is a trapezoid rule in :math:`s = \ln t` with step :data:`STEP` on the window where
some unit has :math:`w t \in [e^{-15}, e^{4}]`: the integrand :math:`n Q_u (w_u t) e^{-w_u t} \varphi^{n-1}`
is analytic in the strip :math:`|\mathrm{Im}\, s| < \pi/2` and decays exponentially at both ends, so the rule
converges like :math:`e^{-2\pi d/h}` (measured relative error below 1e-15 against the ``n = 2`` closed form and
a step-1/16 rule, tests; the node sums are pairwise). The lattice below the window is summed in closed form to
second order in ``t`` (:func:`_lower_tail`, error below :math:`n^2 e^{-45}` of :math:`n Q_u (x + Q_C)^{n-1}`),
and the upper end drops less than 1e-21 relative. Log-weights may spread past float64's exponent range (a
unit pushed towards a zero target): there the clocks are formed in log space (:func:`_clocks`), and the fit
keeps every log-weight within :data:`FLOOR` of the largest, where a unit's marginal is already its least.

The weights are the minimiser of the convex function :math:`\Psi(\lambda) = E[\log \sum_{i \in C} w(X_i);
C \text{ on top}] - \sum_u r^*_u \lambda_u`, whose gradient is :math:`r(\lambda) - r^*`; :func:`fit_log_weights`
runs damped Newton steps with the exact Hessian

.. math:: \partial r_u / \partial \lambda_v = \delta_{uv}\, n Q_u \int w_u e^{-t w_u}(1 - t w_u) \varphi^{n-1}
          dt - n(n-1) Q_u Q_v \int (w_u t e^{-t w_u})(w_v t e^{-t w_v}) \varphi^{n-2} \frac{dt}{t}.

Only acceptance depends on how well the weights fit; the verifier stays lossless whatever they are, because it
uses the marginal of the *final* weights.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from theory import _native

#: Trapezoid step in ``s = ln t``.
STEP = 0.25
#: Window of the clock values ``w t``: from ``exp(LOW)`` for the largest weight to ``exp(HIGH)`` for the smallest.
LOW, HIGH = -42.0, 4.0
#: Lower end of the marginal's nodes: the lattice below it is summed in closed form to second order in ``t``
#: (:func:`_lower_tail`; the third-order remainder is below ``n**2 exp(3 TAIL_LOW)`` ~ 3e-20 n**2 of r_u's scale).
TAIL_LOW = -15.0
#: Largest log-node (``t = e^WIDE``) at which the clocks are formed as products ``w t`` (:func:`_clocks`):
#: below ``ln(max float) = 709.78`` and, with the largest weight 1, every weight ``>= e^(HIGH - WIDE)`` is normal.
WIDE = 700.0
#: The fit keeps every log-weight within ``FLOOR`` of the largest (window top ``HIGH + FLOOR + STEP <= WIDE``):
#: a unit ``e^-690`` behind another loses to it but for ``1e-300`` of the time, so a unit pushed towards a zero
#: target has reached its least marginal in float64 there.
FLOOR = 690.0
#: Cap of the log-clock in wide windows: ``exp(-exp(DEAD)) = exp(-1096.6)`` is 0 in float64, as is every
#: survival factor beyond it.
DEAD = 7.0
#: Newton stops when ``sum |r - r*|`` is below this (absolute), or when a step no longer halves it.
TOLERANCE = 1e-14
#: Newton iterations at most, backtracking halvings per iteration at most, and the largest step in ``lambda``.
MAX_ITERATIONS, MAX_HALVINGS, MAX_STEP = 60, 12, 8.0
#: The constants :func:`fit_log_weights` hands to the native fit (:mod:`theory._native`).
NATIVE_CONSTANTS = {
    "STEP": STEP,
    "LOW": LOW,
    "HIGH": HIGH,
    "TAIL_LOW": TAIL_LOW,
    "WIDE": WIDE,
    "FLOOR": FLOOR,
    "MAX_STEP": MAX_STEP,
    "TOLERANCE": TOLERANCE,
    "MAX_ITERATIONS": MAX_ITERATIONS,
    "MAX_HALVINGS": MAX_HALVINGS,
}


_BLAS = None
_BLAS_LOCK = threading.Lock()
_BLAS_USERS = 0  # builds inside single_threaded_blas right now, in any thread
_BLAS_LIMITER = None  # the limit they share; it restores the original thread counts when the last one leaves


@contextlib.contextmanager
def single_threaded_blas():
    """Context holding the loaded BLAS libraries to one thread (``threadpoolctl``; a no-op without it).

    The race's matrices are small (units × quadrature nodes, ~100 × 250): OpenBLAS's own threads never pay
    there, and on a loaded machine their hand-offs cost more than the products (a V = 151936, n = 4 build took
    371 ms of CPU with two BLAS threads and 8 ms with one). The controller is made once, on first use.

    BLAS thread counts are process-wide, so concurrent builds share one limit, counted: the first to enter
    sets it and the last to leave restores the original counts. (Each holding its own limit, one build's exit
    restored two threads under another still running, and the last exit left the process at one thread.)
    OpenBLAS 0.3.30 can ignore a count set from a thread other than the main one, so builds in worker
    threads may still use its threads; their tables then differ from the main thread's by round-off
    (1.6e-15 measured in the log-weights), never in losslessness.
    """
    global _BLAS, _BLAS_USERS, _BLAS_LIMITER
    with _BLAS_LOCK:
        if _BLAS is None:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:  # pragma: no cover - a declared dependency
                _BLAS = False
            else:
                _BLAS = ThreadpoolController().select(user_api="blas")
        if _BLAS:
            if _BLAS_USERS == 0:
                _BLAS_LIMITER = _BLAS.limit(limits=1)
            _BLAS_USERS += 1
    try:
        yield
    finally:
        if _BLAS:
            with _BLAS_LOCK:
                _BLAS_USERS -= 1
                if _BLAS_USERS == 0:
                    _BLAS_LIMITER.restore_original_limits()
                    _BLAS_LIMITER = None


def _log_nodes(log_weights: np.ndarray, step: float = STEP, low: float = LOW) -> np.ndarray:
    """Quadrature nodes ``s = ln t`` (spaced by ``step``) covering the window of every weight (from ``low``)."""
    low = low - log_weights.max()
    high = HIGH - log_weights.min()
    # low + step * k, not np.arange(low, high, step): arange steps by (low + step) - low, which for low ~ -50
    # is step + 3e-15 and biases every integral by 1.4e-14.
    return low + step * np.arange(int(np.ceil((high - low) / step)) + 1)


def _nodes(log_weights: np.ndarray, step: float = STEP, low: float = LOW) -> np.ndarray:
    """Quadrature nodes ``t`` of :func:`_log_nodes` (log-weights spread less than :data:`WIDE`)."""
    return np.exp(_log_nodes(log_weights, step, low))


def _clocks(log_weights: np.ndarray, log_nodes: np.ndarray) -> np.ndarray:
    r"""(U, K) clock values :math:`w_u t_k`, for log-weights whose largest is 0.

    Up to :data:`WIDE` every ``t`` and every weight is a normal float and the clocks are the products. Wider
    log-weights (a unit pushed towards a zero target) would overflow ``t`` and underflow ``w``; there the
    clocks are :math:`e^{\lambda_u + s_k}` capped at :math:`e^{\mathrm{DEAD}}`, where :math:`e^{-w t}` is already
    0 in float64: the cap changes no survival factor and keeps :math:`w t e^{-w t}` at 0 (never ``inf * 0``).
    """
    if log_nodes[-1] <= WIDE:
        return np.exp(log_weights)[:, None] * np.exp(log_nodes)[None, :]
    return np.exp(np.minimum(log_weights[:, None] + log_nodes[None, :], DEAD))


def race_marginal(
    lower: float,
    masses: np.ndarray,
    log_weights: np.ndarray,
    n: int,
    jacobian: bool = False,
    step: float = STEP,
):
    r"""Selection marginal :math:`r_u` of the race (and, if asked, :math:`\partial r / \partial \lambda`).

    Parameters
    ----------
    lower : mass ``x`` of the lower classes.
    masses : (U,) draft masses :math:`Q_u > 0` of the units.
    log_weights : (U,) :math:`\lambda_u` (finite).
    n : drafts, ``>= 2``.
    jacobian : also return the (U, U) matrix :math:`\partial r_u / \partial \lambda_v`.
    step : trapezoid step in ``ln t`` (:data:`STEP`: relative error below 1e-15).
    """
    if n == 2:
        return _bradley_terry(lower, masses, log_weights, jacobian)
    log_weights = log_weights - log_weights.max()  # r depends on the differences only
    log_nodes = _log_nodes(log_weights, step, TAIL_LOW)
    weights = np.exp(log_weights)
    # (U, K) layout: the sums over the K nodes run along the contiguous axis, where numpy sums pairwise
    # (a strided sum over ~500 nodes accumulates ~1e-14 of round-off).
    # The (U, K) temporaries are formed in place where the operands are not needed again (the same operations
    # in the same order: bitwise the values of the out-of-place forms, three fewer (U, K) arrays per evaluation).
    clock = _clocks(log_weights, log_nodes)  # w_u t
    survive = np.negative(clock)
    np.exp(survive, out=survive)
    phi = lower + masses @ survive  # (K,)
    density = np.multiply(clock, survive, out=survive)  # w t e^{-w t}
    power = phi ** (n - 2)
    weighted = density * (power * phi)[None, :]
    tail, first = _lower_tail(
        lower + masses.sum(), float(masses @ weights), weights, float(np.exp(log_nodes[0])), n, step
    )
    r = n * masses * (step * weighted.sum(axis=1) + tail)
    if not jacobian:
        return r
    slope = np.subtract(1.0, clock, out=clock)
    slope *= weighted
    diagonal = n * masses * (step * slope.sum(axis=1) + first)
    scaled = np.multiply(density, masses[:, None], out=density)
    cross = (n * (n - 1) * step) * ((scaled * power[None, :]) @ scaled.T)
    return r, np.diag(diagonal) - cross


def _lower_tail(total: float, weighted: float, weights: np.ndarray, start: float, n: int, step: float):
    r"""The trapezoid lattice below the first node ``start`` = :math:`t_0`, summed in closed form.

    For small ``t`` the integrand of :math:`r_u / (n Q_u)` in :math:`s = \ln t` is :math:`w_u t e^{-w_u t}
    \varphi(t)^{n-1} = w_u \Phi^{n-1} t - w_u (w_u \Phi^{n-1} + (n-1) \Phi^{n-2} S) t^2 + O(t^3)` with
    :math:`\Phi = x + Q_C` and :math:`S = \sum_v Q_v w_v`, and the nodes below are :math:`t_0 e^{-jh}`,
    :math:`j \ge 1`, so :math:`\sum_j t_j^m = t_0^m / (e^{mh} - 1)`. Returns ``h`` times the two-term sum per
    unit, and its first term alone (the tail of :math:`\partial r_u / \partial \lambda_u` to first order, enough
    for the Newton matrix). The dropped third-order terms are below :math:`n^2 (w_{max} t_0)^3` of
    :math:`\Phi^{n-1}`, ~1e-18 for ``n = 8`` at :data:`TAIL_LOW`. ``total`` = :math:`\Phi` and ``weighted`` =
    :math:`S` are the class's sums; ``weights`` those of the units wanted (all of them, or a chunk).
    """
    power = total ** (n - 2)
    linear = step * start / np.expm1(step) * (power * total) * weights
    drift = weights * (power * total) + (n - 1) * power * weighted
    quadratic = step * start * start / np.expm1(2.0 * step) * weights * drift
    return linear - quadratic, linear


def _bradley_terry(lower, masses, log_weights, jacobian):
    r"""``n = 2``: :math:`r_u = 2 Q_u [x + \sum_v Q_v \sigma(\lambda_u - \lambda_v)]`, exact."""
    # sigma(d) = 1 / (1 + e^{-d}) from the difference d itself: w_u / (w_u + w_v) with w = e^{lambda - max}
    # carries the rounding of lambda - max (relative |lambda - max| eps in each weight, 1.5e-14 at a spread of
    # 560) into a pair whose own d is small; e^{-d} = inf gives 0 at any spread.
    win = np.subtract(log_weights[None, :], log_weights[:, None])
    with np.errstate(over="ignore"):
        np.exp(win, out=win)
    win += 1.0
    np.reciprocal(win, out=win)
    r = 2.0 * masses * (lower + win @ masses)
    if not jacobian:
        return r
    slope = win * win.T  # sigma(d) sigma(-d)
    cross = 2.0 * masses[:, None] * masses[None, :] * slope
    np.fill_diagonal(cross, 0.0)
    return r, np.diag(cross.sum(axis=1)) - cross


def race_potential(
    lower: float, masses: np.ndarray, log_weights: np.ndarray, n: int, step: float = STEP
) -> float:
    r""":math:`E[\log \sum_{i \in C} w(X_i);\ C \text{ on top}]`, whose gradient in :math:`\lambda` is ``r``.

    Frullani form :math:`\int_0^\infty [R e^{-t} - (\varphi(t)^n - x^n)]\, dt/t` with
    :math:`R = (x + Q_C)^n - x^n` (``n = 2``: :math:`\sum_{u,v} Q_u Q_v \log(w_u + w_v) + 2x \sum_u Q_u
    \lambda_u`).
    """
    if n == 2:
        pair = np.logaddexp(log_weights[:, None], log_weights[None, :])
        return float(masses @ pair @ masses + 2.0 * lower * (masses @ log_weights))
    # Psi(lambda + c) = Psi(lambda) + c R: the race below runs with the largest log-weight at 0.
    top = log_weights.max()
    log_weights = np.r_[log_weights - top, 0.0]  # the last row is the reference clock t of the e^-t term
    survive = np.exp(-_clocks(log_weights, _log_nodes(log_weights, step)))
    phi = lower + np.ascontiguousarray(survive[:-1].T) @ masses  # (K, U) C-order @ (U,), as before
    total = (lower + masses.sum()) ** n - lower**n
    return float(step * np.sum(total * survive[-1] - (phi**n - lower**n)) + top * total)


def singleton_bounds(lower: float, masses: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    r"""The range :math:`(\ell_u, h_u)` of :math:`r_u` as :math:`\lambda_u` runs over the reals, the others fixed.

    :math:`r_u` increases strictly in :math:`\lambda_u`, from :math:`\ell_u = (x + Q_u)^n - x^n` (``u`` wins
    only when every draft of the class is in ``u``) to :math:`h_u = (x + Q_C)^n - (x + Q_C - Q_u)^n` (``u``
    wins whenever drafted), both as :math:`Q_u \sum_j a^j b^{n-1-j}` (no cancellation) and the other units'
    mass :math:`Q_C - Q_u` summed directly for the heaviest unit.
    """
    total = masses.sum()
    others = total - masses
    heaviest = int(np.argmax(masses))
    others[heaviest] = masses[:heaviest].sum() + masses[heaviest + 1 :].sum()
    low = _power_difference(lower + masses, np.full_like(masses, lower), masses, n)
    high = _power_difference(np.full_like(masses, lower + total), lower + others, masses, n)
    return low, high


def _power_difference(high: np.ndarray, low: np.ndarray, mass: np.ndarray, n: int) -> np.ndarray:
    r""":math:`h^n - l^n = m \sum_{j<n} h^j l^{n-1-j}` with ``m = h - l`` given as a direct sum.

    Summed from ``j = 0`` as ``0 + h^0 l^{n-1} + h^1 l^{n-2} + ...``, written without the operations that change
    no value (``0 + y``, ``1 * y``, ``y**1``): 25 array operations instead of 32 at ``n = 8`` (a few are run per
    build on a few hundred units, each ~2 us), bitwise the same sum.
    """
    if n == 1:
        return mass * np.ones_like(high)
    total = _power(low, n - 1)
    for j in range(1, n - 1):
        total = total + _power(high, j) * _power(low, n - 1 - j)
    return mass * (total + _power(high, n - 1))


def _power(x: np.ndarray, k: int) -> np.ndarray:
    """``x**k`` (numpy's value; ``x`` itself for ``k = 1``, where ``x**1`` is a copy)."""
    return x if k == 1 else x**k


def _logit_residual(target: np.ndarray, r: np.ndarray, bounds) -> np.ndarray:
    r"""Right-hand side of the Newton step on :math:`g_u(r_u) = g_u(r^*_u)`, :math:`g_u(r) = \ln(r - \ell_u) -
    \ln(h_u - r)`, written in the units of :math:`r`: :math:`(g_u(r^*_u) - g_u(r_u)) / g_u'(r_u)`.

    It equals :math:`r^* - r` to first order; :math:`g_u` is exactly affine in :math:`\lambda_u` for a unit
    racing one other (``n = 2``), and close to it for a light unit against a dominant one at any ``n``, where
    the plain residual saturates (a unit far below ``h_u`` moves ~1 in :math:`\lambda` per Newton step). Units
    whose ``r`` or target is not strictly inside :math:`(\ell_u, h_u)` in floating point keep :math:`r^* - r`.
    """
    low, high, target_logit = bounds
    above, below = r - low, high - r
    inside = (above > 0) & (below > 0) & np.isfinite(target_logit)
    everywhere = bool(inside.all())
    if not everywhere:
        above, below = np.where(inside, above, 1.0), np.where(inside, below, 1.0)
    with np.errstate(invalid="ignore"):
        logit = np.log(above) - np.log(below)
        step = (target_logit - logit) * (above * below / (above + below))
    return step if everywhere else np.where(inside, step, target - r)


def fit_log_weights(lower: float, masses: np.ndarray, target: np.ndarray, n: int):
    r"""Log-weights whose race marginal is (as close as Newton gets to) ``target``, for one class.

    ``target`` must sum to :math:`(x + Q_C)^n - x^n`. Minimises the convex :math:`\Psi(\lambda) =`
    :func:`race_potential` :math:`- r^* \cdot \lambda` from :math:`\lambda_u = \ln(r^*_u / Q_u)` with
    :func:`newton_fit`, the logit step between the :func:`singleton_bounds`. Every evaluation uses the exact
    rule: with the closed-form tail it costs ~1.4 times a rule of step 1/2, and a coarse start (used before)
    cost one more evaluation at the switch than it saved. Runs as C++ where it is built (:mod:`theory._native`:
    the same loop on the same formulas, 3-4x faster; this module is its specification), numpy otherwise.
    """

    def evaluate(lw):
        # With the Jacobian: an accepted trial point is the next Newton point, whose Hessian is then at hand
        # (one pass over the quadrature nodes per iteration instead of two).
        return race_marginal(lower, masses, lw, n, jacobian=True)

    def potential(lw):
        return race_potential(lower, masses, lw, n)

    if masses.shape[0] == 1:
        return np.zeros(1), race_marginal(lower, masses, np.zeros(1), n)
    fitted = _native.race_fit(lower, masses, target, n, NATIVE_CONSTANTS)
    if fitted is not None:
        return fitted
    with single_threaded_blas():  # held already by a numpy build; taken here when a native one falls back
        return newton_fit(
            evaluate,
            potential,
            target,
            np.log(target / masses),
            singleton_bounds(lower, masses, n),
            tolerance=TOLERANCE,
            max_iterations=MAX_ITERATIONS,
            max_halvings=MAX_HALVINGS,
        )


def newton_fit(
    evaluate,
    potential,
    target: np.ndarray,
    start: np.ndarray,
    bounds: tuple[np.ndarray, np.ndarray],
    *,
    tolerance: float,
    max_iterations: int,
    max_halvings: int,
):
    r"""Damped Newton on the convex :math:`\Psi(\lambda) - r^* \cdot \lambda` of a race, whose gradient is
    :math:`r(\lambda) - r^*`: the log-weights whose marginal is (as close as it gets to) ``target``.

    ``evaluate(lw)`` returns the marginal ``r`` and its Jacobian :math:`H = \partial r / \partial \lambda`
    (symmetric, null vector ``1``); ``potential(lw)`` returns :math:`\Psi`; ``bounds`` = :math:`(\ell, h)`,
    the range of each :math:`r_u` as :math:`\lambda_u` runs over the reals. Log-weights are kept with their
    largest at 0 and none below ``-FLOOR``. Each iteration solves the Jacobi-scaled system (masses span up to
    1e18), its null vector fixed by the rank-one term :math:`\bar h\, 1 1^\top / U`. The step is centred on
    the step of the unit holding the median of the target mass, then each coordinate is clipped to
    :data:`MAX_STEP` on its own (tiny units cannot shrink the others' steps): a unit whose target is out of
    reach (a zero target, or one an LP put 1e-10 above its bound) has a step of 1e10 or more, and through the
    plain mean (or a target-weighted one) it dragged every other step to the same clip, so the others never
    moved relative to each other (fits stopped 0.02 to 0.08 short). Each iteration first tries the step on
    the per-unit logit residual (:func:`_logit_residual`, which straightens the saturating marginals of light
    units: 4.3 instead of 7.0 marginal evaluations per fit on the logged SmolLM2 pairs), accepted when
    :math:`\|r - r^*\|_1` or :math:`\Psi` decreases; otherwise the plain step :math:`H^{-1}(r^* - r)`,
    halved until one of them decreases (:math:`\Psi` is evaluated only when the error does not drop; the error
    guards the round-off floor of :math:`\Psi`). Stops at ``tolerance``, when no step is accepted, or when a
    step near the tolerance no longer halves the error (two such steps in a row above ``10 * tolerance``). Returns the log-weights with the smallest
    :math:`\|r - r^*\|_1` seen and their exact marginal.
    """
    low, high = bounds
    with np.errstate(divide="ignore", invalid="ignore"):
        logit_bounds = (low, high, np.log(target - low) - np.log(high - target))
    heavy = np.argsort(target)  # the unit holding the median of the target mass centres every step
    middle = heavy[min(int(np.searchsorted(np.cumsum(target[heavy]), 0.5 * target.sum())), heavy.size - 1)]
    log_weights = np.maximum(start - start.max(), -FLOOR)
    r, hessian = evaluate(log_weights)
    error = np.abs(r - target).sum()
    best = (error, log_weights, r)
    psi = None  # Psi is only needed when a step does not reduce the error
    slow_steps = 0  # consecutive accepted steps near the tolerance that did not halve the error
    for _ in range(max_iterations):
        if error <= tolerance:
            break
        diagonal = np.maximum(np.abs(np.diag(hessian)), 1e-300)
        root = np.sqrt(diagonal)
        system = hessian / root[:, None] / root[None, :]
        null = root / np.linalg.norm(root)  # the null vector 1 of the Hessian, in scaled coordinates
        system += np.outer(null, null)
        accepted = None
        for logit in (True, False):
            residual = _logit_residual(target, r, logit_bounds) if logit else target - r
            try:
                with np.errstate(over="ignore", invalid="ignore"):  # a tiny root overflows: checked below
                    step = np.linalg.solve(system, residual / root) / root
            except np.linalg.LinAlgError:
                step = np.linalg.lstsq(hessian, residual, rcond=None)[0]
            if not np.all(np.isfinite(step)):
                continue
            step = np.clip(step - step[middle], -MAX_STEP, MAX_STEP)
            for _ in range(1 if logit else max_halvings):
                trial = log_weights + step
                trial -= trial.max()
                np.maximum(trial, -FLOOR, out=trial)
                trial_r, trial_hessian = evaluate(trial)
                trial_error = np.abs(trial_r - target).sum()
                if trial_error < error:
                    accepted = trial
                    break
                if psi is None:
                    psi = potential(log_weights) - target @ log_weights
                if potential(trial) - target @ trial < psi:
                    accepted = trial
                    break
                step *= 0.5
            if accepted is not None:
                break
        if accepted is None:
            break
        slow_steps = slow_steps + 1 if trial_error > 0.5 * error and error < 1e3 * tolerance else 0
        log_weights, r, error, hessian, psi = trial, trial_r, trial_error, trial_hessian, None
        if error < best[0]:
            best = (error, log_weights, r)
        # Round-off stops progress within a few tolerances; above that, one slow step (a huge move of a tiny
        # unit that nudged the others by 1e-9) is followed by a quadratic one, so it takes two to stop.
        if slow_steps >= (1 if error <= 10 * tolerance else 2):
            break
    return best[1], best[2]
