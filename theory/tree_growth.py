"""Token trees grown best-first: the greedy tree under positional acceptance and DySpec's dynamic tree.

Both pop the most promising candidate node from a max-heap until the node budget is spent (DySpec, Xiong
et al. 2024, arXiv 2410.11744; EAGLE-2, Li et al., EMNLP 2024, arXiv 2406.16858). Optimal trees are in
:mod:`theory.trees`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from theory.checks import as_count, as_distribution
from theory.trees import Tree, TreeSolution, _depth_and_width, as_acceptance

__all__ = ["DySpecTree", "dynamic_tree", "greedy_tree"]


def greedy_tree(
    acc, budget: int, *, max_depth: int | None = None, max_width: int | None = None
) -> TreeSolution:
    """Grow a tree best-first: repeatedly add the frontier node with the largest score ``f(v)``.

    The frontier holds, for every node, its next child position only (children are ordered). Each step adds
    the candidate with the largest score ``f(parent) * p_k`` (ties to the earliest candidate), the heap of
    DySpec (Xiong et al. 2024, arXiv 2410.11744, Alg. 1) and EAGLE-2's reranking (Li et al., EMNLP 2024,
    arXiv 2406.16858) under positional acceptance. With a non-increasing acceptance vector the scores are
    monotone along paths and sibling orders, and the greedy tree is optimal (DySpec App. D.1); otherwise it
    can fall short of :func:`optimal_tree`.
    """
    matrix = as_acceptance(acc)
    per_depth = np.ndim(acc) == 2
    budget = as_count(budget, "budget")
    depth_limit, width = _depth_and_width(matrix, per_depth, budget, max_depth, max_width)
    parents, depths, children, scores = [-1], [0], [0], [1.0]
    counter = itertools.count()
    heap: list[tuple[float, int, int]] = []

    def offer(node: int) -> None:
        """Push the next child position of ``node`` if the limits allow one."""
        k, depth = children[node], depths[node]
        if k < width and (depth_limit is None or depth < depth_limit):
            score = scores[node] * matrix[depth if per_depth else 0, k]
            heapq.heappush(heap, (-score, next(counter), node))

    offer(0)
    while len(parents) < budget and heap:
        negative_score, _, parent = heapq.heappop(heap)
        parents.append(parent)
        depths.append(depths[parent] + 1)
        children.append(0)
        scores.append(-negative_score)
        children[parent] += 1
        offer(parent)
        offer(len(parents) - 1)
    return TreeSolution(Tree(parents), float(np.sum(scores)))


@dataclass(frozen=True)
class DySpecTree:
    """A tree built by :func:`dynamic_tree`.

    Attributes
    ----------
    tree : Tree
    tokens : numpy.ndarray
        Drafted token id of every node (``-1`` for the root, which stands for the last verified token).
    values : numpy.ndarray
        DySpec's estimate that each node is reached and accepted: ``v * R[y]`` at its creation (root 1).
    draft_calls : int
        How many times the draft oracle was called (once per expanded node).
    """

    tree: Tree
    tokens: np.ndarray
    values: np.ndarray
    draft_calls: int

    @property
    def expected_tokens(self) -> float:
        """DySpec's estimate of the accepted length plus the bonus token: the sum of ``values``."""
        return float(self.values.sum())


def dynamic_tree(
    draft: Callable[[tuple[int, ...]], np.ndarray],
    budget: int,
    *,
    rng: np.random.Generator | None = None,
    max_depth: int | None = None,
) -> DySpecTree:
    """DySpec's dynamic token tree, grown from the draft model's actual probabilities.

    Algorithm 1 of Xiong et al., "DySpec: Faster Speculative Decoding with Dynamic Token Tree Structure"
    (arXiv 2410.11744, 2024). A max-heap holds sampling sites ``(v, R)``: ``R`` the residual draft
    distribution at a position and ``v`` the estimated probability that a sample there gets verified.
    Until the tree has ``budget`` nodes: pop the largest ``v``, draw ``y ~ R`` and add node ``y``; push the
    next sibling site ``(v * (1 - R[y]), norm(R with R[y] = 0))`` and the first-child site
    ``(v * R[y], draft(path + (y,)))``. Siblings are thus drawn without replacement.

    Parameters
    ----------
    draft : callable
        ``draft(path)`` returns the draft distribution of the next token after the token ids ``path`` (the
        empty tuple for the root); the executor passes its draft model here.
    budget : int
        Maximum number of nodes, root included.
    rng : numpy.random.Generator, optional
        Draws ``y ~ R``; without it the most probable token is taken (ties to the lowest id), i.e. the top-k
        tree of greedy decoding.
    max_depth : int, optional
        Limit on drafted levels.

    Notes
    -----
    The draft is called when a child site is first popped rather than when it is pushed: the heap key
    ``v * R[y]`` does not need the child's distribution, so the tree is the paper's while leaves cost no
    draft call.
    """
    if not callable(draft):
        raise ValueError(f"draft must be a callable path -> probabilities, got {type(draft).__name__}")
    budget = as_count(budget, "budget")
    if max_depth is not None:
        max_depth = as_count(max_depth, "max_depth", minimum=0)
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator or None, got {type(rng).__name__}")
    parents, tokens, values, depths, paths = [-1], [-1], [1.0], [0], [()]
    residuals: dict[int, np.ndarray] = {}  # node -> residual draft distribution at its next child site
    draft_calls = 0
    counter = itertools.count()
    heap = [(-1.0, next(counter), 0)] if max_depth != 0 else []
    while len(parents) < budget and heap:
        negative_v, _, node = heapq.heappop(heap)
        v = -negative_v
        if node not in residuals:
            residuals[node] = as_distribution(draft(paths[node]), "draft(path)").copy()
            draft_calls += 1
        residual = residuals[node]
        if rng is None:
            y = int(np.argmax(residual))
        else:
            y = int(rng.choice(residual.size, p=residual))
        child_value = v * residual[y]
        parents.append(node)
        tokens.append(y)
        values.append(child_value)
        depths.append(depths[node] + 1)
        paths.append(paths[node] + (y,))
        child = len(parents) - 1
        remaining = 1.0 - residual[y]
        residual[y] = 0.0
        total = residual.sum()
        if total > 0:  # DySpec Alg. 3: an exhausted draft distribution ends the siblings
            residual /= total
            heapq.heappush(heap, (-v * remaining, next(counter), node))
        if child_value > 0 and (max_depth is None or depths[child] < max_depth):
            heapq.heappush(heap, (-child_value, next(counter), child))
    return DySpecTree(Tree(parents), np.array(tokens), np.array(values), draft_calls)
