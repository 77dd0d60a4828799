"""Token trees (theory.trees): structure, expected tokens and Sequoia's DP (growth and planning: their own modules).

Oracles: brute force over every ordered tree with at most 7 nodes; an independent memoised transcription of
Sequoia's recursion; Monte Carlo of positional acceptance (z-tests with negative controls); the Sequoia
repository's own demo result.
"""

import functools
import itertools
import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.goodness_of_fit import law_p_value, z_score
from theory import (
    Tree,
    greedy_tree,
    optimal_tree,
    simulate_tree_tokens,
    tree_expected_tokens,
    tree_token_distribution,
)
from theory.strategies import acceptance_vectors, trees

# --------------------------------------------------------------------------------------------------------
# Independent oracles
# --------------------------------------------------------------------------------------------------------


def oracle_paths(parents):
    """Per node, the list of (depth, child position) pairs from the root down (children ordered by index)."""
    position = {}
    seen = {}
    for i, parent in enumerate(parents[1:], start=1):
        seen[parent] = seen.get(parent, 0) + 1
        position[i] = seen[parent]
    paths = []
    for i in range(len(parents)):
        steps = []
        node = i
        while node != 0:
            steps.append(position[node])
            node = parents[node]
        steps.reverse()
        paths.append([(depth, k) for depth, k in enumerate(steps)])
    return paths


def oracle_value(parents, acc):
    """Sum over nodes of the product of acceptances along the path (root 1), acc vector or matrix."""
    acc = np.asarray(acc, dtype=float)
    total = 0.0
    for path in oracle_paths(parents):
        product = 1.0
        for depth, k in path:
            row = acc[depth] if acc.ndim == 2 else acc
            product *= row[k - 1] if k <= row.size else 0.0
        total += product
    return total


@functools.cache
def all_parent_arrays(max_size):
    """Every parent array with parents[i] < i and at most max_size nodes: every ordered tree, with repeats."""
    arrays = []
    for size in range(1, max_size + 1):
        arrays.extend((-1, *rest) for rest in itertools.product(*[range(i) for i in range(1, size)]))
    return tuple(arrays)


def brute_force_best(acc, budget, max_depth=None, max_width=None):
    best = -np.inf
    for parents in all_parent_arrays(budget):
        tree = Tree(parents)
        if max_depth is not None and tree.depth > max_depth:
            continue
        if max_width is not None and tree.num_children().max() > max_width:
            continue
        best = max(best, oracle_value(parents, acc))
    return best


def recursive_sequoia_value(acc, budget):
    """Sequoia Alg. 1 written as a memoised recursion (no depth limit), independent of the vectorised DP."""
    acc = tuple(float(a) for a in acc)

    @functools.cache
    def with_children(n, b):  # best n-node tree whose root has exactly b children
        if b == 0:
            return 1.0 if n == 1 else -math.inf
        options = [with_children(y, b - 1) + acc[b - 1] * best(n - y) for y in range(1, n)]
        return max(options, default=-math.inf)

    @functools.cache
    def best(n):
        return max(with_children(n, b) for b in range(len(acc) + 1))

    return best(budget)


# --------------------------------------------------------------------------------------------------------
# The Tree type
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "parents, message",
    [
        ([], "non-empty"),
        ([0, 0], "parents\\[0\\] must be -1"),
        ([-1, 1], "parents\\[1\\]"),
        ([-1, 0, 5], "parents\\[2\\]"),
        ([-1, -1], "parents\\[1\\]"),
        ([[-1, 0]], "1-D"),
        ([-1, 0.5], "integers"),
    ],
)
def test_tree_rejects_bad_parent_arrays(parents, message):
    with pytest.raises(ValueError, match=message):
        Tree(parents)


@given(trees(max_size=15))
def test_json_round_trip_preserves_the_tree(tree):
    text = tree.to_json()
    assert json.loads(text) == {"parents": tree.parents.tolist()}
    assert Tree.from_json(text) == tree


