"""DEL: context-aware dynamic exit layer for self-speculative decoding (Zarch et al., COLM 2025,
arXiv 2504.05598).

Self-speculation drafts with the target's first ``E`` layers and an exit head. After every verification,
DEL evaluates *every eligible exit layer* on the positions the round verified, from the hidden states of the
same verification pass ("shadow tokens"; here forward hooks on the eligible layers), clipped to the positions
whose inputs were accepted; per layer it keeps decayed counts (:math:`\\omega = 0.95`) of matches
(greedy: the shadow token equals the target's; sampling: :math:`\\sum_x \\min(p, q_l)`) and of the
confidences of matched and mismatched positions. The per-layer acceptance :math:`\\alpha_l` then chooses the
next round's exit layer and draft length by tokens per layer,

.. math:: (E^*, \\gamma^*) = \\arg\\max_{l, \\gamma} \\frac{(1 - \\alpha_l^{\\gamma+1})/(1 - \\alpha_l)}{\\gamma l + L},

:func:`theory.del_exit_choice`; drafting also stops early when a drafted token's confidence falls below
:math:`\\tau_E = (\\bar c_{match} + \\bar c_{mismatch})/2` (dynamic draft exit). The statistics start from the
acceptance measured on calibration prompts.

Exit heads: the trained ``exit:K`` heads (:mod:`executor.drafters.exit_head`) cached for the target, when
there are any (``trained=None``, the default; ``trained=True`` requires them, ``False`` ignores them), at the
layers that have one unless ``layers`` is given; the untrained shared norm + LM head at the other layers. Any
``head(layer, hidden) -> logits`` can be passed instead (used for drafting and the shadow evaluation alike).
"""

from __future__ import annotations

import numpy as np
import torch

from executor.decoders.base import run_tree
from executor.drafters.exit_head import shallow_tree
from executor.methods._common import (
    calibration_profile,
    check_exit_layer,
    checkpoint_cards,
    default_exit_layer,
    missing_trained_head,
)
from executor.methods.adaptive_chain import AdaptiveChainDecoder, DraftPolicy
from executor.methods.base import Method, Prediction
from executor.methods.calibration import default_exit_head
from theory.checks import as_count

__all__ = [
    "DEL",
    "DELPolicy",
    "SwitchableExitDrafter",
    "cached_exit_heads",
    "exit_head_cards",
    "exit_head_function",
    "trained_exit_head",
]


def cached_exit_heads(target, layers=None) -> dict:
    """The newest cached trained ``exit:K`` head for each of ``layers`` (default: every layer) that has one."""
    from executor.drafters.exit_head import load_exit_head
    from executor.training.trainer import cached_checkpoints

    heads = {}
    for layer in range(1, target.config.n_layers) if layers is None else layers:
        found = cached_checkpoints(target, f"exit:{layer}")
        if found:
            weight = target.tok_embeddings.weight
            head = load_exit_head(target, found[0], f"exit:{layer}")[0]
            heads[layer] = head.to(weight.device, weight.dtype).requires_grad_(False).eval()
            heads[layer].freeze_for_drafting(target)
    return heads


def exit_head_cards(target, layers) -> list[dict]:
    """The cards of the cached trained ``exit:K`` heads at ``layers`` (the ones :func:`cached_exit_heads`
    loads)."""
    from executor.training.trainer import cached_checkpoints

    return checkpoint_cards(*(cached_checkpoints(target, f"exit:{layer}")[0] for layer in layers))


def exit_head_function(target, heads: dict):
    """``head(layer, hidden) -> logits``: the trained head of ``layer`` if any, else the untrained exit."""
    untrained = default_exit_head(target)

    def head(layer: int, hidden: torch.Tensor) -> torch.Tensor:
        trained = heads.get(layer)
        if trained is None:
            return untrained(layer, hidden)
        return trained.logits(target, trained(target, hidden[None])[0])

    return head


def trained_exit_head(target, layers, trained: bool | None, suggested: str):
    """``(head, trained layers)`` from the cached ``exit:K`` heads at ``layers`` (default: every layer):
    ``(None, [])`` when there are none or ``trained`` is ``False``; ``trained=True`` without any is a
    ``ValueError`` naming the command that trains ``suggested`` (e.g. ``"exit:6,12,18"``)."""
    if trained is False:
        return None, []
    heads = cached_exit_heads(target, layers)
    if trained and not heads:
        raise missing_trained_head(
            "exit:K head", "" if layers is None else f" at layers {list(layers)}", suggested
        )
    if not heads:
        return None, []
    return exit_head_function(target, heads), sorted(heads)


