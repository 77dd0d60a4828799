"""Tests of theory.tree_growth: greedy best-first trees against the DP, and DySpec's dynamic tree."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.goodness_of_fit import law_p_value
from theory import (
    Tree,
    dynamic_tree,
    greedy_tree,
    optimal_tree,
    tree_expected_tokens,
)
from theory.strategies import acceptance_vectors

# --------------------------------------------------------------------------------------------------------
# Greedy best-first trees against the DP
# --------------------------------------------------------------------------------------------------------


@given(acceptance_vectors(max_width=5), st.integers(1, 40), st.none() | st.integers(1, 6))
def test_optimal_tree_is_at_least_greedy_tree(acc, budget, max_depth):
    greedy = greedy_tree(acc, budget, max_depth=max_depth)
    assert greedy.expected_tokens == pytest.approx(tree_expected_tokens(greedy.tree, acc), rel=1e-12)
    assert greedy.tree.size <= budget
    assert optimal_tree(acc, budget, max_depth=max_depth).expected_tokens >= greedy.expected_tokens - 1e-12


@given(acceptance_vectors(max_width=5, monotone=True), st.integers(1, 40), st.none() | st.integers(1, 6))
def test_greedy_tree_is_optimal_on_non_increasing_acceptance(acc, budget, max_depth):
    optimal = optimal_tree(acc, budget, max_depth=max_depth).expected_tokens
    assert greedy_tree(acc, budget, max_depth=max_depth).expected_tokens == pytest.approx(optimal, abs=1e-10)


def test_greedy_tree_falls_short_on_a_non_monotone_vector():
    # acc = [0.1, 0, 0.8], 4 nodes. Greedy only sees the next child position: after child 1 (0.1) the
    # frontier offers 0.01 (grandchild) and 0 (child 2), so it builds the chain 1 + 0.1 + 0.01 + 0.001.
    # The DP pays for the worthless child 2 to reach child 3: 1 + 0.1 + 0 + 0.8.
    acc = [0.1, 0.0, 0.8]
    greedy = greedy_tree(acc, 4)
    optimal = optimal_tree(acc, 4)
    assert greedy.expected_tokens == pytest.approx(1.111)
    assert optimal.expected_tokens == pytest.approx(1.9)
    assert optimal.tree == Tree.star(3)


@given(acceptance_vectors(max_width=3, rows=3, monotone=True), st.integers(1, 25))
def test_greedy_tree_is_optimal_on_per_depth_acceptance_decaying_along_paths(acc, budget):
    # With rows non-increasing down the depths too, scores fall along every path and sibling order.
    acc = np.minimum.accumulate(acc, axis=0)
    optimal = optimal_tree(acc, budget).expected_tokens
    assert greedy_tree(acc, budget).expected_tokens == pytest.approx(optimal, abs=1e-10)


@given(acceptance_vectors(max_width=4), st.integers(1, 30), st.integers(1, 5))
def test_greedy_tree_with_a_depth_independent_table_is_the_vectors_tree(acc, budget, rows):
    # The depth-aware heap reads row d at depth d; equal rows give the same scores, hence the same tree.
    by_table = greedy_tree(np.tile(acc, (rows, 1)), budget)
    by_vector = greedy_tree(acc, budget, max_depth=rows)
    assert by_table.tree == by_vector.tree
    assert by_table.expected_tokens == by_vector.expected_tokens


def test_greedy_tree_follows_acceptance_that_falls_with_depth():
    # Depth 1 accepts its first child with 0.9, depth 2 never: a chain is worthless below depth 1, so the
    # 4 nodes go to the root's children (1 + 0.9 + 0.05 + 0.03), where the depth-blind vector grows a chain.
    table = np.array([[0.9, 0.05, 0.03], [0.0, 0.0, 0.0]])
    solution = greedy_tree(table, 4)
    assert solution.tree == Tree.star(3)
    assert solution.expected_tokens == pytest.approx(1.98)
    assert greedy_tree(table[0], 4, max_depth=2).tree != Tree.star(3)


# --------------------------------------------------------------------------------------------------------
# DySpec's dynamic tree
# --------------------------------------------------------------------------------------------------------


def test_dynamic_tree_hand_computed_example():
    # q = [.6, .3, .1], 4 nodes, greedy draws: root site v=1 -> token 0 (value .6); sites: sibling .4,
    # child .6 -> child token 0 (value .36); sites: .4, .24 (sibling), .36 (child) -> root's 2nd child,
    # token 1 with value .4 * (.3 / .4) = .3.
    q = np.array([0.6, 0.3, 0.1])
    result = dynamic_tree(lambda path: q, 4)
    assert result.tree.parents.tolist() == [-1, 0, 1, 0]
    assert result.tokens.tolist() == [-1, 0, 0, 1]
    np.testing.assert_allclose(result.values, [1, 0.6, 0.36, 0.3])
    assert result.expected_tokens == pytest.approx(2.26)
    assert result.draft_calls == 2  # the root and node 1; the leaves were never expanded


@given(
    st.lists(st.integers(0, 10), min_size=1, max_size=6), st.integers(1, 30), st.none() | st.integers(0, 4)
)
def test_dynamic_tree_with_a_fixed_draft_values_paths_by_the_sorted_draft(weights, budget, max_depth):
    weights = np.array(weights, dtype=float)
    if weights.sum() == 0:
        weights[0] = 1
    q = weights / weights.sum()
    result = dynamic_tree(lambda path: q, budget, max_depth=max_depth)
    tree = result.tree
    # Greedy draws without replacement give the k-th child the k-th largest probability, so the values
    # are Sequoia's path products with acc = sorted q.
    assert result.expected_tokens == pytest.approx(tree_expected_tokens(tree, np.sort(q)[::-1]), abs=1e-12)
    assert np.all(result.values[1:] <= result.values[tree.parents[1:]] + 1e-15)
    assert max_depth is None or tree.depth <= max_depth
    for node in range(tree.size):
        kids = tree.children(node)
        assert len(set(result.tokens[kids].tolist())) == kids.size  # siblings are distinct tokens
        assert np.all(q[result.tokens[kids]] > 0)
    assert result.draft_calls <= tree.size


def test_dynamic_tree_calls_the_draft_with_each_node_path():
    seen = []

    def draft(path):
        seen.append(path)
        q = np.full(4, 0.1)
        q[len(path) % 4] = 0.7
        return q

    result = dynamic_tree(draft, 6)
    for node in range(result.tree.size):
        path = tuple(int(result.tokens[i]) for i in result.tree.path(node)[1:])
        children_tokens = result.tokens[result.tree.children(node)]
        if children_tokens.size:
            assert path in seen
            assert children_tokens[0] == len(path) % 4  # the argmax of the draft at that path
    assert len(seen) == len(set(seen)) == result.draft_calls


def test_dynamic_tree_samples_the_first_child_from_the_draft():
    # 4000 one-draft trees; chi-square of the root's child token against q (p > 1e-3), fixed seed. Negative
    # control: the same counts reject the uniform law (p < 1e-3).
    q = np.array([0.5, 0.3, 0.15, 0.05])
    rng = np.random.default_rng(7)
    tokens = [dynamic_tree(lambda path: q, 2, rng=rng).tokens[1] for _ in range(4000)]
    counts = np.bincount(tokens, minlength=q.size)
    assert law_p_value(counts, q) > 1e-3
    assert law_p_value(counts, np.full(4, 0.25)) < 1e-3


@given(st.integers(1, 20), st.integers(0, 2**32 - 1))
def test_dynamic_tree_sampled_siblings_are_distinct_and_the_budget_is_met(budget, seed):
    q = np.array([0.4, 0.3, 0.2, 0.1])
    result = dynamic_tree(lambda path: q, budget, rng=np.random.default_rng(seed))
    assert result.tree.size == budget
    for node in range(result.tree.size):
        kids = result.tokens[result.tree.children(node)]
        assert len(set(kids.tolist())) == kids.size


def test_dynamic_tree_rejects_bad_arguments():
    with pytest.raises(ValueError, match="draft"):
        dynamic_tree([0.5, 0.5], 3)
    with pytest.raises(ValueError, match="budget"):
        dynamic_tree(lambda path: np.array([1.0]), 0)
    with pytest.raises(ValueError, match="draft\\(path\\)"):
        dynamic_tree(lambda path: np.array([0.5, 0.6]), 3)
    with pytest.raises(ValueError, match="rng"):
        dynamic_tree(lambda path: np.array([1.0]), 3, rng=1)
