"""executor.methods.calibration.depth_acceptance: the per-depth, per-rank acceptance estimated from step logs.

Oracles: synthetic step logs whose outcomes occur in exact proportions of a known table (so the estimate is
the table exactly, not approximately), hand-counted logs for censoring by missing siblings and for the pooling
fallback, and the theory's expected tokens of the calibration tree against the logs' mean tokens per step.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import theory
from executor.logs import StepLog
from executor.methods.calibration import depth_acceptance
from executor.methods.dyspec import calibration_tree


def step(parents, path) -> StepLog:
    """A step log with the tree ``parents`` and the accepted path ``path`` (token ids are irrelevant)."""
    depth = len(path) - 1
    drafted = max(theory.Tree(parents).depth, 1)
    return StepLog(
        tokens=list(range(len(parents))),
        parents=list(parents),
        accepted_path=list(path),
        emitted=[0] * (depth + 1),
        expanded=[],
        accepted=[d < depth for d in range(drafted)],
    )


def exact_population(parents, table):
    """Step logs of the static tree ``parents`` whose accepted paths occur exactly in proportion to their
    probability under the positional model ``table`` (``table[d-1][k-1]`` a Fraction): each node picks its
    accepted child (rank k with p(d, k), none with the rest), the walk follows the picks."""
    children = {}
    for node, parent in enumerate(parents[1:], start=1):
        children.setdefault(parent, []).append(node)
    paths = []  # (path, probability)
    stack = [([0], Fraction(1))]
    while stack:
        path, probability = stack.pop()
        kids = children.get(path[-1], [])
        row = table[len(path) - 1] if kids else []
        picks = [row[k] if k < len(row) else Fraction(0) for k in range(len(kids))]
        if kids and sum(picks) < 1:
            paths.append((path, probability * (1 - sum(picks))))
        elif not kids:
            paths.append((path, probability))
        for kid, pick in zip(kids, picks, strict=True):
            if pick:
                stack.append((path + [kid], probability * pick))
    scale = np.lcm.reduce([p.denominator for _, p in paths])
    steps = []
    for path, probability in paths:
        count = probability * scale
        assert count.denominator == 1
        steps += [step(parents, path)] * int(count)
    return steps


TABLE = [
    [Fraction(1, 2), Fraction(1, 4), Fraction(1, 8)],
    [Fraction(1, 4), Fraction(1, 4), Fraction(0)],
    [Fraction(1, 8), Fraction(0), Fraction(1, 8)],
]


def test_the_estimate_on_an_exact_population_of_the_calibration_tree_is_the_table():
    parents = calibration_tree(3, 3)
    steps = exact_population(parents, TABLE)
    estimate = depth_acceptance(steps, 3, 3, min_samples=1)
    np.testing.assert_array_equal(estimate.table, np.array(TABLE, dtype=float))
    assert estimate.pooled_from == 4  # nothing pooled
    # Trials: every step tries depth 1; depth 2 only after the first child was accepted, and so on.
    assert estimate.trials[:, 0].tolist() == [len(steps), len(steps) // 2, len(steps) // 8]
    # Its value under the theory is the population's mean tokens per step (bonus included).
    mean_tokens = np.mean([len(s.accepted_path) for s in steps])
    assert theory.tree_expected_tokens(theory.Tree(parents), estimate.table) == pytest.approx(
        mean_tokens, abs=1e-12
    )
    assert estimate.by_depth == pytest.approx([7 / 8, 1 / 2, 1 / 4])


def test_a_depth_blind_estimate_is_not_the_table():
    # Negative control: pooling every depth into one law (what the single-vector calibration did) misses the
    # same population's table, and its tree value misses the mean tokens per step.
    parents = calibration_tree(3, 3)
    steps = exact_population(parents, TABLE)
    blind = depth_acceptance(steps, 3, 3, min_samples=len(steps) + 1)  # depth 1 "thin": everything pooled
    assert blind.pooled_from == 1 and np.all(blind.table == blind.table[0])
    assert not np.allclose(blind.table, np.array(TABLE, dtype=float))
    mean_tokens = np.mean([len(s.accepted_path) for s in steps])
    assert abs(theory.tree_expected_tokens(theory.Tree(parents), blind.table) - mean_tokens) > 0.05


def test_a_chain_gives_the_conditional_acceptance_per_position():
    chain = [-1, 0, 1, 2]
    # 8 steps: 6 accept depth 1, 3 of them depth 2, 1 of those depth 3.
    paths = [[0]] * 2 + [[0, 1]] * 3 + [[0, 1, 2]] * 2 + [[0, 1, 2, 3]]
    estimate = depth_acceptance([step(chain, p) for p in paths], 3, 1, min_samples=1)
    assert estimate.table[:, 0].tolist() == [6 / 8, 3 / 6, 1 / 3]
    assert estimate.accepted[:, 0].tolist() == [6, 3, 1] and estimate.trials[:, 0].tolist() == [8, 6, 3]


def test_nodes_with_fewer_children_are_trials_only_for_the_ranks_they_have():
    # The root has 3 children in two steps and 1 child in the third (a dynamic tree): ranks 2 and 3 are
    # tried twice, rank 1 three times.
    steps = [step([-1, 0, 0, 0], [0, 2]), step([-1, 0, 0, 0], [0, 1]), step([-1, 0], [0])]
    estimate = depth_acceptance(steps, 1, 3, min_samples=1)
    assert estimate.trials[0].tolist() == [3, 2, 2]
    assert estimate.table[0].tolist() == [1 / 3, 1 / 2, 0.0]
    # A leaf reached ends the step's trials: nothing deeper is counted.
    assert depth_acceptance(steps, 2, 3, min_samples=1).trials[1].tolist() == [0, 0, 0]


def test_thin_deep_depths_are_pooled_into_the_last_well_estimated_depth():
    chain = [-1, 0, 1, 2, 3]
    # Depth trials 10, 6, 3, 1: with min_samples 5, depths 3 and 4 are thin and join depth 2.
    paths = [[0]] * 4 + [[0, 1]] * 3 + [[0, 1, 2]] * 2 + [[0, 1, 2, 3]]
    estimate = depth_acceptance([step(chain, p) for p in paths], 4, 1, min_samples=5)
    assert estimate.trials[:, 0].tolist() == [10, 6, 3, 1]
    assert estimate.accepted[:, 0].tolist() == [6, 3, 1, 0]
    pooled = (3 + 1 + 0) / (6 + 3 + 1)
    assert estimate.table[:, 0].tolist() == [6 / 10, pooled, pooled, pooled]
    assert estimate.pooled_from == 2
    # Depth 1 itself thin: one law for every depth, from all the counts.
    everything = depth_acceptance([step(chain, p) for p in paths], 4, 1, min_samples=11)
    assert everything.table[:, 0].tolist() == [10 / 20] * 4 and everything.pooled_from == 1


def test_a_rank_never_tried_at_a_depth_takes_its_estimate_over_all_depths():
    steps = [step([-1, 0, 0, 1], [0, 1, 3])] * 3 + [step([-1, 0, 0, 1], [0, 2])]
    estimate = depth_acceptance(steps, 2, 2, min_samples=1)
    # Depth 2 has one child per node: its rank 2 was never drafted and takes rank 2's overall rate (1 / 4);
    # the row [1, 1/4] then sums above 1 and is scaled down to [0.8, 0.2].
    assert estimate.trials.tolist() == [[4, 4], [3, 0]]
    np.testing.assert_allclose(estimate.table, [[3 / 4, 1 / 4], [0.8, 0.2]], rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_depth": 0}, "max_depth"),
        ({"width": 0}, "width"),
        ({"min_samples": 0}, "min_samples"),
        ({"steps": [object()]}, "steps\\[0\\]"),
        ({"steps": []}, "steps"),
    ],
)
def test_bad_arguments_are_value_errors_naming_them(kwargs, message):
    arguments = {"steps": [step([-1, 0], [0, 1])], "max_depth": 2, "width": 2, **kwargs}
    steps = arguments.pop("steps")
    with pytest.raises(ValueError, match=message):
        depth_acceptance(steps, **arguments)
