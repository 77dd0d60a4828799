"""Kangaroo: double early exit (Liu et al., NeurIPS 2024, arXiv 2404.18911).

The draft is the target's first ``l`` layers through an adapter and the shared LM head (the first early
exit); drafting stops after a token whose top-1 probability is below eta, or after gamma tokens (the second,
token-level early exit; the low-confidence token is still verified). Verification is the chain decoder's
(greedy at temperature 0, speculative sampling otherwise).

The drafter is the trained ``kangaroo:K`` adapter (:class:`executor.drafters.exit_head.KangarooDrafter`) cached
for the target when there is one (``trained=None``, the default; ``trained=True`` requires it, ``False``
ignores it; ``exit_layer`` then defaults to the adapter's ``K``), else the untrained early exit at
``exit_layer``; any drafter factory can be passed as ``drafter``. Calibration reads the adapter over the
continuation's layer-``K`` states only (its attention does not see the prompt there). Two variants:

* ``kangaroo-fixed``: the paper's fixed eta = 0.6 (README) with gamma = 6;
* ``kangaroo``: eta chosen by the theory for the *measured* costs: on calibration prompts the draft's
  confidence buckets and their acceptance give a :class:`theory.ConfidenceBuckets` model, the draft/target
  time ratio ``c`` is timed, and eta maximises the exact speedup of :func:`theory.kangaroo_confidence_stop`
  under :func:`theory.evaluate_rule`.
"""

from __future__ import annotations

import numpy as np
import torch

from executor.drafters import EarlyExitDrafter
from executor.methods._common import (
    cached_head_layer,
    calibration_profile,
    check_exit_layer,
    checkpoint_cards,
    default_exit_layer,
)
from executor.methods.adaptive_chain import AdaptiveChainDecoder, DraftPolicy
from executor.methods.base import Method, Prediction
from executor.methods.calibration import forward_time_ratio
from executor.methods.confidence import ConfidenceCalibration
from theory.checks import as_count, as_probabilities

__all__ = ["Kangaroo", "KangarooFixed", "KangarooStop"]


class KangarooStop(DraftPolicy):
    """Continue after a drafted token iff its draft top-1 probability (temperature 1) is at least ``eta``."""

    def __init__(self, eta: float, max_length: int) -> None:
        self.eta = float(as_probabilities(eta, "eta"))
        self.max_length = as_count(max_length, "max_length")

    def continue_after(self, drafted, logits, feature=None) -> bool:
        return float(logits.softmax(-1).max()) >= self.eta


class Kangaroo(Method):
    """Kangaroo with eta from the theory (``eta=None``) or fixed (``eta=0.6`` in :class:`KangarooFixed`)."""

    name = "kangaroo"
    paper = "Kangaroo, Liu et al., NeurIPS 2024, arXiv 2404.18911"
    default_eta: float | None = None

    def __init__(
        self, target, tokenizer=None, *, exit_layer=None, gamma: int = 6, eta=None, drafter=None, trained=None
    ):
        super().__init__(target, tokenizer)
        self.adapter_path = None
        if drafter is None:
            exit_layer, self.adapter_path = cached_head_layer(
                target, "kangaroo", exit_layer, trained, deepest=False, noun="adapter", suggested="kangaroo:2"
            )
        self.exit_layer = check_exit_layer(
            target, default_exit_layer(target) if exit_layer is None else exit_layer
        )
        self.gamma = as_count(gamma, "gamma")
        eta = self.default_eta if eta is None else eta
        self.eta = None if eta is None else float(as_probabilities(eta, "eta"))
        self._drafter = drafter
        self.draft_cost: float | None = None

    def options(self) -> dict:
        return {
            "exit_layer": self.exit_layer,
            "gamma": self.gamma,
            "eta": self.eta,
            "adapter": None if self.adapter_path is None else str(self.adapter_path),
        }

    def drafter_cards(self) -> list[dict]:
        return checkpoint_cards(self.adapter_path)

    def make_drafter(self):
        if self._drafter is not None:
            return self._drafter()
        if self.adapter_path is not None:
            from executor.drafters.exit_head import KangarooDrafter

            return KangarooDrafter.from_checkpoint(self.target, self.adapter_path, self.exit_layer)
        return EarlyExitDrafter(self.target, self.exit_layer)

    def calibration_head(self):
        """``head(layer, hidden)`` for calibration: the adapter run causally over the given states, or
        ``None`` (the untrained exit)."""
        if self.adapter_path is None:
            return None
        from executor.drafters.exit_head import KangarooDrafter

        adapter = KangarooDrafter.from_checkpoint(self.target, self.adapter_path, self.exit_layer)
        adapter.close()
        head = adapter.head

        def run(layer, hidden):
            slots = torch.arange(hidden.shape[0], device=hidden.device)
            head.setup_cache(hidden.shape[0])
            z = head(self.target, hidden[None], slots, slots, slots <= slots[:, None])[0]
            return head.logits(self.target, z)

        return run

    def build(self, temperature: float = 0.0):
        eta = 0.6 if self.eta is None else self.eta
        return AdaptiveChainDecoder(
            self.target,
            self.make_drafter(),
            policy=KangarooStop(eta, self.gamma),
            sampling=self.sampling(temperature),
        )

    def predict(self, calibration_prompts, temperature, max_new_tokens):
        import theory

        profile, _ = calibration_profile(
            self.target,
            calibration_prompts,
            [self.exit_layer],
            temperature,
            max_new_tokens,
            head=self.calibration_head(),
        )
        calibration = ConfidenceCalibration().fit(profile.confidence[0], profile.accept[0])
        self.draft_cost = forward_time_ratio(self.target, self.exit_layer)
        model = calibration.model(self.gamma)
        costs = theory.LengthCosts(draft_time=self.draft_cost, target_time=1.0)
        grid = sorted(set(np.round(np.linspace(0.05, 0.95, 19), 2).tolist()) | {0.6})
        evaluations = {
            eta: theory.evaluate_rule(
                theory.kangaroo_confidence_stop(eta, max_length=self.gamma), model, costs
            )
            for eta in grid
        }
        best = max(grid, key=lambda eta: (evaluations[eta].speedup, -eta))
        if self.eta is None:
            self.eta = float(best)
        chosen = evaluations[min(grid, key=lambda eta: abs(eta - self.eta))]
        return Prediction(
            chosen.tokens_per_step,
            {
                "eta": self.eta,
                "theory_eta": float(best),
                "predicted_speedup": chosen.speedup,
                "paper_eta_speedup": evaluations[0.6].speedup,
                "draft_cost_ratio": self.draft_cost,
                "bucket_acceptance": calibration.acceptance.tolist(),
                "bucket_confidence": calibration.confidence.tolist(),
            },
            train_seconds=None,
        )

    def extra(self, decoder) -> dict:
        lengths = decoder.drafted_lengths
        return {"mean_drafted": float(np.mean(lengths)) if lengths else 0.0}


class KangarooFixed(Kangaroo):
    """Kangaroo with the paper's fixed confidence threshold eta = 0.6."""

    name = "kangaroo-fixed"
    default_eta = 0.6