def test_from_json_rejects_malformed_text():
    for text in ["{", '{"nodes": [-1]}', '{"parents": [-1, "a"]}', '"x"']:
        with pytest.raises(ValueError):
            Tree.from_json(text)


@given(trees(max_size=15))
def test_attention_mask_is_exactly_self_and_ancestors(tree):
    parents = tree.parents.tolist()
    expected = np.zeros((tree.size, tree.size), dtype=bool)
    for i in range(tree.size):
        node = i
        while node != -1:
            expected[i, node] = True
            node = parents[node]
    mask = tree.attention_mask()
    assert mask.dtype == bool and mask.shape == (tree.size, tree.size)
    np.testing.assert_array_equal(mask, expected)


@given(trees(max_size=15), st.integers(0, 1000))
def test_positions_are_offset_plus_depth_and_depth_counts_ancestors(tree, offset):
    mask = tree.attention_mask()
    np.testing.assert_array_equal(tree.depths, mask.sum(axis=1) - 1)
    np.testing.assert_array_equal(tree.positions(offset), offset + tree.depths)
    assert tree.depth == tree.depths.max()
    assert tree.level_sizes().sum() == tree.size


@given(trees(max_size=15))
def test_children_are_in_index_order_and_ranks_number_them(tree):
    for node in range(tree.size):
        kids = tree.children(node)
        assert np.all(np.diff(kids) > 0)
        np.testing.assert_array_equal(tree.ranks[kids], np.arange(1, kids.size + 1))
        assert tree.num_children()[node] == kids.size
        assert tree.path(node)[-1] == node and tree.path(node)[0] == 0


def test_ascii_drawing_of_a_small_tree():
    assert Tree([-1, 0, 0, 1, 1, 2]).ascii() == "\n".join(
        ["0", "├── 1", "│   ├── 3", "│   └── 4", "└── 2", "    └── 5"]
    )
    assert Tree([-1, 0]).ascii(labels=["<s>", "the"]) == "<s>\n└── the"


@given(trees(max_size=15))
def test_ascii_draws_every_node_once(tree):
    lines = tree.ascii(labels=[f"n{i}" for i in range(tree.size)]).splitlines()
    assert sorted(line.split(" ")[-1].lstrip("─") for line in lines) == sorted(
        f"n{i}" for i in range(tree.size)
    )


def test_builders():
    assert Tree.chain(3).parents.tolist() == [-1, 0, 1, 2]
    assert Tree.chain(0).size == 1
    assert Tree.star(3).parents.tolist() == [-1, 0, 0, 0]
    tree = Tree.expansion([2, 2, 1])  # SpecInfer's <2, 2, 1>: 4 sequences
    assert tree.level_sizes().tolist() == [1, 2, 4, 4]
    with pytest.raises(ValueError, match="gamma"):
        Tree.chain(-1)
    with pytest.raises(ValueError, match="node"):
        Tree.chain(2).children(3)


# --------------------------------------------------------------------------------------------------------
# Expected tokens
# --------------------------------------------------------------------------------------------------------


@given(st.floats(0, 0.999), st.integers(0, 12))
def test_chain_expected_tokens_is_leviathans_formula(alpha, gamma):
    expected = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    assert tree_expected_tokens(Tree.chain(gamma), [alpha]) == pytest.approx(expected, rel=1e-12)


@given(trees(max_size=12), acceptance_vectors(max_width=5))
def test_expected_tokens_is_the_sum_of_path_products(tree, acc):
    assert tree_expected_tokens(tree, acc) == pytest.approx(
        oracle_value(tree.parents.tolist(), acc), abs=1e-12
    )


@given(trees(max_size=12), st.data())
def test_expected_tokens_with_a_per_depth_matrix_is_the_sum_of_path_products(tree, data):
    acc = data.draw(acceptance_vectors(max_width=4, rows=max(tree.depth, 1)))
    assert tree_expected_tokens(tree, acc) == pytest.approx(
        oracle_value(tree.parents.tolist(), acc), abs=1e-12
    )


