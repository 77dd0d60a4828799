"""Input checks shared by every public function of :mod:`theory`.

Each check raises :class:`ValueError` naming the argument and what is wrong with it, and returns the value
in the form the caller computes with (float64 arrays, Python ints). Nothing is silently renormalised: a
probability vector whose sum is off 1 by more than :data:`SUM_TOLERANCE` is an error.
"""

from __future__ import annotations

from collections.abc import Iterable
from numbers import Integral, Real

import numpy as np

#: Largest tolerated deviation of a probability vector's sum from 1.
SUM_TOLERANCE = 1e-6


def as_distribution(value, name: str) -> np.ndarray:
    """Return ``value`` as a float64 array of probability vectors along its last axis.

    Leading axes are a batch. Raises ``ValueError`` naming ``name`` for an empty array, NaN or infinite
    entries, negative entries, or a row whose sum differs from 1 by more than :data:`SUM_TOLERANCE`.
    """
    return distribution_with_sums(value, name)[0]


def distribution_with_sums(value, name: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`as_distribution` and the row sums it checked (shape: the batch axes), for callers that would
    otherwise sum the rows again.

    Two passes over a valid array (its row sums and its smallest entry): a NaN entry makes the smallest entry
    NaN, ``-inf`` makes it negative and ``+inf`` makes its row's sum infinite, so finite sums and a smallest
    entry >= 0 prove every entry finite and non-negative. Only an invalid array gets the entry-wise checks
    that word the error (at LM vocabulary sizes they cost ~3 times the two passes).
    """
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must be an array of probabilities: {error}") from None
    if array.ndim == 0:
        raise ValueError(f"{name} must have at least one axis (the vocabulary), got a scalar")
    if array.shape[-1] == 0:
        raise ValueError(f"{name} has an empty vocabulary axis (shape {array.shape})")
    sums = array.sum(axis=-1)
    # Array methods, not numpy's functions of the same name: the calls on the sums cost more than the passes.
    if not (array.min() >= 0 and np.isfinite(sums).all()):
        if not np.isfinite(array).all():
            raise ValueError(f"{name} contains NaN or infinite entries")
        if (array < 0).any():
            raise ValueError(f"{name} contains negative entries (smallest {array.min():.3g})")
    worst = np.abs(sums - 1.0).max()
    if not worst <= SUM_TOLERANCE:  # also an infinite sum of finite entries
        flat = np.ravel(sums)
        raise ValueError(
            f"{name} must sum to 1 along its last axis; a row sums to {flat[np.argmax(np.abs(flat - 1))]:.9g}"
            f" (off by {worst:.3g} > {SUM_TOLERANCE:g})"
        )
    return array, sums


def as_distribution_pair(p, q, p_name: str = "p", q_name: str = "q") -> tuple[np.ndarray, np.ndarray]:
    """Check a target/draft pair and broadcast their batch axes; the vocabulary axes must match exactly."""
    p, q, _, _ = distribution_pair_with_sums(p, q, p_name, q_name)
    return p, q


def distribution_pair_with_sums(p, q, p_name: str = "p", q_name: str = "q"):
    """:func:`as_distribution_pair` and the checked row sums of both, broadcast to the common batch shape."""
    p, p_sums = distribution_with_sums(p, p_name)
    q, q_sums = distribution_with_sums(q, q_name)
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"{p_name} and {q_name} must share the vocabulary axis: {p_name} has {p.shape[-1]} tokens, "
            f"{q_name} has {q.shape[-1]}"
        )
    if p.shape == q.shape:  # nothing to broadcast (the usual call)
        return p, q, p_sums, q_sums
    try:
        p, q = np.broadcast_arrays(p, q)
    except ValueError:
        raise ValueError(
            f"{p_name} and {q_name} have batch shapes that do not broadcast: {p.shape} and {q.shape}"
        ) from None
    batch = p.shape[:-1]
    return p, q, np.broadcast_to(p_sums, batch), np.broadcast_to(q_sums, batch)


def as_count(value, name: str, minimum: int = 1) -> int:
    """Return ``value`` as an int, requiring an integer (not a bool) that is at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def as_nonnegative(value, name: str) -> float:
    """Return ``value`` as a float, requiring a finite real number >= 0."""
    if isinstance(value, bool) or not isinstance(value, Real) or not np.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    return float(value)


def as_probabilities(value, name: str) -> np.ndarray:
    """Return ``value`` as a float64 array whose entries are probabilities in [0, 1] (not a distribution)."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must be an array of probabilities: {error}") from None
    if array.size and not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or infinite entries")
    if array.size and (array.min() < 0 or array.max() > 1):
        raise ValueError(
            f"{name} entries must lie in [0, 1], got range [{array.min():.3g}, {array.max():.3g}]"
        )
    return array


def as_choice(value, name: str, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise naming the argument and the valid choices."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value
