"""Staged speculative decoding: the draft model is itself sped up by a cheaper draft ("draft squared").

Spector & Ré, "Accelerating LLM Inference with Staged Speculative Decoding", ES-FoMo @ ICML 2023,
arXiv 2308.04623. The target verifies an *outer* tree drafted by the draft model; the draft produces that
tree's main chain not one forward pass per token but by verifying *inner* trees proposed by draft²
(a trigram model in the paper). Inner speculation is lossless for the draft's distribution, so the outer
tree's acceptance, and hence its expected tokens, are unchanged; what drops is the draft's sequential time.

Model (stated, not from the paper, which gives no formula): the draft's sequential work is the outer tree's
main chain of ``L = depth(outer)`` tokens; side branches come from the same forward passes (top
alternatives of each distribution, batched per level). One inner round costs ``draft_time(|inner|) +
depth(inner) * draft2_time`` and yields ``K`` draft tokens with the law of
:func:`~theory.trees.tree_token_distribution`; the number of rounds to reach ``L`` tokens is the renewal
count ``R(L) = min{r : K_1 + ... + K_r >= L}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from theory.checks import as_count, as_nonnegative
from theory.tree_planning import as_time_table
from theory.trees import as_tree, tree_expected_tokens, tree_token_distribution

__all__ = ["StagedStep", "expected_rounds", "staged_step"]


def expected_rounds(length: int, tokens_per_round) -> float:
    """Expected number of rounds until at least ``length`` tokens are produced.

    ``tokens_per_round[k-1] = P(K = k)`` for ``k >= 1`` (every round yields at least one token). By the
    renewal equation

    .. math:: E[R(\\ell)] = 1 + \\sum_k P(K = k)\\, E[R(\\ell - k)],

    with ``E[R(l)] = 0`` for ``l <= 0``.

    One token per round gives ``length``; ``K = k`` surely gives ``ceil(length / k)``.
    """
    length = as_count(length, "length", minimum=0)
    law = np.asarray(tokens_per_round, dtype=np.float64)
    if law.ndim != 1 or law.size == 0 or not np.all(np.isfinite(law)) or np.any(law < 0):
        raise ValueError("tokens_per_round must be a non-empty vector of non-negative probabilities")
    if abs(law.sum() - 1) > 1e-6:
        raise ValueError(f"tokens_per_round must sum to 1 (it is the law of K >= 1), got {law.sum():.9g}")
    rounds = np.zeros(length + 1)
    k = np.arange(1, law.size + 1)
    for remaining in range(1, length + 1):
        rounds[remaining] = 1 + law @ rounds[np.maximum(remaining - k, 0)]
    return float(rounds[length])


@dataclass(frozen=True)
class StagedStep:
    """Cost model of one target verification step with staged drafting.

    Attributes
    ----------
    expected_tokens : float
        Tokens per target step, ``F(outer)`` (unchanged by inner speculation).
    inner_tokens_per_round : float
        Draft tokens per inner round, ``F(inner)``.
    draft_rounds : float
        Expected inner rounds to draft the outer main chain, ``E[R(depth(outer))]``.
    step_time, speedup : float
        Seconds per target step and ``target_time(1) * expected_tokens / step_time``.
    unstaged_step_time, unstaged_speedup : float
        The same without draft² (one draft pass per outer level).
    """

    expected_tokens: float
    inner_tokens_per_round: float
    draft_rounds: float
    step_time: float
    speedup: float
    unstaged_step_time: float
    unstaged_speedup: float


def staged_step(
    outer_tree,
    outer_acc,
    inner_tree,
    inner_acc,
    *,
    target_time: Mapping[int, float] | Callable[[int], float] | float,
    draft_time: Mapping[int, float] | Callable[[int], float] | float,
    draft2_time: float,
) -> StagedStep:
    """Tokens, time and speedup of a target step whose draft is itself speculated (Spector & Ré 2023).

    .. math::
        t_{step} = t_{target}(|T_1|)
            + E[R(L)]\\,\\bigl(t_{draft}(|T_2|) + \\mathrm{depth}(T_2)\\, t_{draft^2}\\bigr),
        \\qquad \\mathrm{speedup} = t_{target}(1)\\, F(T_1) / t_{step},

    with ``T_1`` the outer tree (acceptance ``outer_acc`` of the draft against the target), ``T_2`` the inner
    tree (acceptance ``inner_acc`` of draft² against the draft), ``L = depth(T_1)`` and ``R`` the renewal
    count of :func:`expected_rounds` (Spector & Ré, arXiv 2308.04623; cost model described in the module
    docstring). The unstaged reference charges ``L * draft_time(1)``; a one-node inner tree reproduces it.

    Parameters
    ----------
    target_time, draft_time : mapping, callable or float
        Seconds for the target (draft) to verify ``n`` tokens in one pass; a float is size-independent.
    draft2_time : float
        Seconds per draft² pass (one per inner drafted level).
    """
    outer_tree = as_tree(outer_tree, "outer_tree")
    inner_tree = as_tree(inner_tree, "inner_tree")
    target = as_time_table(target_time, "target_time", max_size=outer_tree.size)
    draft = as_time_table(draft_time, "draft_time", max_size=inner_tree.size)
    draft2_time = as_nonnegative(draft2_time, "draft2_time")
    for name, table, size in (
        ("target_time", target, outer_tree.size),
        ("draft_time", draft, inner_tree.size),
    ):
        if size not in table:
            raise ValueError(f"{name} has no time for {size} tokens (sizes given: {sorted(table)})")
    outer_tokens = tree_expected_tokens(outer_tree, outer_acc)
    inner_law = tree_token_distribution(inner_tree, inner_acc)
    rounds = expected_rounds(outer_tree.depth, inner_law)
    round_time = draft[inner_tree.size] + inner_tree.depth * draft2_time
    step_time = target[outer_tree.size] + rounds * round_time
    unstaged_time = target[outer_tree.size] + outer_tree.depth * draft[1]
    baseline = target[1] * outer_tokens
    return StagedStep(
        expected_tokens=outer_tokens,
        inner_tokens_per_round=float(inner_law @ np.arange(1, inner_law.size + 1)),
        draft_rounds=rounds,
        step_time=step_time,
        speedup=baseline / step_time if step_time > 0 else np.inf,
        unstaged_step_time=unstaged_time,
        unstaged_speedup=baseline / unstaged_time if unstaged_time > 0 else np.inf,
    )
