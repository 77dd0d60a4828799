"""Draft length: Leviathan's formulas, the SpecDec++ MDP and the practical stopping rules.

Oracles are computed here independently of theory/: expected tokens by enumerating every accept/reject
pattern, rule evaluations by enumerating every bucket sequence, the optimal policy by exhaustive search over
all deterministic stopping rules on small horizons, the Hugging Face schedule by powering its transition
matrix, and Monte Carlo z-tests (fixed seeds) with a negative control.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from tests.goodness_of_fit import z_score
from theory import (
    ConfidenceBuckets,
    IIDAcceptance,
    LengthCosts,
    PositionalAcceptance,
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
    simulate_rule,
    specdecpp_threshold,
    speedup,
)
from theory.length import TIE_TOLERANCE

rates = st.floats(0.0, 1.0)
inner_rates = st.floats(0.05, 0.98)
draft_costs = st.floats(0.0, 0.6)


# ------------------------------------------------------------------------------------------------ oracles
def enumerated_tokens(alphas) -> float:
    """E[tokens] by summing over every accept/reject pattern of the drafted tokens (bonus token included)."""
    total = 0.0
    for pattern in itertools.product((True, False), repeat=len(alphas)):
        probability = np.prod([a if ok else 1.0 - a for a, ok in zip(alphas, pattern, strict=False)])
        accepted = next((i for i, ok in enumerate(pattern) if not ok), len(alphas))
        total += probability * (1 + accepted)
    return total


def brute_force_step(decide, laws, horizon):
    """E[drafted], E[accepted] of a memoryless rule by enumerating bucket sequences and acceptance outcomes.

    ``laws[j]`` = (probabilities, acceptances, confidences, entropies) at position j + 1; ``decide`` receives
    (k, pi, buckets so far) and returns True to continue.
    """

    def walk(buckets, probability):
        k = len(buckets)
        pi = float(np.prod([laws[j][1][b] for j, b in enumerate(buckets)]))
        if k == horizon or not decide(k, pi, buckets):
            # accepted count: first rejection among the drafted tokens, enumerated
            accepts = [laws[j][1][b] for j, b in enumerate(buckets)]
            mean_accepted = 0.0
            for pattern in itertools.product((True, False), repeat=k):
                weight = np.prod([a if ok else 1 - a for a, ok in zip(accepts, pattern, strict=False)])
                mean_accepted += weight * next((i for i, ok in enumerate(pattern) if not ok), k)
            return probability * k, probability * mean_accepted
        drafted = accepted = 0.0
        for b, p_b in enumerate(laws[k][0]):
            if p_b > 0:
                d, a = walk(buckets + (b,), probability * p_b)
                drafted, accepted = drafted + d, accepted + a
        return drafted, accepted

    return walk((), 1.0)


def pi_key(pi) -> float:
    """A state's P(all accepted) as a table key: Python's correctly rounded ``round`` on a Python float. (numpy's
    ``round`` of a float64 scales by 1e12 and rounds, which differs on near-ties: 0.6470444754235 became
    0.647044475424 in one place and 0.647044475423 in another, and the exhaustive search lost that state.)"""
    return round(float(pi), 12)


def ratio(drafted, accepted, costs):
    return costs.per_step(drafted, accepted) / (1.0 + accepted)


def states_of(laws, horizon):
    """Every reachable (k, pi) with k < horizon, computed from the laws."""
    states = []
    frontier = {1.0}
    for k in range(horizon):
        states += [(k, pi_key(pi)) for pi in sorted(frontier)]
        frontier = {pi * a for pi in frontier for p, a in zip(laws[k][0], laws[k][1], strict=False) if p > 0}
    return states


# ------------------------------------------------------------------------------------- Leviathan's formulas
def test_expected_tokens_and_speedup_hand_values():
    assert expected_tokens(0.8, 5) == pytest.approx(3.68928, abs=1e-12)
    assert speedup(0.8, 5, 0.05) == pytest.approx(2.951424, abs=1e-12)
    assert expected_tokens(0.8, 4) == pytest.approx(3.3616, abs=1e-12)
    assert speedup(0.8, 4, 0.1) == pytest.approx(2.4011428571, abs=1e-9)
    # SpecDec++ reference example: per-position rates, c = 0.05 -> best K = 5, E = 3.5776, S = 2.86208
    alphas = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]
    assert optimal_draft_length(alphas, 0.05) == 5
    assert expected_tokens(alphas, 5) == pytest.approx(3.5776, abs=1e-12)
    assert speedup(alphas, 5, 0.05) == pytest.approx(2.86208, abs=1e-12)


@given(rates, st.integers(0, 8))
def test_expected_tokens_equals_enumeration_of_accept_patterns(alpha, gamma):
    assert expected_tokens(alpha, gamma) == pytest.approx(enumerated_tokens([alpha] * gamma), abs=1e-9)


@given(st.lists(rates, min_size=1, max_size=7), st.data())
def test_per_position_expected_tokens_equals_enumeration(alphas, data):
    gamma = data.draw(st.integers(0, len(alphas)))
    assert expected_tokens(alphas, gamma) == pytest.approx(enumerated_tokens(alphas[:gamma]), abs=1e-9)


@given(rates, st.integers(0, 60))
@example(0.99999, 3)  # found by the deep profile: the closed form's 1 - alpha^4 cancelled to 1.5e-12
def test_expected_tokens_is_the_geometric_sum_to_a_few_ulps(alpha, gamma):
    exact = sum(Fraction(alpha) ** i for i in range(gamma + 1))  # alpha's float value, summed exactly
    assert expected_tokens(alpha, gamma) == pytest.approx(float(exact), rel=1e-15)  # ~4 roundings of 1 ulp


@given(st.integers(0, 200))
def test_expected_tokens_at_full_acceptance_is_gamma_plus_one_exactly(gamma):
    assert expected_tokens(1.0, gamma) == gamma + 1
    assert expected_tokens(0.0, gamma) == 1.0


@given(st.lists(rates, min_size=1, max_size=20), st.integers(0, 30))
def test_vectorised_constant_rates_match_scalar_calls(alphas, gamma):
    vector = expected_tokens(np.array(alphas), gamma, per_position=False)
    assert np.allclose(vector, [expected_tokens(a, gamma) for a in alphas], rtol=1e-12, atol=0)


@given(inner_rates, st.integers(0, 60))
def test_expected_tokens_grows_with_gamma_and_stays_below_the_chain_bound(alpha, gamma):
    assert expected_tokens(alpha, gamma + 1) >= expected_tokens(alpha, gamma)
    if alpha ** (gamma + 1) > 1e-12:  # below that the increment is lost to float64 rounding
        assert expected_tokens(alpha, gamma + 1) > expected_tokens(alpha, gamma)
    assert expected_tokens(alpha, gamma) < 1.0 / (1.0 - alpha) + 1e-12


@given(rates, draft_costs)
def test_optimal_draft_length_is_the_argmax_of_speedup(alpha, c):
    best = optimal_draft_length(alpha, c, max_gamma=40)
    values = [speedup(alpha, g, c) for g in range(41)]
    near_best = [g for g in range(41) if values[g] >= max(values) * (1 - 1e-12)]  # ties up to rounding
    assert best == min(near_best)  # the best value, and on ties the shorter draft


@given(inner_rates, st.floats(0.0, 0.95))
def test_speculation_pays_exactly_when_alpha_exceeds_c(alpha, c):
    # Leviathan Corollary 3.9: alpha > c implies gamma = 1 gives (1 + alpha) / (1 + c) > 1.
    assume(abs(alpha - c) > 1e-9)
    assert speedup(alpha, 1, c) == pytest.approx((1 + alpha) / (1 + c))
    assert (optimal_draft_length(alpha, c) >= 1) == (alpha > c)


def grid_argmax(alpha, c):
    """Maximise S over real gamma on a fine grid, then refine the grid around the best point."""
    low, high = 0.0, 400.0
    for _ in range(4):
        gamma = np.linspace(low, high, 20001)
        values = (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))
        best = gamma[np.argmax(values)]
        step = gamma[1] - gamma[0]
        low, high = max(0.0, best - 2 * step), best + 2 * step
    return best


@pytest.mark.parametrize(
    "alpha, c, expected", [(0.8, 0.05, 7.8567), (0.9, 0.1, 9.6457), (0.6, 0.5, 0.6945), (0.5, 0.2, 1.4521)]
)
def test_continuous_optimum_reference_values(alpha, c, expected):
    assert continuous_optimal_draft_length(alpha, c) == pytest.approx(expected, abs=1e-4)


@given(st.floats(0.05, 0.97), st.floats(0.005, 0.9))
def test_continuous_optimum_matches_a_grid_maximisation(alpha, c):
    assume(continuous_optimal_draft_length(alpha, c) < 350)
    assert continuous_optimal_draft_length(alpha, c) == pytest.approx(grid_argmax(alpha, c), abs=1e-4)


@given(st.floats(0.05, 0.97), st.floats(0.005, 0.9))
def test_integer_optimum_is_a_neighbour_of_the_continuous_one(alpha, c):
    # S is quasi-concave in gamma, so the best integer is the floor or the ceiling of the real optimum.
    real = continuous_optimal_draft_length(alpha, c)
    assume(real < 120)
    assert optimal_draft_length(alpha, c, max_gamma=200) in {int(np.floor(real)), int(np.ceil(real))}


def test_continuous_optimum_edge_cases():
    assert continuous_optimal_draft_length(0.0, 0.1) == 0.0
    assert continuous_optimal_draft_length(0.9, 1.0) == 0.0
    assert continuous_optimal_draft_length(1.0, 0.1) == float("inf")
    assert continuous_optimal_draft_length(0.5, 0.0) == float("inf")


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: expected_tokens(1.2, 3), "alpha"),
        (lambda: expected_tokens(float("nan"), 3), "alpha"),
        (lambda: expected_tokens([0.5, -0.1], 2), "alpha"),
        (lambda: expected_tokens(0.5, -1), "gamma"),
        (lambda: expected_tokens([0.5, 0.5], 3), "gamma"),
        (lambda: speedup(0.5, 2, -0.1), "c"),
        (lambda: optimal_draft_length(0.5, 0.1, max_gamma=-1), "max_gamma"),
        (lambda: continuous_optimal_draft_length(1.5, 0.1), "alpha"),
        (lambda: IIDAcceptance(1.5), "alpha"),
        (lambda: IIDAcceptance(0.5, max_length=0), "max_length"),
        (lambda: PositionalAcceptance([0.5, 1.1]), "alphas"),
        (lambda: ConfidenceBuckets([0.9, 0.5], [0.9, 0.5], [0.5, 0.6]), "bucket_probabilities"),
        (lambda: ConfidenceBuckets([0.9, 0.5], [0.9, 1.5], [0.5, 0.5]), "acceptance_per_bucket"),
        (lambda: ConfidenceBuckets([0.9], [0.9, 0.5], [0.5, 0.5]), "confidences"),
        (lambda: LengthCosts(-0.1), "draft_time"),
        (lambda: LengthCosts(0.1, 0.0), "target_time"),
        (lambda: LengthCosts(0.1, 1.0, -1.0), "discard_cost"),
        (lambda: fixed_length_rule(-1), "length"),
        (lambda: specdecpp_threshold(1.5), "threshold"),
        (lambda: specdecpp_threshold(0.5, min_length=4, max_length=2), "max_length"),
        (lambda: kangaroo_confidence_stop(-0.1), "threshold"),
        (lambda: heuristic_schedule(0), "start"),
        (lambda: evaluate_rule(entropy_stop(0.7), IIDAcceptance(0.5), LengthCosts(0.1)), "entropies"),
        (lambda: del_exit_choice({40: 0.5}, 32), "exit layer"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ------------------------------------------------------------------------------------------ rule evaluation
def laws_of(model):
    return [
        (law.probability, law.acceptance, law.confidence, law.entropy)
        for law in (model.law(j) for j in range(1, model.horizon + 1))
    ]


bucket_models = st.builds(
    lambda acc, weight, horizon: ConfidenceBuckets(
        confidences=[0.9, 0.3],
        acceptance_per_bucket=acc,
        bucket_probabilities=[weight, 1 - weight],
        entropies=[0.3, 2.0],
        max_length=horizon,
    ),
    st.lists(inner_rates, min_size=2, max_size=2),
    st.floats(0.1, 0.9),
    st.integers(1, 3),
)
small_models = st.one_of(
    st.builds(lambda a, h: IIDAcceptance(a, max_length=h), rates, st.integers(1, 5)),
    st.builds(PositionalAcceptance, st.lists(rates, min_size=1, max_size=5)),
    bucket_models,
)
costs_strategy = st.builds(LengthCosts, draft_costs, st.floats(0.5, 2.0), st.floats(0.0, 0.3))


@given(small_models, costs_strategy, st.integers(0, 5), st.floats(0.0, 1.0))
def test_evaluation_equals_enumeration_of_bucket_sequences(model, costs, length, threshold):
    laws = laws_of(model)
    rules = {
        "fixed": (fixed_length_rule(length), lambda k, pi, b: k < length),
        "specdec++": (specdecpp_threshold(threshold), lambda k, pi, b: k == 0 or 1 - pi <= threshold),
        "kangaroo": (
            kangaroo_confidence_stop(threshold, max_length=4),
            lambda k, pi, b: k < 4 and (k == 0 or laws[k - 1][2][b[-1]] >= threshold),
        ),
    }
    for rule, decide in rules.values():
        drafted, accepted = brute_force_step(decide, laws, model.horizon)
        evaluation = evaluate_rule(rule, model, costs)
        assert evaluation.drafted_per_step == pytest.approx(drafted, abs=1e-9)
        assert evaluation.tokens_per_step == pytest.approx(1 + accepted, abs=1e-9)
        assert evaluation.cost_per_token == pytest.approx(ratio(drafted, accepted, costs), rel=1e-9)


@given(rates, st.integers(0, 30), st.floats(0.0, 1.0))
@example(0.99999, 3, 0.0)  # found by the deep profile (expected_tokens' closed form was 1.5e-12 off)
def test_fixed_length_evaluation_is_leviathans_speedup(alpha, length, c):
    evaluation = evaluate_rule(fixed_length_rule(length), IIDAcceptance(alpha, max_length=30), LengthCosts(c))
    assert evaluation.tokens_per_step == pytest.approx(expected_tokens(alpha, length), rel=1e-12)
    assert evaluation.speedup == pytest.approx(speedup(alpha, length, c), rel=1e-12)
    # SpecDec++'s decomposition T/N = t_d (1 + D - V) + t_t V equals (K t_d + t_t) / E for a fixed K
    tokens = evaluation.tokens_per_step
    discard_rate = (length + 1 - tokens) / tokens  # rejected draft tokens per generated token
    verify_rate = 1 / tokens
    assert evaluation.cost_per_token == pytest.approx(c * (1 + discard_rate - verify_rate) + verify_rate)


def heuristic_oracle(accept_all, horizon, start=5):
    """Stationary law of the +2/-1 schedule by powering its transition matrix from K = start."""
    size = horizon
    transition = np.zeros((size, size))
    for k in range(1, size + 1):
        up, down = min(k + 2, horizon), max(1, k - 1)
        transition[k - 1, up - 1] += accept_all(k)
        transition[k - 1, down - 1] += 1 - accept_all(k)
    law = np.zeros(size)
    law[min(start, horizon) - 1] = 1.0
    # K = 1 (or K = horizon when alpha = 1) has a self-loop, so the chain is aperiodic and its powers
    # converge.
    return law @ np.linalg.matrix_power(transition, 2**16)


@pytest.mark.parametrize("alpha, horizon", [(0.5, 12), (0.8, 16), (0.95, 10), (1.0, 8), (0.0, 8)])
def test_heuristic_schedule_stationary_mean_matches_the_powered_chain(alpha, horizon):
    law = heuristic_oracle(lambda k: alpha**k, horizon)
    ks = np.arange(1, horizon + 1)
    tokens = law @ np.array([expected_tokens(alpha, int(k)) for k in ks])
    drafted = law @ ks
    evaluation = evaluate_rule(
        heuristic_schedule(), IIDAcceptance(alpha, max_length=horizon), LengthCosts(0.1)
    )
    assert evaluation.tokens_per_step == pytest.approx(tokens, abs=1e-9)
    assert evaluation.drafted_per_step == pytest.approx(drafted, abs=1e-9)
    assert evaluation.cost_per_token == pytest.approx((0.1 * drafted + 1) / tokens, rel=1e-9)


# -------------------------------------------------------------------------------------- the optimal policy
def exhaustive_optimum(model, costs):
    """Minimum cost per token over every deterministic stopping set on the finite state space."""
    laws = laws_of(model)
    states = states_of(laws, model.horizon)
    best = np.inf
    for bits in itertools.product((False, True), repeat=len(states)):
        table = dict(zip(states, bits, strict=False))
        drafted, accepted = brute_force_step(
            lambda k, pi, b, table=table: table.get((k, pi_key(pi)), False), laws, model.horizon
        )
        best = min(best, ratio(drafted, accepted, costs))
    return best, states


@given(bucket_models.filter(lambda m: m.horizon <= 3), costs_strategy)
@example(  # found by CI: a near-tie at the 13th decimal of a state's P(all accepted) (pi_key)
    ConfidenceBuckets([0.9, 0.3], [0.5, 0.6470444754235], [0.5, 0.5], entropies=[0.3, 2.0], max_length=2),
    LengthCosts(0.0, 1.0, 0.0),
)
def test_optimal_policy_matches_exhaustive_search_over_stopping_rules(model, costs):
    best, states = exhaustive_optimum(model, costs)
    assume(len(set(states)) == len(states))  # distinct buckets sharing one pi would merge states
    assert optimal_length_policy(model, costs).cost_per_token == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize(
    "model",
    [
        IIDAcceptance(0.7, max_length=5),
        PositionalAcceptance([0.95, 0.3, 0.9, 0.9, 0.2, 0.8]),  # non-monotone rates
        ConfidenceBuckets([0.9, 0.5, 0.2], [0.95, 0.6, 0.2], [0.5, 0.3, 0.2], max_length=3),
    ],
)
@pytest.mark.parametrize("costs", [LengthCosts(0.05), LengthCosts(0.3, 1.0, 0.2), LengthCosts(0.0, 2.0)])
def test_optimal_policy_matches_exhaustive_search_on_fixed_cases(model, costs):
    best, _ = exhaustive_optimum(model, costs)
    policy = optimal_length_policy(model, costs)
    assert policy.cost_per_token == pytest.approx(best, rel=1e-9)
    # the policy's own table, replayed by the brute-force evaluator, achieves the optimum
    laws = laws_of(model)
    drafted, accepted = brute_force_step(
        lambda k, pi, b: policy.should_continue(_state_like(k, pi), None), laws, model.horizon
    )
    assert ratio(drafted, accepted, costs) == pytest.approx(best, rel=1e-9)


def _state_like(k, pi):
    from theory import DraftState

    return DraftState(k, pi, None, None, None, None)


policy_models = st.one_of(
    st.builds(lambda a, h: IIDAcceptance(a, max_length=h), rates, st.integers(1, 24)),
    st.builds(PositionalAcceptance, st.lists(rates, min_size=1, max_size=12)),
    st.builds(
        lambda acc, w, h: ConfidenceBuckets([0.9, 0.5, 0.2], acc, w, max_length=h),
        st.lists(rates, min_size=3, max_size=3),
        st.lists(st.floats(0.05, 1.0), min_size=3, max_size=3).map(lambda w: np.array(w) / np.sum(w)),
        st.integers(1, 8),
    ),
)


@given(policy_models, costs_strategy)
# Found by the deep profile: free drafts and pi_k * a underflowing to the smallest subnormal in the induction
# but to 0 in the table, so a row recorded at 0 continued and the table was no threshold rule.
@example(IIDAcceptance(1.23878e-108, max_length=4), LengthCosts(0.0, 2.0, 0.0))
def test_optimal_policy_is_a_threshold_rule_on_the_rejection_probability(model, costs):
    policy = optimal_length_policy(model, costs)
    assert policy.is_threshold_rule
    for row in policy.table:
        if abs(row.next_rejection_probability - policy.threshold) > 1e-9:  # exact ties may go either way
            assert row.continue_drafting == (row.next_rejection_probability < policy.threshold)


@given(policy_models, costs_strategy, st.integers(0, 10), st.floats(0.0, 1.0))
def test_optimal_cost_per_token_is_at_most_any_practical_rule(model, costs, length, threshold):
    optimum = optimal_length_policy(model, costs).cost_per_token
    for rule in (
        fixed_length_rule(length),
        heuristic_schedule(),
        specdecpp_threshold(threshold),
        kangaroo_confidence_stop(threshold),
    ):
        assert optimum <= evaluate_rule(rule, model, costs).cost_per_token * (1 + 1e-12)


@given(rates, st.floats(0.0, 1.0), st.integers(1, 40))
def test_iid_policy_reduces_to_the_best_fixed_length(alpha, c, horizon):
    policy = optimal_length_policy(IIDAcceptance(alpha, max_length=horizon), LengthCosts(c))
    best_gamma = optimal_draft_length(alpha, c, max_gamma=horizon)
    # optimal_draft_length returns the shortest gamma within TIE_TOLERANCE (relative) of the best speedup
    # (alpha = 0.1, c = 0: gamma 10..16 differ by < 1e-12), so the two optima agree to that tolerance plus
    # the MDP's own round-off.
    assert policy.speedup == pytest.approx(speedup(alpha, best_gamma, c), rel=2 * TIE_TOLERANCE)


@given(
    st.one_of(
        st.builds(lambda a, h: IIDAcceptance(a, max_length=h), inner_rates, st.integers(1, 24)),
        policy_models.filter(lambda m: isinstance(m, ConfidenceBuckets)),
    ),
    costs_strategy,
)
def test_specdecpp_rule_at_the_reported_threshold_reproduces_the_optimum(model, costs):
    policy = optimal_length_policy(model, costs)
    assume(policy.rejection_threshold is not None and 0.0 <= policy.rejection_threshold <= 1.0)
    rule = specdecpp_threshold(policy.rejection_threshold)
    assert evaluate_rule(rule, model, costs).cost_per_token == pytest.approx(policy.cost_per_token, rel=1e-9)


def test_policy_threshold_matches_the_one_step_lookahead_formula():
    # alpha = 0.8, c = 0.05: lambda* = 1.4 / 4.32891136; h* = 1 - c / lambda*; continue 8 times.
    policy = optimal_length_policy(IIDAcceptance(0.8, max_length=32), LengthCosts(0.05))
    lam = 1.4 / expected_tokens(0.8, 8)
    assert policy.cost_per_token == pytest.approx(lam, rel=1e-12)
    assert policy.threshold == pytest.approx(1 - 0.05 / lam, rel=1e-12)
    assert [row.continue_drafting for row in policy.table[:9]] == [True] * 8 + [False]


# -------------------------------------------------------------------------------------------- Monte Carlo
MODELS_FOR_SIMULATION = {
    "iid": IIDAcceptance(0.75, max_length=12),
    "positional": PositionalAcceptance([0.9, 0.85, 0.7, 0.6, 0.5, 0.45, 0.4]),
    "buckets": ConfidenceBuckets(
        [0.9, 0.5, 0.2], [0.95, 0.6, 0.2], [0.5, 0.3, 0.2], entropies=[0.2, 1.0, 2.5], max_length=10
    ),
}
Z_THRESHOLD = 4.0  # two-sided; a correct evaluator fails with probability ~6e-5 per check
STEPS = 6000


@pytest.mark.parametrize("name", sorted(MODELS_FOR_SIMULATION))
def test_simulation_agrees_with_exact_evaluation(name):
    model = MODELS_FOR_SIMULATION[name]
    costs = LengthCosts(0.1, 1.0, 0.05)
    rules = [optimal_length_policy(model, costs), specdecpp_threshold(0.6), kangaroo_confidence_stop(0.6)]
    if name == "buckets":
        rules.append(entropy_stop(0.7))
    for seed, rule in enumerate(rules):
        result = simulate_rule(rule, model, costs, steps=STEPS, rng=np.random.default_rng(1000 + seed))
        exact = evaluate_rule(rule, model, costs)
        assert abs(z_score(result.tokens, exact.tokens_per_step)) < Z_THRESHOLD, rule.name
        assert abs(z_score(result.cost, exact.cost_per_step)) < Z_THRESHOLD, rule.name


def test_simulation_of_the_heuristic_schedule_agrees_with_its_stationary_mean():
    # Steps are Markov-dependent here, so the z-score uses batch means (100 batches of 200 steps).
    model, costs = MODELS_FOR_SIMULATION["buckets"], LengthCosts(0.1)
    result = simulate_rule(heuristic_schedule(), model, costs, steps=20000, rng=np.random.default_rng(7))
    batches = result.tokens.reshape(100, 200).mean(axis=1)
    exact = evaluate_rule(heuristic_schedule(), model, costs).tokens_per_step
    assert abs(z_score(batches, exact)) < Z_THRESHOLD


def test_negative_control_the_z_test_catches_a_wrong_evaluation():
    # A slightly wrong model (alpha off by 0.03) or a forgotten bonus token must be detected.
    model, costs = MODELS_FOR_SIMULATION["iid"], LengthCosts(0.1)
    rule = specdecpp_threshold(0.6)
    result = simulate_rule(rule, model, costs, steps=STEPS, rng=np.random.default_rng(1000))
    shifted = evaluate_rule(rule, IIDAcceptance(0.78, max_length=12), costs).tokens_per_step
    assert abs(z_score(result.tokens, shifted)) > Z_THRESHOLD
    no_bonus = evaluate_rule(rule, model, costs).tokens_per_step - 1
    assert abs(z_score(result.tokens, no_bonus)) > Z_THRESHOLD


# -------------------------------------------------------------------------------------------------- DEL
@given(st.lists(inner_rates, min_size=1, max_size=6), st.integers(8, 40))
def test_del_choice_maximises_tokens_per_layer(alphas, n_layers):
    exits = range(1, n_layers, max(1, n_layers // 6))
    layers = {layer: alpha for layer, alpha in zip(exits, alphas, strict=False)}
    choice = del_exit_choice(layers, n_layers)
    tpl = {
        (layer, gamma): expected_tokens(alpha, gamma) / (gamma * layer + n_layers)
        for layer, alpha in layers.items()
        for gamma in range(18)
    }
    assert tpl[(choice.exit_layer, choice.gamma)] == pytest.approx(max(tpl.values()), rel=1e-12)
    assert choice.evaluation.speedup == pytest.approx(max(tpl.values()) * n_layers, rel=1e-12)