@given(trees(max_size=12), acceptance_vectors(max_width=5))
def test_token_distribution_is_a_law_whose_mean_is_the_expected_tokens(tree, acc):
    law = tree_token_distribution(tree, acc)
    assert law.shape == (tree.depth + 1,)
    assert np.all(law >= -1e-12) and law.sum() == pytest.approx(1.0, abs=1e-12)
    assert law @ np.arange(1, law.size + 1) == pytest.approx(tree_expected_tokens(tree, acc), abs=1e-12)


@given(trees(max_size=10), acceptance_vectors(max_width=4), st.integers(0, 9))
def test_adding_a_leaf_never_decreases_expected_tokens(tree, acc, parent):
    parent = min(parent, tree.size - 1)
    bigger = Tree([*tree.parents.tolist(), parent])
    assert tree_expected_tokens(bigger, acc) >= tree_expected_tokens(tree, acc) - 1e-12


MC_TREE = Tree([-1, 0, 0, 0, 1, 1, 2, 4, 4, 7])
MC_ACC = np.array([0.55, 0.25, 0.1])
MC_MATRIX = np.array([[0.6, 0.2, 0.1], [0.5, 0.3, 0.0], [0.3, 0.3, 0.3], [0.9, 0.05, 0.05]])


@pytest.mark.parametrize("acc", [MC_ACC, MC_MATRIX], ids=["vector", "per-depth"])
def test_monte_carlo_positional_acceptance_matches_expected_tokens(acc):
    # Threshold |z| < 4 (two-sided p ~ 6e-5) with a fixed seed; 200k steps give a standard error ~ 2e-3.
    samples = simulate_tree_tokens(MC_TREE, acc, 200_000, np.random.default_rng(20240501))
    assert abs(z_score(samples, tree_expected_tokens(MC_TREE, acc))) < 4
    # The whole law, not just the mean: chi-square against tree_token_distribution.
    law = tree_token_distribution(MC_TREE, acc)
    observed = np.bincount(samples - 1, minlength=law.size)
    assert law_p_value(observed, law) > 1e-4
    # Negative controls: plausible mistakes are caught by the same test. Reading acc as *conditional*
    # acceptances (child k accepted with acc[k-1] after children 1..k-1 were rejected) and forgetting the
    # bonus token both give means the z-test rejects.
    conditional = np.atleast_2d(acc) * np.cumprod(1 - np.atleast_2d(acc), axis=1) / (1 - np.atleast_2d(acc))
    wrong = conditional[0] if np.ndim(acc) == 1 else conditional
    assert abs(z_score(samples, tree_expected_tokens(MC_TREE, wrong))) > 4
    assert abs(z_score(samples, tree_expected_tokens(MC_TREE, acc) - 1)) > 4


def test_simulation_rejects_bad_arguments():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="n_steps"):
        simulate_tree_tokens(MC_TREE, MC_ACC, 0, rng)
    with pytest.raises(ValueError, match="rng"):
        simulate_tree_tokens(MC_TREE, MC_ACC, 10, 0)
    with pytest.raises(ValueError, match="rows"):
        simulate_tree_tokens(MC_TREE, MC_MATRIX[:2], 10, rng)


# --------------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "acc, message",
    [
        ([1.2, 0.0], "\\[0, 1\\]"),
        ([-0.1, 0.5], "\\[0, 1\\]"),
        ([0.7, 0.5], "at most 1"),
        ([[0.5, 0.2], [0.9, 0.2]], "row 1"),
        ([np.nan], "NaN"),
        ([], "non-empty"),
        ([[[0.5]]], "vector"),
    ],
)
def test_bad_acceptance_is_a_value_error_naming_acc(acc, message):
    for call in (
        lambda: tree_expected_tokens(Tree.chain(1), acc),
        lambda: optimal_tree(acc, 4),
        lambda: greedy_tree(acc, 4),
    ):
        with pytest.raises(ValueError, match=message) as error:
            call()
        assert "acc" in str(error.value)


