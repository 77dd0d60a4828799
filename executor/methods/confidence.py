"""Draft-confidence statistics shared by Kangaroo and SpecDec++: buckets of the draft's top probability with
their measured acceptance, turned into the theory's :class:`theory.ConfidenceBuckets` model, and the
calibrated acceptance predictor that stands in for SpecDec++'s trained head until one is supplied."""

from __future__ import annotations

import time

import numpy as np
import torch

__all__ = ["ConfidenceCalibration"]


class ConfidenceCalibration:
    """Acceptance as a function of the draft's top-1 probability (temperature 1), by quantile buckets.

    ``fit(confidence, accept)`` bins calibration positions into ``buckets`` equal-count bins of confidence and
    records each bin's mean acceptance; ``__call__(logits)`` predicts a drafted token's acceptance from its
    draft logits (the bin of its confidence). ``fit_seconds`` is the fitting time (the method's
    ``train_seconds``).
    """

    def __init__(self, buckets: int = 4) -> None:
        self.buckets = buckets
        self.edges = np.array([])
        self.acceptance = np.array([])
        self.confidence = np.array([])
        self.probability = np.array([])
        self.fit_seconds = 0.0

    def fit(self, confidence: np.ndarray, accept: np.ndarray) -> ConfidenceCalibration:
        start = time.perf_counter()
        confidence = np.asarray(confidence, dtype=np.float64).ravel()
        accept = np.asarray(accept, dtype=np.float64).ravel()
        if confidence.size == 0 or confidence.shape != accept.shape:
            raise ValueError("confidence and accept must be non-empty and of the same length")
        quantiles = np.quantile(confidence, np.linspace(0, 1, self.buckets + 1)[1:-1])
        self.edges = np.unique(quantiles)
        index = np.searchsorted(self.edges, confidence, side="right")
        used = np.unique(index)
        self.acceptance = np.array([accept[index == b].mean() for b in used])
        self.confidence = np.array([confidence[index == b].mean() for b in used])
        self.probability = np.array([np.mean(index == b) for b in used])
        self._map = {int(b): i for i, b in enumerate(used)}
        self.fit_seconds = time.perf_counter() - start
        return self

    def predict_confidence(self, confidence: float) -> float:
        bucket = int(np.searchsorted(self.edges, confidence, side="right"))
        if bucket in self._map:
            return float(self.acceptance[self._map[bucket]])
        nearest = min(self._map, key=lambda b: abs(b - bucket))
        return float(self.acceptance[self._map[nearest]])

    def __call__(self, logits: torch.Tensor) -> float:
        return self.predict_confidence(float(logits.softmax(-1).max()))

    def model(self, max_length: int):
        """The theory's acceptance model: i.i.d. buckets with these confidences and acceptances."""
        import theory

        return theory.ConfidenceBuckets(
            np.clip(self.confidence, 0, 1),
            np.clip(self.acceptance, 0, 1),
            self.probability / self.probability.sum(),
            max_length=max_length,
        )
