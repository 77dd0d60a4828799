"""SpecDec++: adaptive candidate length (Huang, Guo & Wang, arXiv 2405.19715).

After drafting candidate ``k``, stop and verify when the predicted probability that some candidate is
rejected, :math:`1 - \\prod_{i \\le k} \\hat P_i`, exceeds ``h``; bounds ``K_min <= K <= K_max``.
:math:`\\hat P_i` is the paper's trained acceptance-prediction head on the drafter's features. Until the
training pipeline supplies one (pass it as ``acceptance_head``: ``head(draft_logits) -> probability``), the
predictor is a calibration of the draft's confidence (:class:`ConfidenceCalibration`, fit on calibration
prompts in milliseconds; its fitting time is reported as ``train_seconds``).

``h`` comes from the theory for the measured costs: the confidence buckets form a
:class:`theory.ConfidenceBuckets` model, the draft/target time ratio is timed, and
:func:`theory.optimal_length_policy` (the SpecDec++ MDP solved exactly) gives the optimal threshold; its
``rejection_threshold`` is the ``h`` of :func:`theory.specdecpp_threshold`, which predicts the tokens per step.
"""

from __future__ import annotations

import numpy as np

from executor.drafters import EarlyExitDrafter
from executor.methods._common import calibration_profile, check_exit_layer, default_exit_layer
from executor.methods.adaptive_chain import AdaptiveChainDecoder, DraftPolicy
from executor.methods.base import Method, Prediction
from executor.methods.calibration import forward_time_ratio
from executor.methods.confidence import ConfidenceCalibration
from theory.checks import as_count, as_probabilities

__all__ = ["SpecDecPP", "SpecDecPPStop"]


class SpecDecPPStop(DraftPolicy):
    """Stop after candidate ``k`` when ``1 - prod P_hat > h`` (never before ``min_length``)."""

    def __init__(self, head, threshold: float, max_length: int, min_length: int = 1) -> None:
        self.head = head
        self.threshold = float(as_probabilities(threshold, "threshold"))
        self.max_length = as_count(max_length, "max_length")
        self.min_length = as_count(min_length, "min_length", minimum=0)
        self._product = 1.0

    def start_round(self, state) -> None:
        self._product = 1.0

    def continue_after(self, drafted, logits) -> bool:
        self._product *= float(self.head(logits))
        return drafted < self.min_length or 1.0 - self._product <= self.threshold


class SpecDecPP(Method):
    name = "specdecpp"
    paper = "SpecDec++, Huang, Guo & Wang, arXiv 2405.19715"

    def __init__(
        self,
        target,
        tokenizer=None,
        *,
        exit_layer=None,
        max_length: int = 8,
        threshold=None,
        acceptance_head=None,
        drafter=None,
    ):
        super().__init__(target, tokenizer)
        self.exit_layer = check_exit_layer(
            target, default_exit_layer(target) if exit_layer is None else exit_layer
        )
        self.max_length = as_count(max_length, "max_length")
        self.threshold = None if threshold is None else float(as_probabilities(threshold, "threshold"))
        self.head = acceptance_head
        self._drafter = drafter

    def options(self) -> dict:
        return {"exit_layer": self.exit_layer, "max_length": self.max_length, "threshold": self.threshold}

    def make_drafter(self):
        return (
            self._drafter() if self._drafter is not None else EarlyExitDrafter(self.target, self.exit_layer)
        )

    def build(self, temperature: float = 0.0):
        head = self.head if self.head is not None else (lambda logits: float(logits.softmax(-1).max()))
        threshold = 0.7 if self.threshold is None else self.threshold  # the paper's single setting
        return AdaptiveChainDecoder(
            self.target,
            self.make_drafter(),
            policy=SpecDecPPStop(head, threshold, self.max_length),
            sampling=self.sampling(temperature),
        )

    def predict(self, calibration_prompts, temperature, max_new_tokens):
        import theory

        profile, _ = calibration_profile(
            self.target, calibration_prompts, [self.exit_layer], temperature, max_new_tokens
        )
        calibration = ConfidenceCalibration().fit(profile.confidence[0], profile.accept[0])
        if self.head is None:
            self.head = calibration
        cost = forward_time_ratio(self.target, self.exit_layer)
        model = calibration.model(self.max_length)
        costs = theory.LengthCosts(draft_time=cost, target_time=1.0)
        policy = theory.optimal_length_policy(model, costs)
        h = policy.rejection_threshold if policy.rejection_threshold is not None else 0.7
        h = float(np.clip(h, 0.0, 1.0))
        if self.threshold is None:
            self.threshold = h
        rule = theory.specdecpp_threshold(self.threshold, min_length=1, max_length=self.max_length)
        evaluation = theory.evaluate_rule(rule, model, costs)
        fixed = {
            k: theory.evaluate_rule(theory.fixed_length_rule(k), model, costs).speedup
            for k in range(0, self.max_length + 1)
        }
        heuristic = theory.evaluate_rule(theory.heuristic_schedule(maximum=self.max_length), model, costs)
        return Prediction(
            evaluation.tokens_per_step,
            {
                "threshold": self.threshold,
                "optimal_policy_speedup": policy.speedup,
                "predicted_speedup": evaluation.speedup,
                "fixed_k_speedup": fixed,
                "heuristic_speedup": heuristic.speedup,
                "draft_cost_ratio": cost,
            },
            train_seconds=calibration.fit_seconds,
        )

    def extra(self, decoder) -> dict:
        lengths = decoder.drafted_lengths
        return {"mean_drafted": float(np.mean(lengths)) if lengths else 0.0}