@pytest.mark.parametrize("budget", [0, -3, 2.5, True])
def test_budget_below_one_or_not_an_integer_is_a_value_error(budget):
    for function in (optimal_tree, greedy_tree):
        with pytest.raises(ValueError, match="budget"):
            function([0.5], budget)


def test_depth_limits_beyond_the_matrix_rows_are_value_errors():
    with pytest.raises(ValueError, match="max_depth"):
        optimal_tree(MC_MATRIX, 8, max_depth=5)
    with pytest.raises(ValueError, match="rows"):
        tree_expected_tokens(Tree.chain(5), MC_MATRIX)


# --------------------------------------------------------------------------------------------------------
# Sequoia's dynamic programme
# --------------------------------------------------------------------------------------------------------


@given(
    acceptance_vectors(max_width=4),
    st.integers(1, 7),
    st.none() | st.integers(0, 6),
    st.none() | st.integers(1, 3),
)
def test_optimal_tree_equals_brute_force_over_all_trees(acc, budget, max_depth, max_width):
    solution = optimal_tree(acc, budget, max_depth=max_depth, max_width=max_width)
    expected = brute_force_best(acc, budget, max_depth, max_width)
    assert solution.expected_tokens == pytest.approx(expected, abs=1e-12)
    assert tree_expected_tokens(solution.tree, acc) == pytest.approx(expected, abs=1e-12)
    assert solution.tree.size <= budget
    assert max_depth is None or solution.tree.depth <= max_depth
    assert max_width is None or solution.tree.num_children().max() <= max_width


@given(st.integers(1, 3).flatmap(lambda rows: st.tuples(acceptance_vectors(3, rows=rows), st.integers(1, 7))))
def test_optimal_tree_with_per_depth_acceptance_equals_brute_force(case):
    acc, budget = case
    solution = optimal_tree(acc, budget)
    expected = brute_force_best(acc, budget, max_depth=acc.shape[0])
    assert solution.expected_tokens == pytest.approx(expected, abs=1e-12)
    assert tree_expected_tokens(solution.tree, acc) == pytest.approx(expected, abs=1e-12)


@given(acceptance_vectors(max_width=5), st.integers(1, 40))
def test_optimal_tree_equals_the_memoised_recursion(acc, budget):
    assert optimal_tree(acc, budget).expected_tokens == pytest.approx(
        recursive_sequoia_value(acc, budget), abs=1e-9
    )


@given(
    acceptance_vectors(max_width=6),
    st.integers(1, 60),
    st.none() | st.integers(1, 8),
    st.none() | st.integers(1, 4),
)
def test_optimal_tree_value_is_the_expected_tokens_of_its_tree(acc, budget, max_depth, max_width):
    solution = optimal_tree(acc, budget, max_depth=max_depth, max_width=max_width)
    assert solution.expected_tokens == pytest.approx(tree_expected_tokens(solution.tree, acc), rel=1e-12)
    tree, value = solution  # unpacks
    assert tree is solution.tree and value == solution.expected_tokens


@given(acceptance_vectors(max_width=5), st.integers(1, 40), st.integers(0, 6))
def test_optimal_value_grows_with_budget_and_depth(acc, budget, depth):
    value = optimal_tree(acc, budget, max_depth=depth).expected_tokens
    assert optimal_tree(acc, budget + 1, max_depth=depth).expected_tokens >= value - 1e-12
    assert optimal_tree(acc, budget, max_depth=depth + 1).expected_tokens >= value - 1e-12


@given(acceptance_vectors(max_width=5), st.integers(1, 40))
def test_optimal_tree_has_exactly_budget_nodes_when_no_limit_binds(acc, budget):
    assert optimal_tree(acc, budget).tree.size == budget


