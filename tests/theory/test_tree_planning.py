"""Tests of theory.tree_planning: the hardware-aware planner, against the Sequoia repository and brute force."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.examples import sequoia_demo_acceptance
from theory import (
    Tree,
    drafting_seconds,
    optimal_tree,
    plan_tree,
    tree_expected_tokens,
)
from theory.strategies import acceptance_vectors
from theory.tree_planning import TIE_TOLERANCE

# --------------------------------------------------------------------------------------------------------
# The hardware-aware planner
# --------------------------------------------------------------------------------------------------------

# Infini-AI-Lab/Sequoia acceptance-rate-vector.pt (see experiments/examples.py), p_1 .. p_32.
SEQUOIA_ACC = sequoia_demo_acceptance()
# demo-config.json: valid_budget -> target_time, draft_time 0.3, max_depth 10 levels (root included).
SEQUOIA_DEMO_TIMES = {1: 10, 2: 10, 4: 10, 8: 12, 16: 14, 32: 18}


def test_plan_tree_reproduces_the_sequoia_repository_demo():
    # Running the repository's tree_search.py on demo-config.json prints
    # "4.887774467468262 2.0459208488464355 (4, 4)": a 4-node tree with 4 levels (a chain of 3 drafts),
    # G = 2.291431 tokens per step; its DP table gives G(32 nodes, 3..10 levels) and G(128, 10) below.
    plan = plan_tree(
        SEQUOIA_ACC, SEQUOIA_DEMO_TIMES, 0.3, max_budget=128, max_depth=9, convention="sequoia-repo"
    )
    assert plan.tree == Tree.chain(3)
    assert plan.expected_tokens == pytest.approx(2.291431427001953, rel=1e-6)
    assert plan.time_per_token == pytest.approx(4.887774467468262, rel=1e-6)
    assert plan.speedup == pytest.approx(2.0459208488464355, rel=1e-6)
    repo_g32 = [1.925038, 2.625595, 3.056043, 3.304736, 3.412315, 3.46284, 3.489567, 3.500739, 3.500739]
    ours = [optimal_tree(SEQUOIA_ACC, 32, max_depth=levels - 1).expected_tokens for levels in range(2, 11)]
    np.testing.assert_allclose(ours, repo_g32, atol=2e-6)
    assert optimal_tree(SEQUOIA_ACC, 128, max_depth=9).expected_tokens == pytest.approx(
        4.192107200622559, rel=1e-6
    )
    # Under the default convention (one draft pass per drafted level) the same configuration is cheaper.
    default = plan_tree(SEQUOIA_ACC, SEQUOIA_DEMO_TIMES, 0.3, max_budget=128, max_depth=9)
    assert default.speedup == pytest.approx(10 * default.expected_tokens / (10 + 0.3 * default.depth))
    assert default.speedup > plan.speedup


# Trees the repository's tree_search.py rebuilds from its DP table (breadth-first parent arrays), keyed by
# (nodes, levels with the root). The DP breaks ties as the repository does (first maximum): the trees match.
SEQUOIA_REPO_TREES = {
    (32, 6): [
        -1,
        0,
        0,
        0,
        0,
        0,
        0,
        1,
        1,
        1,
        2,
        3,
        7,
        7,
        7,
        8,
        9,
        10,
        11,
        12,
        12,
        13,
        15,
        16,
        17,
        18,
        19,
        19,
        20,
        21,
        22,
        24,
    ],
    (64, 7): [
        -1,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        1,
        1,
        1,
        1,
        1,
        1,
        2,
        2,
        3,
        4,
        5,
        6,
        9,
        10,
        10,
        10,
        10,
        10,
        11,
        12,
        13,
        14,
        16,
        17,
        18,
        19,
        20,
        23,
        23,
        23,
        24,
        25,
        28,
        29,
        32,
        34,
        37,
        37,
        37,
        38,
        39,
        40,
        41,
        42,
        43,
        44,
        45,
        46,
        46,
        47,
        49,
        51,
        53,
        55,
    ],
}


@pytest.mark.parametrize("size, levels", sorted(SEQUOIA_REPO_TREES))
def test_optimal_tree_rebuilds_the_sequoia_repository_trees(size, levels):
    solution = optimal_tree(SEQUOIA_ACC, size, max_depth=levels - 1, max_width=32)
    assert solution.tree.parents.tolist() == SEQUOIA_REPO_TREES[size, levels]


def test_optimal_tree_matches_the_repository_on_128_nodes_up_to_exact_ties():
    # (128, 10 levels): the repository's tree has levels [1, 13, 19, 27, 26, 11, 13, 8, 9, 1] and the same
    # value; its parent array differs only by swapping subtrees between children of equal acceptance
    # (several p_k are 2/667), an exact tie its float32 table breaks differently.
    solution = optimal_tree(SEQUOIA_ACC, 128, max_depth=9, max_width=32)
    assert solution.tree.level_sizes().tolist() == [1, 13, 19, 27, 26, 11, 13, 8, 9, 1]
    assert solution.expected_tokens == pytest.approx(4.192107200622559, rel=1e-6)


@given(
    acceptance_vectors(max_width=4), st.integers(1, 12), st.integers(0, 5), st.floats(0, 2), st.floats(0, 3)
)
@settings(max_examples=200)
def test_plan_tree_is_the_best_of_every_size_and_depth(acc, max_budget, max_depth, draft_time, slope):
    # Oracle: score every (n, d) with optimal_tree directly. plan_tree promises the best time per token and,
    # among the pairs tied with it (within TIE_TOLERANCE), the smallest size, then depth: every pair before
    # the chosen one in (n, d) order is measurably worse (by half the tolerance, so that rounding in either
    # computation cannot flip the verdict).
    def verify(n):
        return 1.0 + slope * max(n - 4, 0)  # flat, then linear

    plan = plan_tree(acc, verify, draft_time, max_budget=max_budget, max_depth=max_depth)
    times = {}
    for n in range(1, max_budget + 1):
        for d in range(max_depth + 1):
            solution = optimal_tree(acc, n, max_depth=d)
            if solution.tree.size == n:
                times[n, d] = (verify(n) + d * draft_time) / solution.expected_tokens
    best_time = min(times.values())
    chosen = (plan.tree.size, plan.tree.depth)
    assert plan.time_per_token == pytest.approx(best_time, rel=1e-9)
    assert all(time > best_time * (1 + TIE_TOLERANCE / 2) for pair, time in times.items() if pair < chosen)
    assert plan.speedup == pytest.approx(verify(1) / best_time, rel=1e-9)
    assert plan.tree.size <= max_budget and plan.tree.depth <= max_depth
    assert plan.expected_tokens == pytest.approx(tree_expected_tokens(plan.tree, acc), rel=1e-12)
    assert plan.alternatives[0].speedup == plan.speedup
    assert all(a.speedup >= b.speedup for a, b in itertools.pairwise(plan.alternatives[1:]))


@given(
    acceptance_vectors(max_width=4),
    st.integers(1, 10),
    st.integers(0, 4),
    st.floats(0, 1),
    st.floats(0, 2),
    st.floats(0, 1),
)
def test_plan_tree_with_overheads_is_the_best_of_every_size_and_depth(
    acc, max_budget, max_depth, draft_time, step_overhead, plain_overhead
):
    # Oracle: a drafting step costs its passes plus step_overhead, plain decoding (n = 1, d = 0) t(1) plus
    # plain_overhead, and the speedup is tokens per second against plain decoding's.
    def verify(n):
        return 1.0 + 0.1 * n

    plan = plan_tree(
        acc,
        verify,
        draft_time,
        max_budget=max_budget,
        max_depth=max_depth,
        step_overhead=step_overhead,
        plain_overhead=plain_overhead,
    )
    times = {}
    for n in range(1, max_budget + 1):
        for d in range(max_depth + 1):
            solution = optimal_tree(acc, n, max_depth=d)
            if solution.tree.size == n and solution.tree.depth == d:  # a shallower tree scores at its depth
                overhead = step_overhead if d > 0 else plain_overhead
                times[n, d] = (verify(n) + d * draft_time + overhead) / solution.expected_tokens
    best_time = min(times.values())
    chosen = (plan.tree.size, plan.tree.depth)
    assert plan.time_per_token == pytest.approx(best_time, rel=1e-9)
    assert all(time > best_time * (1 + TIE_TOLERANCE / 2) for pair, time in times.items() if pair < chosen)
    assert plan.speedup == pytest.approx((verify(1) + plain_overhead) / best_time, rel=1e-9)
    assert plan.speedup >= 1.0 - 1e-12  # plain decoding is always a candidate


def test_a_step_overhead_beyond_every_gain_plans_plain_decoding():
    # Sequoia's formula plans a 5-node tree here (2.05 tokens for 1.25 passes: 1.64x); a step overhead of one
    # pass leaves no tree worth drafting (2.05 for 2.25: 0.91x), and as much overhead on plain decoding
    # charges both sides alike (2 x 2.05 / 2.25: 1.82x).
    acc = [0.5, 0.2]
    plan = plan_tree(acc, {1: 1.0, 5: 1.05}, 0.1, max_budget=5, max_depth=2)
    assert plan.size == 5 and plan.speedup == pytest.approx(2.05 / 1.25)
    dear = plan_tree(acc, {1: 1.0, 5: 1.05}, 0.1, max_budget=5, max_depth=2, step_overhead=1.0)
    assert dear.size == 1 and dear.speedup == 1.0
    both = plan_tree(
        acc, {1: 1.0, 5: 1.05}, 0.1, max_budget=5, max_depth=2, step_overhead=1.0, plain_overhead=1.0
    )
    assert both.size == 5 and both.speedup == pytest.approx(2.0 * 2.05 / 2.25)


def test_plan_tree_breaks_an_exact_tie_towards_the_smaller_tree():
    # The reported flake: the 3-node star pays exactly for its draft pass (1 + sum(acc) tokens for
    # 1 + draft_time seconds), so it ties with the 1-node plan; rounding put either one ahead.
    acc = [0.01597332, 0.02233768]
    plan = plan_tree(acc, lambda n: 1.0, 0.03831100033339797, max_budget=3, max_depth=1)
    assert (plan.tree.size, plan.tree.depth) == (1, 0)
    assert plan.speedup == pytest.approx(1.0, rel=1e-9)
    # A draft pass a little cheaper breaks the tie the other way.
    assert plan_tree(acc, lambda n: 1.0, 0.0383, max_budget=3, max_depth=1).tree.size == 3


@given(acceptance_vectors(max_width=3, rows=3), st.integers(1, 10), st.floats(0, 1))
def test_plan_tree_with_per_depth_acceptance_scores_the_optimal_trees(acc, max_budget, draft_time):
    plan = plan_tree(acc, lambda n: 1.0 + 0.1 * n, draft_time, max_budget=max_budget, max_depth=3)
    for candidate in plan.alternatives:
        solution = optimal_tree(acc, candidate.size, max_depth=candidate.depth)
        assert candidate.expected_tokens == pytest.approx(solution.expected_tokens, rel=1e-12)
        assert candidate.step_time == pytest.approx(1.0 + 0.1 * candidate.size + candidate.depth * draft_time)


@given(acceptance_vectors(max_width=3), st.integers(1, 10), st.floats(0, 1), st.integers(1, 4))
def test_plan_tree_with_a_depth_independent_table_plans_like_the_vector(acc, max_budget, draft_time, rows):
    def verify(n):
        return 1.0 + 0.1 * n

    by_table = plan_tree(np.tile(acc, (rows, 1)), verify, draft_time, max_budget=max_budget, max_depth=rows)
    by_vector = plan_tree(acc, verify, draft_time, max_budget=max_budget, max_depth=rows)
    assert by_table.speedup == pytest.approx(by_vector.speedup, rel=1e-12)
    assert by_table.expected_tokens == pytest.approx(by_vector.expected_tokens, rel=1e-12)


@given(
    acceptance_vectors(max_width=3),
    st.integers(1, 10),
    st.integers(0, 4),
    st.lists(st.floats(0, 1), min_size=1, max_size=4),
)
def test_plan_tree_charges_each_levels_own_draft_pass(acc, max_budget, max_depth, level_times):
    """With per-level pass times a depth-d plan pays the first d of them (the last repeated), and a single
    time plans as the number does."""
    plan = plan_tree(acc, lambda n: 1.0 + 0.1 * n, level_times, max_budget=max_budget, max_depth=max_depth)
    padded = level_times + [level_times[-1]] * max_depth
    for candidate in plan.alternatives:
        drafting = sum(padded[: candidate.depth])
        assert candidate.step_time == pytest.approx(
            1.0 + 0.1 * candidate.size + drafting, rel=1e-12, abs=1e-15
        )
    alone = plan_tree(
        acc, lambda n: 1.0 + 0.1 * n, level_times[:1], max_budget=max_budget, max_depth=max_depth
    )
    number = plan_tree(
        acc, lambda n: 1.0 + 0.1 * n, level_times[0], max_budget=max_budget, max_depth=max_depth
    )
    assert alone.tree.parents.tolist() == number.tree.parents.tolist() and alone.speedup == number.speedup


def test_drafting_seconds_sums_the_first_passes():
    assert drafting_seconds(0.7, 3) == 3 * 0.7  # a number: exactly passes * time, as before sequences
    assert drafting_seconds([0.3, 0.1], 0) == 0.0
    assert drafting_seconds([0.3, 0.1], 1) == pytest.approx(0.3)
    assert drafting_seconds([0.3, 0.1], 4) == pytest.approx(0.3 + 3 * 0.1)  # the last level repeats
    with pytest.raises(ValueError, match="passes"):
        drafting_seconds(0.1, -1)


def test_a_dear_first_pass_and_cheap_later_ones_favour_deeper_trees():
    # A first pass dearer than the flat cost and later ones far cheaper (0.05 against 0.2): every level past
    # the first costs less, so the plan goes deeper.
    acc = [0.7, 0.1]
    flat = plan_tree(acc, lambda n: 1.0 + 0.02 * n, 0.2, max_budget=12, max_depth=6)
    front = plan_tree(acc, lambda n: 1.0 + 0.02 * n, [0.6, 0.05], max_budget=12, max_depth=6)
    assert front.tree.depth > flat.tree.depth


def test_conventions_differ_by_one_draft_pass():
    drafted = plan_tree([0.6, 0.2], {1: 1.0, 8: 1.2}, 0.1, max_budget=8, max_depth=4)
    repo = plan_tree([0.6, 0.2], {1: 1.0, 8: 1.2}, 0.1, max_budget=8, max_depth=4, convention="sequoia-repo")
    by_key = {(c.size, c.depth): c for c in drafted.alternatives}
    for candidate in repo.alternatives:
        assert candidate.step_time == pytest.approx(by_key[candidate.size, candidate.depth].step_time + 0.1)


def test_free_verification_and_drafting_picks_the_largest_tree():
    plan = plan_tree([0.6, 0.2], lambda n: 1.0, 0.0, max_budget=20, max_depth=19)
    assert plan.size == 20
    assert plan.expected_tokens == pytest.approx(optimal_tree([0.6, 0.2], 20).expected_tokens)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"draft_time": -0.1}, "draft_time"),
        ({"draft_time": []}, "non-empty sequence"),
        ({"draft_time": [0.1, -0.2]}, "draft_time\\[1\\]"),
        ({"draft_time": "0.1"}, "draft_time must be a number"),
        ({"target_time": {2: 1.0}}, "1 token"),
        ({"target_time": {1: -1.0}}, "target_time\\[1\\]"),
        ({"target_time": {1: 0.0}}, "positive"),
        ({"target_time": {1: 1.0, 0: 1.0}}, "sizes"),
        ({"target_time": [1.0, 2.0]}, "mapping"),
        ({"target_time": lambda n: float("nan")}, "finite"),
        ({"max_budget": 0}, "max_budget"),
        ({"max_depth": -1}, "max_depth"),
        ({"convention": "levels"}, "convention"),
        ({"acc": [0.9, 0.2]}, "at most 1"),
        ({"step_overhead": -0.1}, "step_overhead must be non-negative"),
        ({"plain_overhead": float("inf")}, "plain_overhead must be a finite number"),
    ],
)
def test_plan_tree_rejects_bad_input(kwargs, message):
    arguments = {"acc": [0.6, 0.2], "target_time": {1: 1.0, 4: 1.1}, "draft_time": 0.1}
    arguments.update(kwargs)
    keywords = {"max_budget": kwargs.get("max_budget", 8), "max_depth": kwargs.get("max_depth", 3)}
    for name in ("convention", "step_overhead", "plain_overhead"):
        if name in kwargs:
            keywords[name] = kwargs[name]
    with pytest.raises(ValueError, match=message):
        plan_tree(arguments["acc"], arguments["target_time"], arguments["draft_time"], **keywords)
