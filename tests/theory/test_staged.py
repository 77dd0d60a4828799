"""Staged speculative decoding: renewal counts of inner rounds and the two-stage step-time model.

Oracles: the law of partial sums (P(R > r) = P(K_1 + ... + K_r < L)) computed by convolution, an
independent formula for E[R]; a Monte Carlo of the staged process built on simulate_tree_tokens, with a
negative control; Leviathan et al.'s closed forms for chains.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.goodness_of_fit import z_score
from theory import Tree, expected_rounds, simulate_tree_tokens, staged_step, tree_token_distribution
from theory.strategies import acceptance_vectors, trees


def rounds_by_partial_sums(length, law):
    """E[R] = sum_{r >= 0} P(S_r < length), with the law of S_r obtained by repeated convolution."""
    partial = np.array([1.0])  # S_0 = 0
    total = 0.0
    for _ in range(length + 1):  # every K >= 1, so S_length >= length
        total += partial[:length].sum()
        partial = np.convolve(partial, np.concatenate([[0.0], law]))
    return total


@given(st.integers(0, 20), st.lists(st.floats(0, 1), min_size=1, max_size=5))
def test_expected_rounds_equals_the_partial_sum_formula(length, weights):
    weights = np.array(weights)
    if weights.sum() == 0:
        weights[0] = 1.0
    law = weights / weights.sum()
    assert expected_rounds(length, law) == pytest.approx(rounds_by_partial_sums(length, law), rel=1e-10)


@given(st.integers(0, 30), st.integers(1, 6))
def test_expected_rounds_of_a_fixed_round_size_is_the_ceiling(length, k):
    law = np.zeros(k)
    law[-1] = 1.0
    assert expected_rounds(length, law) == pytest.approx(math.ceil(length / k))


@given(st.integers(0, 30), trees(max_size=8), acceptance_vectors(max_width=3))
def test_expected_rounds_lie_between_length_over_longest_round_and_length(length, tree, acc):
    law = tree_token_distribution(tree, acc)
    rounds = expected_rounds(length, law)
    assert length / law.size - 1e-12 <= rounds <= length + 1e-12
    # and never below the renewal lower bound length / E[K] (Wald: E[S_R] = E[R] E[K] >= length)
    assert rounds * (law @ np.arange(1, law.size + 1)) >= length - 1e-9


def test_monte_carlo_of_staged_drafting_matches_expected_rounds():
    # Inner tree: chain of 2 drafted by draft² with acceptance 0.9 against the draft; the draft must produce
    # L = 4 tokens. 100k simulated staged drafts; |z| < 4 with a fixed seed. Negative control: the naive
    # L / E[K] (ignoring the overshoot of the last round) is rejected by the same test.
    inner, acc, length = Tree.chain(2), [0.9], 4
    rng = np.random.default_rng(11)
    produced = np.zeros(100_000, dtype=np.int64)
    rounds = np.zeros(100_000, dtype=np.int64)
    while np.any(produced < length):
        active = produced < length
        produced[active] += simulate_tree_tokens(inner, acc, int(active.sum()), rng)
        rounds[active] += 1
    exact = expected_rounds(length, tree_token_distribution(inner, acc))
    assert abs(z_score(rounds, exact)) < 4
    naive = length / (tree_token_distribution(inner, acc) @ np.arange(1, 4))
    assert abs(z_score(rounds, naive)) > 4


def test_chain_numbers_match_leviathan():
    # alpha = 0.8, gamma = 4, c = 0.1: E = 3.3616 and S = 2.4011 (Leviathan et al. 2023, Eq. 1 and Thm 3.8).
    step = staged_step(
        Tree.chain(4), [0.8], Tree.chain(0), [0.5], target_time=1.0, draft_time=0.1, draft2_time=0.0
    )
    assert step.expected_tokens == pytest.approx(3.3616)
    assert step.unstaged_speedup == pytest.approx(2.4011, abs=1e-4)
    assert step.speedup == pytest.approx(step.unstaged_speedup)


@given(
    trees(max_size=10),
    acceptance_vectors(max_width=3),
    trees(max_size=6),
    acceptance_vectors(max_width=3),
    st.floats(0.01, 1),
    st.floats(0, 0.5),
)
def test_a_one_node_inner_tree_is_unstaged_drafting(
    outer, outer_acc, inner, inner_acc, draft_time, target_slope
):
    def target(n):
        return 1.0 + target_slope * n

    single = staged_step(
        outer, outer_acc, Tree.chain(0), inner_acc, target_time=target, draft_time=draft_time, draft2_time=0.3
    )
    assert single.draft_rounds == outer.depth
    assert single.step_time == pytest.approx(single.unstaged_step_time)
    assert single.speedup == pytest.approx(single.unstaged_speedup)
    # With free draft² passes and a draft whose pass time does not grow with size, staging never slows down.
    staged = staged_step(
        outer, outer_acc, inner, inner_acc, target_time=target, draft_time=draft_time, draft2_time=0.0
    )
    assert staged.step_time <= staged.unstaged_step_time + 1e-12
    assert staged.expected_tokens == pytest.approx(single.expected_tokens)
    expected_time = target(outer.size) + staged.draft_rounds * draft_time
    assert staged.step_time == pytest.approx(expected_time)
    assert staged.speedup == pytest.approx(target(1) * staged.expected_tokens / expected_time)


def test_staged_step_uses_the_draft_time_table():
    step = staged_step(
        Tree.chain(6),
        [0.8],
        Tree.chain(2),
        [0.9],
        target_time={1: 10.0, 7: 10.5},
        draft_time={1: 1.0, 3: 1.2},
        draft2_time=0.05,
    )
    rounds = expected_rounds(6, tree_token_distribution(Tree.chain(2), [0.9]))
    assert step.step_time == pytest.approx(10.5 + rounds * (1.2 + 2 * 0.05))
    assert step.unstaged_step_time == pytest.approx(10.5 + 6 * 1.0)
    assert step.inner_tokens_per_round == pytest.approx(1 + 0.9 + 0.81)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"draft2_time": -1.0}, "draft2_time"),
        ({"draft_time": -0.5}, "draft_time"),
        ({"target_time": {1: 1.0}}, "no time for 3 tokens"),
        ({"outer_acc": [0.8, 0.5]}, "at most 1"),
        ({"inner_tree": [0, 0]}, "inner_tree"),
    ],
)
def test_staged_step_rejects_bad_input(kwargs, message):
    arguments = dict(
        outer_tree=Tree.chain(2),
        outer_acc=[0.8],
        inner_tree=Tree.chain(1),
        inner_acc=[0.9],
        target_time=1.0,
        draft_time=0.1,
        draft2_time=0.01,
    )
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        staged_step(
            arguments.pop("outer_tree"),
            arguments.pop("outer_acc"),
            arguments.pop("inner_tree"),
            arguments.pop("inner_acc"),
            **arguments,
        )


@pytest.mark.parametrize(
    "law, message", [([0.5, 0.4], "sum to 1"), ([-0.5, 1.5], "non-negative"), ([], "non-empty")]
)
def test_expected_rounds_rejects_bad_laws(law, message):
    with pytest.raises(ValueError, match=message):
        expected_rounds(3, law)
    with pytest.raises(ValueError, match="length"):
        expected_rounds(-1, [1.0])