@given(st.floats(0, 1), st.integers(1, 50), acceptance_vectors(max_width=3))
def test_width_one_gives_the_chain_and_its_bound(p1, budget, rest):
    acc = np.concatenate([[p1], rest * (1 - p1)])
    solution = optimal_tree(acc, budget, max_width=1)
    assert solution.tree == Tree.chain(budget - 1)
    assert solution.expected_tokens == pytest.approx(sum(p1**i for i in range(budget)), rel=1e-12)
    if p1 < 1:  # Sequoia §3.1.2: a chain never beats 1 / (1 - p1)
        assert solution.expected_tokens <= 1 / (1 - p1) + 1e-9


def test_optimal_tree_is_limited_by_the_feasible_size():
    solution = optimal_tree([0.5, 0.3], 50, max_depth=2)  # width 2, depth 2: at most 7 nodes
    assert solution.tree.size == 7
    assert solution.expected_tokens == pytest.approx(1 + 0.8 + 0.8 * 0.8)


# --------------------------------------------------------------------------------------------------------
# Acceptance that depends on the depth: a table p[d-1, k-1] for the k-th child at depth d
# --------------------------------------------------------------------------------------------------------


def outcome_oracle(parents, table):
    """Expected tokens by enumerating the verification itself, independent of the path-product formula.

    Every node with children independently *picks* its accepted child: the k-th with probability p(d, k)
    (d the children's depth), none with the rest; the walk starts at the root and follows the picks until a
    node picked none or is a leaf. Sum over every joint outcome of its probability times (depth reached + 1).
    ``table`` is a vector (the same row at every depth) or a per-depth matrix.
    """
    table = np.asarray(table, dtype=float)
    children = [[] for _ in parents]
    depth = [0] * len(parents)
    for node, parent in enumerate(parents[1:], start=1):
        children[parent].append(node)
        depth[node] = depth[parent] + 1
    inner = [node for node in range(len(parents)) if children[node]]
    laws = []
    for node in inner:
        row = table[depth[node]] if table.ndim == 2 else table
        picks = [row[k] if k < row.size else 0.0 for k in range(len(children[node]))]
        laws.append([1.0 - sum(picks), *picks])  # outcome 0: no child accepted
    total = 0.0
    for outcome in itertools.product(*[range(len(law)) for law in laws]):
        probability = math.prod(law[o] for law, o in zip(laws, outcome, strict=True))
        pick = dict(zip(inner, outcome, strict=True))
        node = 0
        while pick.get(node, 0) > 0:
            node = children[node][pick[node] - 1]
        total += probability * (depth[node] + 1)
    return total


def depth_blind_expected_tokens(tree, table):
    """A deliberately broken variant: reads the first row of the table at every depth."""
    return tree_expected_tokens(tree, np.asarray(table)[0])


def table_mismatches(function, tables, max_size=6):
    """Trees (every ordered tree up to ``max_size`` nodes) and tables where ``function`` misses the oracle."""
    misses = []
    for parents in all_parent_arrays(max_size):
        tree = Tree(parents)
        for table in tables:
            if tree.depth > table.shape[0]:
                continue
            if abs(function(tree, table) - outcome_oracle(parents, table)) > 1e-12:
                misses.append((parents, table))
    return misses


def random_tables(rng, count, rows=5, width=3):
    """Per-depth tables with rows that differ (row sums below 1, the rest is 'none accepted')."""
    tables = []
    for _ in range(count):
        weights = rng.random((rows, width + 1))  # the extra column is the 'none' share
        tables.append((weights / weights.sum(axis=1, keepdims=True))[:, :width])
    return tables


