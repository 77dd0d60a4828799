r"""The exponential race with one weight per item, at vocabulary size: where the optimal verifier's units
cannot follow ``p``.

:mod:`theory._race` fits a class's race weights by Newton's method on a dense system over *units* (at most
:data:`theory._class_units.MAX_UNITS`), and a unit's tokens share one ratio :math:`r/q`. When the class has
no room (:math:`\alpha^*` within the units' loss of 1, as a close, full-vocabulary drafter gives), the
water-filled target asks for :math:`r = p` on thousands of distinct ratios, and the unit fit stops short
(3e-5 to 4e-4 on such pairs at V = 49,152; docs/benchmarks/optimal_verifier.md).

Here every item keeps its own weight. Given the others, an item's marginal depends on its own weight and on
the class only through :math:`\varphi(t) = x + \sum_v Q_v e^{-t w_v}`:

.. math:: r_u = n\, Q_u \int_0^\infty w_u e^{-t w_u}\, \varphi(t)^{n-1}\, dt,

so :math:`\varphi` on the quadrature nodes is accumulated once per sweep (chunks of :data:`CHUNK` items, never
a :math:`U \times U` matrix), and each sweep moves every log-weight by its own Newton step
:math:`(r^*_u - r_u) / (\partial r_u / \partial \lambda_u)`, the diagonal of the exact Jacobian of
:func:`theory._race.race_marginal` (Jacobi's method: the coupling through :math:`\varphi` is weak for all but a
few heavy items). Measured on close synthetic pairs (one class, :math:`r^* = p`, from the naive start
:math:`\log(p/q)`): :math:`\sum |r - r^*|` below 1e-14 in 12 sweeps at V = 2,048 and 18-20 at V = 49,152; from
the unit fit's weights, as the verifier starts it, 10-15 marginal evaluations there (0.5-0.8 s of CPU).

The quadrature (nodes, window, closed-form lower tail, clocks) is :mod:`theory._race`'s, so the marginal is
the same number :func:`theory._race.race_marginal` gives (to round-off in the order of the sums), and the
verifier built on it stays exactly lossless whatever the fit reached.
"""

from __future__ import annotations

import numpy as np

from theory._race import (
    FLOOR,
    MAX_STEP,
    STEP,
    TAIL_LOW,
    TOLERANCE,
    _clocks,
    _log_nodes,
    _lower_tail,
    single_threaded_blas,
)

__all__ = ["fit_item_log_weights", "item_marginal"]

#: Items per block of the (items, nodes) clock matrix: 2048 x ~300 nodes is ~5 MB.
CHUNK = 2048
#: Jacobi sweeps at most, and halvings of a sweep's step that does not lower the error.
MAX_SWEEPS, HALVINGS = 60, 4


def item_marginal(
    lower: float, masses: np.ndarray, log_weights: np.ndarray, n: int, derivative: bool = False
):
    r"""Selection marginal :math:`r_u` of every item (and, if asked, :math:`\partial r_u / \partial \lambda_u`).

    The same quadrature as :func:`theory._race.race_marginal` (which uses the closed Bradley--Terry form at
    ``n = 2``; the integral form here agrees with it to 1e-15 relative), computed block by block, so ``masses``
    may have the length of a vocabulary. The derivative is the diagonal of ``race_marginal``'s Jacobian.
    """
    log_weights = log_weights - log_weights.max()
    log_nodes = _log_nodes(log_weights, STEP, TAIL_LOW)
    phi = np.full(log_nodes.shape[0], float(lower))
    for start in range(0, masses.shape[0], CHUNK):
        survive = _clocks(log_weights[start : start + CHUNK], log_nodes)
        np.negative(survive, out=survive)
        np.exp(survive, out=survive)
        phi += masses[start : start + CHUNK] @ survive
    power = phi ** (n - 2)
    full = power * phi
    weights = np.exp(log_weights)
    total, weighted = lower + masses.sum(), float(masses @ weights)
    first_node = float(np.exp(log_nodes[0]))
    r = np.empty_like(masses)
    slopes = np.empty_like(masses) if derivative else None
    for start in range(0, masses.shape[0], CHUNK):
        block = slice(start, start + CHUNK)
        clock = _clocks(log_weights[block], log_nodes)
        density = clock * np.exp(-clock)  # w t e^{-w t}
        weighted_density = density * full[None, :]
        tail, first = _lower_tail(total, weighted, weights[block], first_node, n, STEP)
        r[block] = n * masses[block] * (STEP * weighted_density.sum(axis=1) + tail)
        if derivative:
            own = n * masses[block] * (STEP * ((1.0 - clock) * weighted_density).sum(axis=1) + first)
            scaled = masses[block][:, None] * density
            cross = (n * (n - 1) * STEP) * (scaled * scaled * power[None, :]).sum(axis=1)
            slopes[block] = own - cross
    return (r, slopes) if derivative else r


def fit_item_log_weights(lower: float, masses: np.ndarray, target: np.ndarray, n: int, start: np.ndarray):
    r"""Log-weights, one per item, whose race marginal is (as close as the sweeps get to) ``target``.

    ``target`` must sum to :math:`(x + Q_C)^n - x^n`; ``start`` is the first guess (the unit fit's weights,
    item by item). Jacobi sweeps (module docstring) of the per-item Newton step, each clipped to
    :data:`theory._race.MAX_STEP` and halved (up to :data:`HALVINGS` times) until :math:`\sum |r - r^*|`
    drops; the log-weights are kept with their largest at 0 and none below ``-FLOOR``. Stops at
    :data:`theory._race.TOLERANCE`, when no halving helps, or after :data:`MAX_SWEEPS`. Returns the last
    (best) log-weights and their exact marginal.
    """
    with single_threaded_blas():  # as every race product: theory._race.single_threaded_blas says why
        log_weights = _normalised(start)
        r, slopes = item_marginal(lower, masses, log_weights, n, derivative=True)
        error = float(np.abs(r - target).sum())
        for _ in range(MAX_SWEEPS):
            if error <= TOLERANCE:
                break
            with np.errstate(divide="ignore", invalid="ignore"):
                step = (target - r) / slopes
            step = np.clip(
                np.nan_to_num(step, nan=0.0, posinf=MAX_STEP, neginf=-MAX_STEP), -MAX_STEP, MAX_STEP
            )
            for _ in range(HALVINGS + 1):
                trial = _normalised(log_weights + step)
                trial_r, trial_slopes = item_marginal(lower, masses, trial, n, derivative=True)
                trial_error = float(np.abs(trial_r - target).sum())
                if trial_error < error:
                    break
                step *= 0.5
            else:  # no step lowers the error: at the round-off floor
                break
            log_weights, r, slopes, error = trial, trial_r, trial_slopes, trial_error
    return log_weights, r


def _normalised(log_weights: np.ndarray) -> np.ndarray:
    """Largest log-weight at 0, none below ``-FLOOR`` (the marginal depends on the differences only)."""
    return np.maximum(log_weights - log_weights.max(), -FLOOR)
