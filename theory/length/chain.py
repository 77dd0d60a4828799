"""Chain draft length: expected tokens per step, wall-time speedup and the best fixed draft length.

A chain speculative step drafts ``gamma`` tokens with the draft model, then one target call verifies them.
With per-position conditional acceptance ``alpha_j`` (the probability that drafted token ``j`` is accepted
given that tokens ``1..j-1`` were), the step yields the accepted prefix plus one target-generated (bonus or
correction) token, so plain decoding has one token per step.

References
----------
Leviathan, Kalman, Matias. "Fast Inference from Transformers via Speculative Decoding", ICML 2023,
arXiv:2211.17192 (Eq. 1, Theorem 3.8, Corollary 3.9, Section 3.5).

Adaptive stopping rules and the SpecDec++ Markov decision process live in :mod:`theory.length`.
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from scipy.special import lambertw

from theory.checks import as_count, as_nonnegative, as_probabilities

__all__ = [
    "continuous_optimal_draft_length",
    "expected_tokens",
    "optimal_draft_length",
    "speedup",
]

#: Default upper end of the search over integer draft lengths.
DEFAULT_MAX_GAMMA = 128


def _as_rate(alpha, name: str = "alpha") -> float:
    """One acceptance probability in [0, 1] as a float."""
    if isinstance(alpha, bool) or not isinstance(alpha, Real):
        raise ValueError(f"{name} must be a single number in [0, 1] here, got {alpha!r}")
    return float(as_probabilities(alpha, name))


def _as_gamma_array(gamma) -> np.ndarray:
    """Draft lengths (int or integer array) as an int64 array, each >= 0."""
    if isinstance(gamma, Integral) and not isinstance(gamma, bool):
        return np.asarray(as_count(gamma, "gamma", minimum=0), dtype=np.int64)
    array = np.asarray(gamma)
    if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"gamma must be a non-negative integer or an integer array, got {gamma!r}")
    if array.size and array.min() < 0:
        raise ValueError(f"gamma must be non-negative, got a minimum of {array.min()}")
    return array.astype(np.int64)


def expected_tokens(alpha, gamma, *, per_position: bool | None = None) -> float | np.ndarray:
    r"""Expected tokens per speculative step with ``gamma`` drafted tokens, bonus token included.

    Constant acceptance :math:`\alpha` (Leviathan et al., ICML 2023, arXiv:2211.17192, Eq. 1):

    .. math:: \tau(\alpha, \gamma) = \sum_{i=0}^{\gamma} \alpha^i = \frac{1 - \alpha^{\gamma+1}}{1 - \alpha},
              \qquad \tau(1, \gamma) = \gamma + 1.

    Per-position conditional acceptance :math:`\alpha_1, \alpha_2, \dots` (the direct generalisation):

    .. math:: \tau = 1 + \sum_{t=1}^{\gamma} \prod_{j \le t} \alpha_j .

    Parameters
    ----------
    alpha : float or array_like
        Acceptance probabilities in [0, 1].
    gamma : int or array_like of int
        Number of drafted tokens, ``>= 0``.
    per_position : bool, optional
        ``None`` (default) reads a scalar ``alpha`` as a constant rate and an array as per-position rates
        along its last axis (leading axes are a batch; then ``gamma <= alpha.shape[-1]`` must be an int).
        ``False`` reads every entry of ``alpha`` as a constant rate and broadcasts it against ``gamma``
        (vectorised evaluation of the geometric form).

    Returns
    -------
    float or numpy.ndarray
        :math:`\tau \ge 1`; a float for scalar input.
    """
    alpha_array = as_probabilities(alpha, "alpha")
    if per_position is None:
        per_position = alpha_array.ndim > 0
    if not per_position:
        gammas = _as_gamma_array(gamma)
        a, g = np.broadcast_arrays(alpha_array, gammas)
        # 1 - alpha^(gamma+1) as -expm1((gamma+1) log alpha): the plain difference cancels as alpha -> 1 (1.5e-12
        # relative at alpha = 0.99999); alpha - 1 and 1 - alpha are exact there (Sterbenz), log1p keeps the rest.
        with np.errstate(divide="ignore", invalid="ignore"):
            geometric = -np.expm1((g + 1) * np.log1p(a - 1.0)) / (1.0 - a)
        # alpha == 1 is the limit gamma + 1; returned exactly rather than as 0/0.
        result = np.where(a == 1.0, g + 1.0, geometric)
        return float(result) if result.ndim == 0 else result
    if alpha_array.ndim == 0:
        raise ValueError("alpha must have at least one axis (positions) when per_position=True")
    gamma = as_count(gamma, "gamma", minimum=0)
    if gamma > alpha_array.shape[-1]:
        raise ValueError(
            f"gamma = {gamma} exceeds the number of per-position acceptance rates ({alpha_array.shape[-1]})"
        )
    survival = np.cumprod(alpha_array[..., :gamma], axis=-1)
    result = 1.0 + survival.sum(axis=-1)
    return float(result) if np.ndim(result) == 0 else result


def speedup(alpha, gamma, c, *, per_position: bool | None = None) -> float | np.ndarray:
    r"""Expected wall-time improvement factor of chain speculative decoding over plain decoding.

    Leviathan et al. (ICML 2023, arXiv:2211.17192), Theorem 3.8:

    .. math:: S(\alpha, \gamma, c) = \frac{\tau(\alpha, \gamma)}{\gamma c + 1},

    with :math:`\tau` from :func:`expected_tokens` and ``c`` the time of one draft step divided by the time of
    one target call. ``alpha`` and ``per_position`` are read as in :func:`expected_tokens`.
    """
    c = as_nonnegative(c, "c")
    tokens = expected_tokens(alpha, gamma, per_position=per_position)
    gammas = _as_gamma_array(gamma)
    result = tokens / (gammas * c + 1.0)
    return float(result) if np.ndim(result) == 0 else result


#: Relative difference below which two speedups count as a tie in :func:`optimal_draft_length`.
TIE_TOLERANCE = 1e-12


def optimal_draft_length(alpha, c, *, max_gamma: int = DEFAULT_MAX_GAMMA) -> int:
    r"""The integer draft length :math:`\gamma^* \in \{0, \dots, \gamma_{max}\}` that maximises
    :func:`speedup`.

    Leviathan et al. (ICML 2023, arXiv:2211.17192), Section 3.5: :math:`\gamma^* = \arg\max_\gamma
    \tau(\alpha, \gamma) / (\gamma c + 1)`; :math:`\gamma = 0` means speculation does not pay. Ties go to the
    shorter draft. For per-position ``alpha`` (a 1-D array) the search runs up to ``min(max_gamma,
    len(alpha))``.
    """
    c = as_nonnegative(c, "c")
    max_gamma = as_count(max_gamma, "max_gamma", minimum=0)
    alpha_array = as_probabilities(alpha, "alpha")
    if alpha_array.ndim > 1:
        raise ValueError(
            f"alpha must be a number or a 1-D per-position vector, got shape {alpha_array.shape}"
        )
    if alpha_array.ndim == 1:
        horizon = min(max_gamma, alpha_array.shape[0])
        tokens = np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(alpha_array[:horizon]))])
    else:
        tokens = expected_tokens(float(alpha_array), np.arange(max_gamma + 1), per_position=False)
    values = tokens / (np.arange(tokens.shape[0]) * c + 1.0)
    # Shorter draft on ties; values equal up to rounding (e.g. alpha == c at gamma 0 and 1) count as ties.
    return int(np.argmax(values >= values.max() * (1.0 - TIE_TOLERANCE)))


def continuous_optimal_draft_length(alpha, c) -> float:
    r"""The real :math:`\gamma \ge 0` that maximises :math:`S(\alpha, \gamma, c)`, in closed form (Lambert W).

    Write :math:`x = \gamma + 1`, :math:`L = -\ln\alpha` and :math:`S \propto (1 - e^{-Lx}) / (1 + (x-1)c)`.
    Setting the derivative to zero gives :math:`e^{-Lx}\,(L(1 + (x-1)c) + c) = c`. With
    :math:`y = L(1 + (x-1)c) + c` this is :math:`(-y/c)\,e^{-y/c} = z`, where

    .. math:: z = -\exp\!\left(-1 - \frac{L(1-c)}{c}\right) \in (-1/e, 0),

    so :math:`y = -c\,W_{-1}(z)` (the branch with :math:`y > c`, because :math:`1 + (x-1)c > 0`) and

    .. math:: \gamma^*_{cont} = \frac{y - L + Lc - c}{Lc} - 1 .

    :math:`S` is a concave function over a positive affine one, hence quasi-concave, so the stationary point
    is the maximum; it is clipped at 0. Edge cases: ``c >= 1`` or ``alpha == 0`` give 0 (speculation never
    pays); ``alpha == 1`` or ``c == 0`` with ``alpha > 0`` give ``inf`` (longer is always better). The integer
    optimum is :func:`optimal_draft_length`. Derivation for this toolkit; the model is that of Leviathan et
    al. (ICML 2023, arXiv:2211.17192), who choose :math:`\gamma` numerically.
    """
    alpha = _as_rate(alpha)
    c = as_nonnegative(c, "c")
    if alpha == 0.0 or c >= 1.0:
        return 0.0
    if alpha == 1.0 or c == 0.0:
        return float("inf")
    log_rate = -np.log(alpha)
    z = -np.exp(-1.0 - log_rate * (1.0 - c) / c)
    y = -c * float(np.real(lambertw(z, k=-1)))
    gamma = (y - log_rate + log_rate * c - c) / (log_rate * c) - 1.0
    return max(0.0, gamma)