def test_expected_tokens_with_a_depth_rank_table_equals_the_enumeration_of_outcomes():
    # Exact oracle on every ordered tree of at most 6 nodes and 20 random tables (depth up to 5, width 3):
    # the function under test matches to 1e-12 everywhere; the depth-blind variant is caught.
    tables = random_tables(np.random.default_rng(20261123), 20)
    assert table_mismatches(tree_expected_tokens, tables) == []
    # Negative control: a variant that ignores the depth misses the oracle on every tree with a reachable
    # node below depth 1 (one whose path has ranks within the table's width).
    misses = table_mismatches(depth_blind_expected_tokens, tables)
    deep = sum(
        any(len(path) > 1 and max(k for _, k in path) <= 3 for path in oracle_paths(parents))
        for parents in all_parent_arrays(6)
    )
    assert deep > 0 and len(misses) == deep * len(tables)


def test_the_outcome_oracle_agrees_with_hand_computed_values():
    # Chain of 2 with alpha_1 = 0.5, alpha_2 = 0.2: 1 + 0.5 + 0.5 * 0.2.
    assert outcome_oracle([-1, 0, 1], [[0.5], [0.2]]) == pytest.approx(1.6, abs=1e-15)
    # Root with 2 children, the first with one child: 1 + 0.6 + 0.3 + 0.6 * 0.1.
    table = [[0.6, 0.3], [0.1, 0.0]]
    assert outcome_oracle([-1, 0, 0, 1], table) == pytest.approx(1.96, abs=1e-15)
    assert tree_expected_tokens(Tree([-1, 0, 0, 1]), table) == pytest.approx(1.96, abs=1e-15)


@given(trees(max_size=12), acceptance_vectors(max_width=5))
def test_a_depth_independent_table_gives_the_vector_value_bitwise(tree, acc):
    table = np.tile(acc, (max(tree.depth, 1), 1))
    assert tree_expected_tokens(tree, table) == tree_expected_tokens(tree, acc)
    np.testing.assert_array_equal(tree_token_distribution(tree, table), tree_token_distribution(tree, acc))


@given(trees(max_size=12), st.data())
def test_expected_tokens_is_monotone_in_every_table_entry(tree, data):
    table = data.draw(acceptance_vectors(max_width=4, rows=max(tree.depth, 1)))
    row = data.draw(st.integers(0, table.shape[0] - 1))
    column = data.draw(st.integers(0, table.shape[1] - 1))
    room = max(0.0, 1.0 - table[row].sum())  # raising one entry keeps the row a sub-probability
    raised = table.copy()
    raised[row, column] += data.draw(st.floats(0, 1)) * room
    assert tree_expected_tokens(tree, raised) >= tree_expected_tokens(tree, table) - 1e-12


@given(trees(max_size=10), st.data())
def test_adding_a_node_never_lowers_expected_tokens_under_a_depth_rank_table(tree, data):
    table = data.draw(acceptance_vectors(max_width=4, rows=tree.depth + 1))
    parent = data.draw(st.integers(0, tree.size - 1))
    bigger = Tree([*tree.parents.tolist(), parent])
    assert tree_expected_tokens(bigger, table) >= tree_expected_tokens(tree, table) - 1e-12


@given(acceptance_vectors(max_width=4), st.integers(1, 30), st.integers(1, 5))
def test_optimal_tree_with_a_depth_independent_table_equals_the_vector_with_that_depth_limit(
    acc, budget, rows
):
    table = np.tile(acc, (rows, 1))
    by_table = optimal_tree(table, budget)
    by_vector = optimal_tree(acc, budget, max_depth=rows)
    assert by_table.expected_tokens == pytest.approx(by_vector.expected_tokens, abs=1e-12)
    assert tree_expected_tokens(by_table.tree, acc) == pytest.approx(by_vector.expected_tokens, abs=1e-12)


def test_a_table_with_too_few_rows_is_a_value_error_naming_acc():
    with pytest.raises(ValueError, match="acc: .* 2 rows .* depth 3"):
        tree_expected_tokens(Tree.chain(3), [[0.5], [0.5]])
