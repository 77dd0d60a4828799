"""Small helpers shared by the method modules: default exit layer, calibration runs, option checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from executor.methods.calibration import ExitProfile, continuation, exit_profile
from theory.checks import as_count

__all__ = [
    "MethodDrafter",
    "cached_head_layer",
    "calibration_profile",
    "checkpoint_cards",
    "check_exit_layer",
    "conditional_acceptance",
    "deepest_exit_head",
    "default_exit_layer",
    "missing_trained_head",
]


def default_exit_layer(target) -> int:
    """The early-exit layer used when none is given: 13/15 of the depth (26 of SmolLM2's 30 layers, where
    the untrained exit agrees best with the final layer; 1 of a 2-layer test model)."""
    return max(1, min(target.config.n_layers - 1, round(target.config.n_layers * 13 / 15)))


def check_exit_layer(target, exit_layer, name: str = "exit_layer") -> int:
    exit_layer = as_count(exit_layer, name)
    if exit_layer >= target.config.n_layers:
        raise ValueError(
            f"{name} must be below the target's {target.config.n_layers} layers, got {exit_layer}"
        )
    return exit_layer


def cached_head_layer(target, family: str, exit_layer, trained, *, deepest: bool, noun: str, suggested: str):
    """``(layer, checkpoint)`` of the cached trained ``family:K`` head a method drafts with.

    ``exit_layer=None`` looks at every layer, the deepest first if ``deepest`` (else the shallowest first);
    a given ``exit_layer`` looks at that layer only. ``trained=None`` falls back to ``(exit_layer, None)``
    when nothing is cached, ``trained=False`` never looks, ``trained=True`` without a checkpoint is a
    ``ValueError`` naming the command that trains ``suggested`` (e.g. ``"exit:24"``).
    """
    if trained is False:
        return exit_layer, None
    from executor.training.trainer import cached_checkpoints

    layers = list(range(1, target.config.n_layers)) if exit_layer is None else [exit_layer]
    for layer in reversed(layers) if deepest else layers:
        found = cached_checkpoints(target, f"{family}:{layer}")
        if found:
            return layer, found[0]
    if trained:
        raise missing_trained_head(
            f"{family}:K {noun}", "" if exit_layer is None else f" at layer {exit_layer}", suggested
        )
    return exit_layer, None


def deepest_exit_head(target, exit_layer, trained):
    """``(layer, checkpoint)`` of a method drafting through one exit (staged, EasySpec): the deepest cached
    trained ``exit:K`` head, or the one at ``exit_layer`` (:func:`cached_head_layer`); without one, the
    untrained exit at ``exit_layer`` (default :func:`default_exit_layer`) and ``None``."""
    layer, path = cached_head_layer(
        target, "exit", exit_layer, trained, deepest=True, noun="head", suggested="exit:24"
    )
    return (default_exit_layer(target) if layer is None else layer), path


def missing_trained_head(what: str, where: str, suggested: str) -> ValueError:
    """The error of ``trained=True`` when no trained ``what`` (e.g. ``"exit:K head"``) is cached ``where``."""
    return ValueError(
        f"trained=True but no trained {what} is cached for this target{where} "
        f"(`specbound train-drafter --kind {suggested}`)"
    )


def checkpoint_cards(*sources) -> list[dict]:
    """The cards of trained checkpoints: each source a drafter (its ``card``, if any), a checkpoint directory or
    ``None`` (skipped)."""
    import json

    from executor.training.checkpoint import CARD_NAME

    cards = []
    for source in sources:
        if source is None:
            continue
        if isinstance(source, (str, Path)):
            cards.append(json.loads((Path(source) / CARD_NAME).read_text()))
        elif getattr(source, "card", None):
            cards.append(source.card)
    return cards


class MethodDrafter:
    """A method's drafter: a spec of ``specbound generate --drafter`` or a factory ``() -> Drafter``.

    ``None`` picks the trained feature head when one is cached for the target (the papers draft with a small
    trained model), else the early exit at ``exit_layer``. Calling it returns a drafter; a parsed spec is
    built once (its head loaded once) and every decoder restarts it.
    """

    def __init__(self, target, drafter, exit_layer: int) -> None:
        if drafter is None:
            from executor.drafters.parse import trained_default_drafter

            drafter = trained_default_drafter(target, f"early-exit:{exit_layer}")
        if not (isinstance(drafter, str) or callable(drafter)):
            raise ValueError(
                f"drafter must be a drafter spec string or a factory, got {type(drafter).__name__}"
            )
        self.target = target
        self.spec = drafter
        self.exit_layer = exit_layer
        self._instance = None

    @property
    def name(self) -> str | None:
        """The spec string, or ``None`` for a factory."""
        return self.spec if isinstance(self.spec, str) else None

    def __call__(self):
        if not isinstance(self.spec, str):
            return self.spec()
        if self.spec == f"early-exit:{self.exit_layer}":
            from executor.drafters import EarlyExitDrafter

            return EarlyExitDrafter(self.target, self.exit_layer)
        if self._instance is None:
            from executor.drafters.parse import parse_drafter

            self._instance = parse_drafter(self.spec, self.target)
        return self._instance


def calibration_profile(
    target, prompts: list[list[int]], layers, temperature: float, max_new_tokens: int, head=None
) -> tuple[ExitProfile, list[np.ndarray]]:
    """Exit profile of ``layers`` over each calibration prompt's plain-decoding continuation.

    Returns the pooled profile and, per prompt, the slice boundaries (for run lengths per sequence).
    """
    profiles = []
    for index, prompt in enumerate(prompts):
        text = continuation(target, prompt, max_new_tokens, temperature, seed=1000 + index)
        if not text:
            continue
        profiles.append(exit_profile(target, prompt + text, len(prompt), layers, temperature, head=head))
    if not profiles:
        raise ValueError("calibration_prompts produced no continuation to measure")
    return ExitProfile.concatenate(profiles), profiles


def conditional_acceptance(results, gamma: int) -> list[float]:
    """Per-depth conditional acceptance ``P(depth j accepted | depth j - 1 reached)`` pooled over method
    results of chains that always draft ``gamma`` tokens when they draft (drafting steps counted from the
    verified positions: ``(verified - steps) / gamma``)."""
    reached = np.zeros(gamma + 1)
    for result in results:
        drafting = (result.extra["verified_positions"] - result.steps) / gamma
        reached[0] += drafting
        for depth, fraction in enumerate(result.acceptance_by_position[:gamma]):
            reached[depth + 1] += fraction * drafting
    return [float(reached[j + 1] / reached[j]) if reached[j] else 0.0 for j in range(gamma)]
