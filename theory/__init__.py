"""specbound.theory: what speculative decoding can achieve, computed exactly.

Conventions (see docs/): ``p`` is the target distribution and ``q`` the draft distribution; the last axis of
a probability array is the vocabulary and leading axes are a batch; computations are in float64; ``n`` is the
number of drafts per step and ``gamma`` the draft length of a chain. Nothing here imports torch.
"""

# Each problem family lives in its own module; the public names are re-exported here.
from theory import strategies  # hypothesis strategies for users' property tests
from theory.layer_parallel import (
    LayerParallelSpeedup,
    break_even_alpha_drop,
    layer_parallel_draft_time,
    layer_parallel_speedup,
)
from theory.length import (
    ConfidenceBuckets,
    DraftState,
    ExitChoice,
    IIDAcceptance,
    LengthCosts,
    LengthPolicy,
    LengthRule,
    PositionalAcceptance,
    RuleEvaluation,
    continuous_optimal_draft_length,
    del_exit_choice,
    entropy_stop,
    evaluate_rule,
    expected_tokens,
    fixed_length_rule,
    heuristic_schedule,
    kangaroo_confidence_stop,
    optimal_draft_length,
    optimal_length_policy,
    rank_rules,
    simulate_rule,
    specdecpp_threshold,
    speedup,
)
from theory.lossless import LosslessReport, check_lossless
from theory.multidraft import (
    AcceptanceCertificate,
    acceptance_rate,
    optimal_acceptance,
    optimal_acceptance_certificate,
)
from theory.optimal_verifier import OptimalVerifier, optimal_verifier
from theory.optimal_verifier_wor import optimal_verifier_wor
from theory.staged import StagedStep, expected_rounds, staged_step
from theory.tree_growth import DySpecTree, dynamic_tree, greedy_tree
from theory.tree_planning import PlanCandidate, TreePlan, drafting_seconds, plan_tree
from theory.trees import (
    Tree,
    TreeSolution,
    optimal_tree,
    simulate_tree_tokens,
    tree_expected_tokens,
    tree_token_distribution,
)
from theory.truncated import (
    Interval,
    TopKPositions,
    optimal_acceptance_interval,
    overlap_interval,
    top_k_positions,
    truncated_interval,
    verifier_acceptance_interval,
)
from theory.verifiers import Verifier, verifier

__all__ = [
    "Interval",
    "TopKPositions",
    "optimal_acceptance_interval",
    "overlap_interval",
    "top_k_positions",
    "truncated_interval",
    "verifier_acceptance_interval",
    "acceptance_rate",
    "AcceptanceCertificate",
    "break_even_alpha_drop",
    "check_lossless",
    "ConfidenceBuckets",
    "continuous_optimal_draft_length",
    "del_exit_choice",
    "DraftState",
    "dynamic_tree",
    "DySpecTree",
    "entropy_stop",
    "evaluate_rule",
    "ExitChoice",
    "expected_rounds",
    "expected_tokens",
    "fixed_length_rule",
    "greedy_tree",
    "heuristic_schedule",
    "IIDAcceptance",
    "kangaroo_confidence_stop",
    "layer_parallel_draft_time",
    "layer_parallel_speedup",
    "LayerParallelSpeedup",
    "LengthCosts",
    "LengthPolicy",
    "LengthRule",
    "LosslessReport",
    "optimal_acceptance",
    "optimal_acceptance_certificate",
    "optimal_draft_length",
    "optimal_length_policy",
    "optimal_tree",
    "optimal_verifier",
    "optimal_verifier_wor",
    "OptimalVerifier",
    "plan_tree",
    "drafting_seconds",
    "PlanCandidate",
    "PositionalAcceptance",
    "rank_rules",
    "RuleEvaluation",
    "simulate_rule",
    "simulate_tree_tokens",
    "specdecpp_threshold",
    "speedup",
    "staged_step",
    "StagedStep",
    "strategies",
    "Tree",
    "tree_expected_tokens",
    "tree_token_distribution",
    "TreePlan",
    "TreeSolution",
    "Verifier",
    "verifier",
]
