"""DEL's joint choice of exit layer and draft length (Zarch et al., COLM 2025, arXiv:2504.05598)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from theory.checks import as_count, as_nonnegative
from theory.length.evaluation import RuleEvaluation, evaluate_rule
from theory.length.models import AcceptanceModel, IIDAcceptance, LengthCosts
from theory.length.rules import fixed_length_rule


@dataclass(frozen=True)
class ExitChoice:
    """DEL's choice: the exit layer and draft length with the most tokens per layer evaluated.

    ``tokens_per_layer[layer][gamma]`` is the TPL table; ``evaluation`` is the chosen pair's
    :class:`RuleEvaluation` (costs in layer-time units, speedup against the full model).
    """

    exit_layer: int
    gamma: int
    evaluation: RuleEvaluation
    tokens_per_layer: dict


def del_exit_choice(
    layer_models: Mapping[int, AcceptanceModel | float],
    n_layers: int,
    *,
    max_gamma: int = 18,
    layer_time: float = 1.0,
    discard_cost: float = 0.0,
) -> ExitChoice:
    """DEL's joint choice of exit layer and draft length (Zarch et al., COLM 2025, arXiv:2504.05598).

    Drafting with the first ``l`` of ``L = n_layers`` layers costs ``l`` layer passes per token and the
    verification ``L``; DEL picks :math:`(l^*, \\gamma^*) = \\arg\\max TPL(l, \\gamma)` over
    :math:`\\gamma \\in \\{0, \\dots, \\gamma_{max} - 1\\}` with the tokens-per-layer criterion

    .. math:: TPL(l, \\gamma) = \\frac{\\tau(\\alpha_l, \\gamma)}{\\gamma l + L},

    i.e. Leviathan's model with :math:`c = l/L`. Here :math:`\\tau` is evaluated exactly under each exit
    layer's acceptance model (a float means :class:`IIDAcceptance`), so per-position profiles are allowed.
    Ties go to the shallower layer, then the shorter draft.
    """
    n_layers = as_count(n_layers, "n_layers", minimum=2)
    max_gamma = as_count(max_gamma, "max_gamma")
    layer_time = as_nonnegative(layer_time, "layer_time")
    if layer_time == 0:
        raise ValueError("layer_time must be positive")
    if not isinstance(layer_models, Mapping) or not layer_models:
        raise ValueError("layer_models must be a non-empty mapping from exit layer to acceptance model")
    table: dict = {}
    best = None
    for layer in sorted(layer_models):
        layer = as_count(layer, "exit layer")
        if layer >= n_layers:
            raise ValueError(f"exit layer {layer} must be below n_layers = {n_layers}")
        model = layer_models[layer]
        if not isinstance(model, AcceptanceModel):
            model = IIDAcceptance(model, max_length=max(1, max_gamma - 1))
        costs = LengthCosts(layer * layer_time, n_layers * layer_time, discard_cost)
        table[layer] = {}
        for gamma in range(min(max_gamma - 1, model.horizon) + 1):
            evaluation = evaluate_rule(fixed_length_rule(gamma), model, costs)
            table[layer][gamma] = layer_time / evaluation.cost_per_token
            if best is None or evaluation.cost_per_token < best[2].cost_per_token * (1 - 1e-12):
                best = (layer, gamma, evaluation)
    layer, gamma, evaluation = best
    return ExitChoice(layer, gamma, replace(evaluation, name=f"DEL exit l={layer}, K={gamma}"), table)
