"""Acceptance models of a drafted chain and the costs of a step (SpecDec++, arXiv:2405.19715, Section 3)."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real

import numpy as np

from theory.checks import as_count, as_distribution, as_nonnegative, as_probabilities

#: Default cap on the number of drafted tokens for models without a natural horizon.
DEFAULT_MAX_LENGTH = 32


@dataclass(frozen=True)
class _BucketLaw:
    """What the draft reveals at one position: bucket probabilities and, per bucket, its signals."""

    probability: np.ndarray
    acceptance: np.ndarray
    confidence: np.ndarray
    entropy: np.ndarray | None

    @property
    def mean_acceptance(self) -> float:
        return float(self.probability @ self.acceptance)


def _optional_signal(value, name: str, shape: tuple[int, ...], *, probability: bool) -> np.ndarray | None:
    if value is None:
        return None
    array = as_probabilities(value, name) if probability else np.asarray(value, dtype=np.float64)
    if array.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {array.shape}")
    if not probability and (not np.all(np.isfinite(array)) or np.any(array < 0)):
        raise ValueError(f"{name} must be finite and non-negative (entropies in nats)")
    return array


class AcceptanceModel:
    """Base of the acceptance models: a horizon and, per drafted position ``1..horizon``, a
    :class:`_BucketLaw`.

    A model is either *stationary* (the same law at every position) or has a single bucket per position; the
    evaluators rely on this to identify states by their bucket counts.
    """

    horizon: int
    stationary: bool

    def law(self, position: int) -> _BucketLaw:  # pragma: no cover - overridden
        raise NotImplementedError


class IIDAcceptance(AcceptanceModel):
    """Every drafted token is accepted with probability ``alpha`` given the previous ones were (Leviathan
    et al.).

    ``confidence`` (the draft's top-1 probability the rules observe) defaults to ``alpha``: the draft is
    assumed calibrated, as in EAGLE-2. ``entropy`` (nats) is only needed by :func:`entropy_stop`.
    """

    stationary = True

    def __init__(self, alpha: float, *, max_length: int = DEFAULT_MAX_LENGTH, confidence=None, entropy=None):
        if isinstance(alpha, bool) or not isinstance(alpha, Real):
            raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
        self.alpha = float(as_probabilities(alpha, "alpha"))
        self.horizon = as_count(max_length, "max_length")
        acceptance = np.array([self.alpha])
        self._law = _BucketLaw(
            probability=np.ones(1),
            acceptance=acceptance,
            confidence=acceptance
            if confidence is None
            else _optional_signal([confidence], "confidence", (1,), probability=True),
            entropy=_optional_signal(
                None if entropy is None else [entropy], "entropy", (1,), probability=False
            ),
        )

    def law(self, position: int) -> _BucketLaw:
        return self._law

    def __repr__(self) -> str:
        return f"IIDAcceptance(alpha={self.alpha:g}, max_length={self.horizon})"


class PositionalAcceptance(AcceptanceModel):
    """Token ``j`` is accepted with conditional probability ``alphas[j-1]`` (horizon = ``len(alphas)``).

    ``confidences`` default to ``alphas`` (calibrated draft); ``entropies`` (nats) are optional.
    """

    stationary = False

    def __init__(self, alphas, *, confidences=None, entropies=None):
        self.alphas = as_probabilities(alphas, "alphas")
        if self.alphas.ndim != 1 or self.alphas.shape[0] == 0:
            raise ValueError(f"alphas must be a non-empty 1-D vector, got shape {self.alphas.shape}")
        self.horizon = self.alphas.shape[0]
        shape = self.alphas.shape
        conf = _optional_signal(confidences, "confidences", shape, probability=True)
        conf = self.alphas if conf is None else conf
        ent = _optional_signal(entropies, "entropies", shape, probability=False)
        self._laws = [
            _BucketLaw(
                np.ones(1), self.alphas[j : j + 1], conf[j : j + 1], None if ent is None else ent[j : j + 1]
            )
            for j in range(self.horizon)
        ]

    def law(self, position: int) -> _BucketLaw:
        return self._laws[position - 1]

    def __repr__(self) -> str:
        return f"PositionalAcceptance(alphas={np.round(self.alphas, 4).tolist()})"


class ConfidenceBuckets(AcceptanceModel):
    """Each drafted token's confidence bucket is drawn i.i.d.; its acceptance depends on the bucket.

    Parameters
    ----------
    confidences : array_like, shape (B,)
        The draft's top-1 probability in each bucket (what Kangaroo's stop observes).
    acceptance_per_bucket : array_like, shape (B,)
        Probability that a token of that bucket is accepted (given its predecessors were).
    bucket_probabilities : array_like, shape (B,)
        Frequency of each bucket; a probability vector.
    entropies : array_like, shape (B,), optional
        Entropy of the draft distribution in each bucket, in nats (for :func:`entropy_stop`).
    max_length : int
        Cap on the number of drafted tokens.
    """

    stationary = True

    def __init__(
        self,
        confidences,
        acceptance_per_bucket,
        bucket_probabilities,
        *,
        entropies=None,
        max_length: int = DEFAULT_MAX_LENGTH,
    ):
        probability = as_distribution(bucket_probabilities, "bucket_probabilities")
        if probability.ndim != 1:
            raise ValueError(f"bucket_probabilities must be 1-D, got shape {probability.shape}")
        shape = probability.shape
        acceptance = _optional_signal(acceptance_per_bucket, "acceptance_per_bucket", shape, probability=True)
        confidence = _optional_signal(confidences, "confidences", shape, probability=True)
        self.horizon = as_count(max_length, "max_length")
        self._law = _BucketLaw(
            probability,
            acceptance,
            confidence,
            _optional_signal(entropies, "entropies", shape, probability=False),
        )

    def law(self, position: int) -> _BucketLaw:
        return self._law

    def __repr__(self) -> str:
        law = self._law
        return (
            f"ConfidenceBuckets(confidences={law.confidence.tolist()}, acceptance={law.acceptance.tolist()}, "
            f"probabilities={law.probability.tolist()}, max_length={self.horizon})"
        )


@dataclass(frozen=True)
class LengthCosts:
    """Costs of one speculative step: ``K * draft_time + target_time + discard_cost * (K - A)``.

    ``draft_time`` is one draft forward, ``target_time`` one target (verification) call, both > 0 for the
    target and >= 0 for the draft; ``discard_cost`` is SpecDec++'s extra penalty per drafted token that is
    thrown away (0 for pure wall time). Speedups are against plain decoding, which pays ``target_time`` per
    token.
    """

    draft_time: float
    target_time: float = 1.0
    discard_cost: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "draft_time", as_nonnegative(self.draft_time, "draft_time"))
        target = as_nonnegative(self.target_time, "target_time")
        if target == 0:
            raise ValueError("target_time must be positive (it is the unit of plain decoding)")
        object.__setattr__(self, "target_time", target)
        object.__setattr__(self, "discard_cost", as_nonnegative(self.discard_cost, "discard_cost"))

    def per_step(self, drafted: float, accepted: float) -> float:
        return drafted * self.draft_time + self.target_time + self.discard_cost * (drafted - accepted)