class SwitchableExitDrafter:
    """Early-exit drafter whose exit layer can change between rounds; logits from ``head(layer, hidden)``."""

    deterministic = False

    def __init__(self, target, exit_layer: int, head=None) -> None:
        self.model = target
        self.exit_layer = exit_layer
        self.head = head
        self.name = "exit:dynamic"

    def check_target(self, target) -> None:
        if target is not self.model:
            raise ValueError("the DEL drafter must be built on the target model it drafts for")

    def start(self, prompt, cache_slots) -> None:
        pass

    def draft_logits(self, state, tree, nodes):
        if self.head is None:
            return run_tree(self.model, tree, nodes, state.committed, exit_layer=self.exit_layer)
        hidden = shallow_tree(self.model, tree, nodes, state.committed, self.exit_layer)  # no LM head
        return self.head(self.exit_layer, hidden)

    def commit(self, state, tree, accepted_path) -> None:
        pass


class DELPolicy(DraftPolicy):
    """DEL's per-round choice of exit layer and length, with its online per-layer statistics."""

    def __init__(
        self,
        drafter: SwitchableExitDrafter,
        n_layers: int,
        layers: list[int],
        prior_accept: dict,
        prior_weight: float,
        *,
        max_gamma: int = 18,
        decay: float = 0.95,
        confidence_stop: bool = True,
    ) -> None:
        self.drafter = drafter
        self.n_layers = n_layers
        self.layers = list(layers)
        self.max_length = max_gamma
        self.decay = decay
        self.confidence_stop = confidence_stop
        self.matches = {l: prior_weight * prior_accept[l] for l in layers}
        self.mismatches = {l: prior_weight * (1 - prior_accept[l]) for l in layers}
        self.conf_match = dict.fromkeys(layers, 0.0)
        self.conf_mismatch = dict.fromkeys(layers, 0.0)
        self.n_match = dict.fromkeys(layers, 0.0)
        self.n_mismatch = dict.fromkeys(layers, 0.0)
        self.gamma = 1
        self.choices: list[tuple[int, int]] = []
        self.choose()

    def alpha(self, layer: int) -> float:
        total = self.matches[layer] + self.mismatches[layer]
        return self.matches[layer] / total if total > 0 else 0.0

    def threshold(self, layer: int) -> float:
        if self.n_match[layer] == 0 or self.n_mismatch[layer] == 0:
            return 0.0
        return 0.5 * (
            self.conf_match[layer] / self.n_match[layer] + self.conf_mismatch[layer] / self.n_mismatch[layer]
        )

    def choose(self) -> None:
        import theory

        alphas = {l: min(self.alpha(l), 1 - 1e-9) for l in self.layers}
        choice = theory.del_exit_choice(alphas, self.n_layers, max_gamma=self.max_length)
        self.drafter.exit_layer = choice.exit_layer
        self.gamma = choice.gamma
        self.choices.append((choice.exit_layer, choice.gamma))

    def round_length(self) -> int:
        return self.gamma

    def continue_after(self, drafted, logits, feature=None) -> bool:
        if not self.confidence_stop:
            return True
        return float(logits.softmax(-1).max()) >= self.threshold(self.drafter.exit_layer)

    def update(self, accept: dict, confidence: dict) -> None:
        """One round's shadow results: per layer, arrays of acceptance (0..1) and confidence per position."""
        for l in self.layers:
            a, c = accept[l], confidence[l]
            self.matches[l] = self.decay * self.matches[l] + float(a.sum())
            self.mismatches[l] = self.decay * self.mismatches[l] + float((1 - a).sum())
            hit = a >= 0.5
            self.conf_match[l] = self.decay * self.conf_match[l] + float(c[hit].sum())
            self.n_match[l] = self.decay * self.n_match[l] + float(hit.sum())
            self.conf_mismatch[l] = self.decay * self.conf_mismatch[l] + float(c[~hit].sum())
            self.n_mismatch[l] = self.decay * self.n_mismatch[l] + float((~hit).sum())
        self.choose()


