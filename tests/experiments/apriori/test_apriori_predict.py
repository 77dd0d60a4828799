"""experiments.apriori.predict: every predictor against an exact oracle derived here.

A chain under positional acceptance gives Leviathan's geometric sum; a multi-draft step 1 + alpha; a static
tree Sequoia's path-product sum; the dynamic tree is rebuilt by hand; the length law of a stop rule sums to 1
and reproduces theory.evaluate_rule; the executor's BucketStopRule stops exactly where the theory rule does.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

import theory
from experiments.apriori.calibrate import Calibration, LatencyProfile
from experiments.apriori.predict import (
    BucketStopRule,
    DecoderConfig,
    bucket_model,
    length_law,
    level_tree,
    plan_configurations,
    predict,
    stop_rules,
)

LATENCY = LatencyProfile({n: 1.0 + 0.1 * (n - 1) for n in range(1, 13)}, 0.2)


def calibration(a=0.6, depth=4, temperature=1.0) -> Calibration:
    return Calibration(
        temperature=temperature,
        positional=[a] * depth,
        rank_matrix=[[a, 0.5 * (1 - a)]] * depth,
        multidraft={"rrs-n2": 0.7, "kseq-n3": 0.75},
        bound={"rrs-n2": 0.72, "kseq-n3": 0.76},
        buckets={
            "edges": [0.5],
            "confidence": [0.3, 0.9],
            "acceptance": [0.2, 0.9],
            "probability": [0.4, 0.6],
        },
        events=[100] * depth,
        latency=LATENCY,
    )


@pytest.mark.parametrize("gamma", [1, 2, 4])
def test_chain_prediction_is_the_geometric_sum(gamma):
    a = 0.6
    prediction = predict(DecoderConfig("c", "chain", gamma=gamma), calibration(a))
    assert prediction.tau == pytest.approx(theory.expected_tokens(a, gamma))
    assert prediction.acceptance == pytest.approx([a ** (i + 1) for i in range(gamma)])
    step = 1.0 + 0.1 * gamma + 0.2 * gamma
    assert prediction.step_time == pytest.approx(step) and prediction.speedup == pytest.approx(
        prediction.tau / step
    )


def test_step_times_charge_the_measured_draft_pass_of_each_level():
    """With the calibration chains' pass times, a step of ``k`` draft levels pays the first ``k`` of them:
    the chain its gamma, the multi-draft step its root pass, a tree its depth, a stop rule per outcome."""
    cal = calibration(a=0.6)
    cal.latency = replace(LATENCY, pass_times=[0.3, 0.1])
    chain = predict(DecoderConfig("c", "chain", gamma=3), cal)
    assert chain.step_time == pytest.approx(1.3 + 0.3 + 0.1 + 0.1)
    multidraft = predict(DecoderConfig("m", "multidraft", verifier="kseq", n=3), cal)
    assert multidraft.step_time == pytest.approx(1.3 + 0.3)
    tree = predict(DecoderConfig("t", "tree", verifier="rrs_wor", parents=(-1, 0, 0, 1)), cal)
    assert tree.step_time == pytest.approx(1.3 + 0.3 + 0.1)
    stop = predict(DecoderConfig("s", "stop", gamma=2, rule="kangaroo", threshold=0.5), cal)
    k_law, _ = length_law(theory.kangaroo_confidence_stop(0.5, max_length=2), bucket_model(cal, 2))
    # k drafts cost k passes, plus the pass whose logits the rule stopped on when k < gamma
    passes = {0: 0.3, 1: 0.3 + 0.1, 2: 0.3 + 0.1}
    expected = sum(w * (LATENCY.t(k + 1) + passes[k]) for k, w in enumerate(k_law))
    assert stop.step_time == pytest.approx(expected)


def test_multidraft_prediction_is_one_plus_the_root_acceptance():
    prediction = predict(DecoderConfig("m", "multidraft", verifier="kseq", n=3), calibration())
    assert prediction.tau == pytest.approx(1.75) and prediction.acceptance == [0.75]
    assert prediction.speedup == pytest.approx(1.75 / (1.3 + 0.2))


def test_tree_prediction_sums_path_products():
    cal = calibration(a=0.6)
    a, b = cal.rank_matrix[0]
    # root with two children; the first child has one child: 1 + a + b + a*a
    prediction = predict(DecoderConfig("t", "tree", verifier="rrs_wor", parents=(-1, 0, 0, 1)), cal)
    assert prediction.tau == pytest.approx(1 + a + b + a * a)
    assert prediction.acceptance == pytest.approx([a + b, a * a])
    assert prediction.step_time == pytest.approx(1.3 + 2 * 0.2)


def test_level_tree_takes_the_best_candidates_of_each_level():
    # acc = [0.6, 0.2]; budget 6, branching 2: level 1 = both root children (0.6, 0.2); level 2 candidates
    # 0.36 (first child's first), 0.12, 0.12, 0.04 -> 0.36 and the first 0.12 (the first child's second).
    tree, passes = level_tree([[0.6, 0.2]], budget=6, max_depth=3, branching=2)
    assert list(tree.parents[:5]) == [-1, 0, 0, 1, 1]
    assert tree.size == 6 and passes == 3  # the sixth node is drafted at level 3
    tree, passes = level_tree([[0.6, 0.2]], budget=3, max_depth=3, branching=2)
    assert list(tree.parents) == [-1, 0, 0] and passes == 1


def test_length_law_reproduces_the_theory_evaluation():
    model = bucket_model(calibration(), 4)
    for rule in (
        theory.specdecpp_threshold(0.5, max_length=4),
        theory.kangaroo_confidence_stop(0.5, max_length=4),
    ):
        k_law, reach = length_law(rule, model)
        evaluation = theory.evaluate_rule(rule, model, theory.LengthCosts(0.2, 1.0))
        assert k_law.sum() == pytest.approx(1.0) and k_law[0] == 0.0
        assert 1 + reach.sum() == pytest.approx(evaluation.tokens_per_step)
        assert np.arange(5) @ k_law == pytest.approx(evaluation.drafted_per_step)


def test_kangaroo_length_law_by_hand():
    # Continue after a token iff its bucket is confident (0.9 >= 0.5): P(K = k) = 0.6**(k-1) * 0.4 for k < 4.
    k_law, _ = length_law(theory.kangaroo_confidence_stop(0.5, max_length=4), bucket_model(calibration(), 4))
    assert k_law == pytest.approx([0, 0.4, 0.24, 0.144, 0.216])


def logits_with_confidence(confidence: float, vocab: int = 50) -> torch.Tensor:
    rest = (1 - confidence) / (vocab - 1)
    return torch.log(torch.tensor([confidence] + [rest] * (vocab - 1)))


def test_bucket_stop_rule_stops_where_the_theory_rule_does():
    cal = calibration()
    rule = BucketStopRule("kangaroo", 0.5, cal.buckets, horizon=4)
    # positions' confidences: 0.95, 0.95, 0.2, 0.95 -> tokens 1, 2, 3 drafted; stop after the unconfident 3rd
    decisions = [rule(depth, logits_with_confidence(c)) for depth, c in enumerate([0.95, 0.95, 0.2, 0.95])]
    assert decisions == [False, False, False, True]
    rule = BucketStopRule("specdecpp", 0.5, cal.buckets, horizon=4)
    # acceptances 0.9, 0.9 -> P(some rejected) = 0.19; then 0.2 -> 1 - 0.162 > 0.5: stop after the third
    decisions = [rule(depth, logits_with_confidence(c)) for depth, c in enumerate([0.95, 0.95, 0.2, 0.95])]
    assert decisions == [False, False, False, True]


def test_stop_thresholds_come_from_the_optimal_policy():
    cal = calibration()
    thresholds = stop_rules(cal, 4)
    policy = theory.optimal_length_policy(bucket_model(cal, 4), theory.LengthCosts(0.2, 1.0))
    assert thresholds["specdecpp"] == pytest.approx(np.clip(policy.rejection_threshold, 0, 1))
    assert thresholds["kangaroo"] in (0.3, 0.9, 1.0)


@pytest.mark.parametrize("pass_times", [None, [0.6, 0.01]])
def test_plan_configurations_plan_with_the_draft_passes_the_predictions_charge(pass_times):
    """chain-opt is plan_tree's best chain (width 1) and tree-plan its best tree, both on the measured t(n) and
    the calibration chains' draft passes when there are (the profile's draft pass otherwise)."""
    cal = calibration()
    cal.latency = replace(LATENCY, pass_times=pass_times)
    configs, planning = plan_configurations(cal, multidraft=(("rrs", 2),), budgets=(4,), max_budget=8)
    labels = [c.label for c in configs]
    assert labels[0] == "ar" and "chain-opt" in labels and "tree-plan" in labels and "tree-dyspec" in labels
    draft = pass_times or 0.2
    table = {n: LATENCY.target_time[n] for n in range(1, 9)}
    chain = theory.plan_tree(
        np.array(cal.positional)[:, None], table, draft, max_budget=5, max_depth=4, max_width=1
    )
    assert next(c for c in configs if c.label == "chain-opt").gamma == max(chain.tree.depth, 1)
    assert planning["gamma_star"] == chain.tree.depth
    leviathan = theory.optimal_draft_length(np.array(cal.positional), cal.cost_ratio, max_gamma=4)
    assert planning["gamma_star_leviathan"] == leviathan
    plan = theory.plan_tree(np.array(cal.rank_matrix), table, draft, max_budget=8, max_depth=4, max_width=2)
    tree = next(c for c in configs if c.label == "tree-plan")
    assert list(tree.parents) == list(plan.tree.parents)
    assert predict(tree, cal).tau == pytest.approx(plan.expected_tokens)
    assert planning["planner_curve"][str(plan.size)] == pytest.approx(plan.speedup)
    if pass_times:  # a dear first pass and nearly free later ones: the plans go deeper than at 0.2 a level
        flat, _ = plan_configurations(calibration(), multidraft=(("rrs", 2),), budgets=(4,), max_budget=8)
        gamma = {c.label: c.gamma for c in flat}["chain-opt"]
        assert next(c for c in configs if c.label == "chain-opt").gamma > gamma


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind"):
        predict(DecoderConfig("x", "beam"), calibration())
