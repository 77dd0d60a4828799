"""Draft length: how many tokens to draft per speculative step, for chains and adaptive rules.

One module per problem:

* :mod:`theory.length.chain` -- Leviathan et al.'s expected tokens per step, speedup and best fixed draft
  length (ICML 2023, arXiv:2211.17192).
* :mod:`theory.length.models` -- acceptance models of a drafted chain (:class:`IIDAcceptance`,
  :class:`PositionalAcceptance`, :class:`ConfidenceBuckets`) and the costs of a step (:class:`LengthCosts`).
* :mod:`theory.length.rules` -- the length rules in use, behind one small interface (:class:`LengthRule`).
* :mod:`theory.length.evaluation` -- the exact evaluator of a rule (:func:`evaluate_rule`, renewal-reward)
  and its Monte Carlo twin (:func:`simulate_rule`).
* :mod:`theory.length.mdp` -- the SpecDec++ Markov decision process solved exactly
  (:func:`optimal_length_policy`; Huang, Guo and Wang, arXiv:2405.19715).
* :mod:`theory.length.exit_choice` -- DEL's joint choice of exit layer and draft length (:func:`del_exit_choice`).

Costs per step (SpecDec++, Section 3):

.. math:: \\mathrm{cost} = K\\,t_{draft} + t_{target} + c_{discard}\\,(K - A),

with ``K`` drafted and ``A`` accepted tokens; the long-run cost per generated token is
``E[cost] / E[tokens]`` by the renewal-reward theorem.
"""

from theory.length.chain import (
    DEFAULT_MAX_GAMMA,
    TIE_TOLERANCE,
    continuous_optimal_draft_length,
    expected_tokens,
    optimal_draft_length,
    speedup,
)
from theory.length.evaluation import (
    RuleEvaluation,
    SimulationResult,
    evaluate_rule,
    rank_rules,
    simulate_rule,
)
from theory.length.exit_choice import ExitChoice, del_exit_choice
from theory.length.mdp import LengthPolicy, PolicyRow, optimal_length_policy
from theory.length.models import (
    DEFAULT_MAX_LENGTH,
    AcceptanceModel,
    ConfidenceBuckets,
    IIDAcceptance,
    LengthCosts,
    PositionalAcceptance,
)
from theory.length.rules import (
    DraftState,
    LengthRule,
    entropy_stop,
    fixed_length_rule,
    heuristic_schedule,
    kangaroo_confidence_stop,
    specdecpp_threshold,
)

__all__ = [
    "AcceptanceModel",
    "ConfidenceBuckets",
    "continuous_optimal_draft_length",
    "DEFAULT_MAX_GAMMA",
    "DEFAULT_MAX_LENGTH",
    "del_exit_choice",
    "DraftState",
    "entropy_stop",
    "evaluate_rule",
    "ExitChoice",
    "expected_tokens",
    "fixed_length_rule",
    "heuristic_schedule",
    "IIDAcceptance",
    "kangaroo_confidence_stop",
    "LengthCosts",
    "LengthPolicy",
    "LengthRule",
    "optimal_draft_length",
    "optimal_length_policy",
    "PolicyRow",
    "PositionalAcceptance",
    "rank_rules",
    "RuleEvaluation",
    "SimulationResult",
    "simulate_rule",
    "specdecpp_threshold",
    "speedup",
    "TIE_TOLERANCE",
]