class DELDecoder(AdaptiveChainDecoder):
    """The adaptive chain with shadow evaluation of every eligible exit from the verification pass."""

    name = "del"

    def __init__(self, target, drafter, *, policy: DELPolicy, head, sampling=None):
        super().__init__(target, drafter, policy=policy, sampling=sampling)
        self.head = head

    def step(self, state, generator):
        captured: dict[int, torch.Tensor] = {}
        layers = [*self.policy.layers, self.target.config.n_layers]
        handles = [
            self.target.layers[l - 1].register_forward_hook(
                lambda module, args, output, l=l: captured.__setitem__(l, output)
            )
            for l in layers
        ]
        try:
            log = super(AdaptiveChainDecoder, self).step(
                state, generator
            )  # the verification is the last pass
        finally:
            for handle in handles:
                handle.remove()
        valid = len(log.accepted_path)  # positions whose inputs were all accepted
        with torch.no_grad():
            final = self.head(self.target.config.n_layers, captured[self.target.config.n_layers][0, :valid])
            target_token = final.argmax(-1)
            p = None if self.sampling.greedy else self.sampling.probs(final)
            accept, confidence = {}, {}
            for l in self.policy.layers:
                logits = self.head(l, captured[l][0, :valid])
                if p is None:
                    accept[l] = (logits.argmax(-1) == target_token).double().numpy()
                else:
                    accept[l] = torch.minimum(p, self.sampling.probs(logits)).sum(-1).double().numpy()
                confidence[l] = logits.softmax(-1).max(-1).values.double().numpy()
        self.policy.update(accept, confidence)
        return log


class DEL(Method):
    name = "del"
    paper = "DEL, Zarch et al., COLM 2025, arXiv 2504.05598"

    def __init__(
        self,
        target,
        tokenizer=None,
        *,
        layers=None,
        max_gamma: int = 18,
        decay: float = 0.95,
        prior_weight: float = 20.0,
        confidence_stop: bool = True,
        head=None,
        trained: bool | None = None,
    ):
        super().__init__(target, tokenizer)
        n = target.config.n_layers
        self.trained_layers: list[int] = []
        if head is None:
            head, self.trained_layers = trained_exit_head(target, layers, trained, "exit:6,12,18")
            if self.trained_layers and layers is None:
                layers = self.trained_layers
        if layers is None:
            top = default_exit_layer(target)
            layers = sorted({max(1, top - 2 * i) for i in range(4)})
        self.layers = [check_exit_layer(target, l, "layers") for l in layers]
        if not self.layers:
            raise ValueError("layers must name at least one exit layer")
        self.max_gamma = as_count(max_gamma, "max_gamma")
        self.decay = float(decay)
        self.prior_weight = float(prior_weight)
        self.confidence_stop = bool(confidence_stop)
        self.head = head
        self.prior = {l: 0.5 for l in self.layers}
        self.n_layers = n

    def drafter_cards(self) -> list[dict]:
        return exit_head_cards(self.target, self.trained_layers)

    def options(self) -> dict:
        return {
            "layers": self.layers,
            "trained_layers": self.trained_layers,
            "max_gamma": self.max_gamma,
            "decay": self.decay,
        }

    def build(self, temperature: float = 0.0):
        head = self.head if self.head is not None else default_exit_head(self.target)
        drafter = SwitchableExitDrafter(self.target, self.layers[-1], self.head)
        policy = DELPolicy(
            drafter,
            self.n_layers,
            self.layers,
            self.prior,
            self.prior_weight,
            max_gamma=self.max_gamma,
            decay=self.decay,
            confidence_stop=self.confidence_stop,
        )
        return DELDecoder(self.target, drafter, policy=policy, head=head, sampling=self.sampling(temperature))

    def predict(self, calibration_prompts, temperature, max_new_tokens):
        import theory

        profile, _ = calibration_profile(
            self.target, calibration_prompts, self.layers, temperature, max_new_tokens, head=self.head
        )
        self.prior = {l: float(profile.accept[profile.row(l)].mean()) for l in self.layers}
        alphas = {l: min(a, 1 - 1e-9) for l, a in self.prior.items()}
        choice = theory.del_exit_choice(alphas, self.n_layers, max_gamma=self.max_gamma)
        return Prediction(
            choice.evaluation.tokens_per_step,
            {
                "alpha_per_layer": self.prior,
                "exit_layer": choice.exit_layer,
                "gamma": choice.gamma,
                "predicted_layer_speedup": choice.evaluation.speedup,
            },
        )

    def extra(self, decoder) -> dict:
        choices = decoder.policy.choices
        return {
            "exit_layers": np.bincount([c[0] for c in choices], minlength=self.n_layers).tolist(),
            "mean_gamma": float(np.mean([c[1] for c in choices])),
        }
