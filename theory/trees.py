"""Token trees for speculative decoding: the tree type, its expected tokens and Sequoia's optimal trees.

Trees grown best-first (greedy, DySpec) are in :mod:`theory.tree_growth`.

A token tree is verified by the target in one forward pass; the accepted tokens form a root-to-node path.
Under Sequoia's *positional acceptance* assumption (Chen et al., "Sequoia: Scalable, Robust, and
Hardware-aware Speculative Decoding", NeurIPS 2024, arXiv 2402.12374, Def. 3.1-3.2) the probability that the
``k``-th child of an accepted node is the accepted one is ``acc[k-1]``, whatever the node, so
``sum(acc) <= 1`` (siblings are mutually exclusive). A per-depth acceptance *matrix* ``acc[r, k-1]`` (row
``r`` for the children at depth ``r + 1``) models drafters whose acceptance decays with depth (Sequoia
App. F.1.1; EAGLE, Medusa, self-drafting).

Conventions: a tree is a parent array with ``parents[0] == -1`` (the root, which stands for the bonus token)
and ``parents[i] < i`` (parents come first); the children of a node are ordered by index, so the ``k``-th
child is the ``k``-th smallest index among the node's children. Tree size counts the root; depth counts the
drafted levels (the root has depth 0).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral

import numpy as np

from theory.checks import SUM_TOLERANCE, as_count, as_probabilities

__all__ = [
    "Tree",
    "TreeSolution",
    "as_acceptance",
    "tree_expected_tokens",
    "tree_token_distribution",
    "simulate_tree_tokens",
    "optimal_tree",
]


class Tree:
    """A token tree stored as a parent array.

    Parameters
    ----------
    parents : sequence of int
        ``parents[0] == -1`` is the root; for ``i > 0``, ``0 <= parents[i] < i``. The children of a node are
        ordered by index: the ``k``-th child (1-based) uses acceptance entry ``k``.

    Examples
    --------
    >>> Tree([-1, 0, 0, 1]).children(0)
    array([1, 2])
    >>> Tree.chain(2).parents
    array([-1,  0,  1])
    """

    __slots__ = ("_parents", "_depths", "_ranks", "_level_order")

    def __init__(self, parents: Sequence[int] | np.ndarray):
        raw = np.asarray(parents)
        if raw.ndim != 1 or raw.size == 0:
            raise ValueError(f"parents must be a non-empty 1-D sequence of ints, got shape {raw.shape}")
        if raw.dtype.kind not in "iu" and not (
            raw.dtype.kind == "f" and np.all(np.isfinite(raw)) and np.all(raw == np.round(raw))
        ):
            raise ValueError(f"parents must contain integers, got dtype {raw.dtype}")
        array = raw.astype(np.int64)
        if array[0] != -1:
            raise ValueError(f"parents[0] must be -1 (the root), got {array[0]}")
        index = np.arange(array.size)
        bad = np.flatnonzero((array[1:] < 0) | (array[1:] >= index[1:])) + 1
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"parents[{i}] must lie in [0, {i - 1}] (parents come before children), got {array[i]}"
            )
        array.setflags(write=False)
        self._parents = array
        depths = np.zeros(array.size, dtype=np.int64)
        ranks = np.zeros(array.size, dtype=np.int64)
        counts = np.zeros(array.size, dtype=np.int64)
        # One pass in index order: parents come first, so their depth and child count are final.
        for i in range(1, array.size):
            parent = array[i]
            depths[i] = depths[parent] + 1
            counts[parent] += 1
            ranks[i] = counts[parent]
        depths.setflags(write=False)
        ranks.setflags(write=False)
        self._depths = depths
        self._ranks = ranks
        self._level_order = None

    # -- builders ---------------------------------------------------------------------------------------
    @classmethod
    def expansion(cls, widths: Sequence[int]) -> Tree:
        """Every node at depth ``i`` has ``widths[i]`` children (SpecInfer's expansion vector)."""
        parents = [-1]
        frontier = [0]
        for level, width in enumerate(widths):
            width = as_count(width, f"widths[{level}]", minimum=1)
            next_frontier = []
            for node in frontier:
                for _ in range(width):
                    next_frontier.append(len(parents))
                    parents.append(node)
            frontier = next_frontier
        return cls(parents)

    @classmethod
    def chain(cls, gamma: int) -> Tree:
        """A chain of ``gamma`` drafted tokens below the root (size ``gamma + 1``), as in Leviathan et al."""
        gamma = as_count(gamma, "gamma", minimum=0)
        return cls(np.arange(gamma + 1) - 1)

    @classmethod
    def star(cls, width: int) -> Tree:
        """The root with ``width`` children: ``width`` single-token drafts (multi-draft speculation)."""
        width = as_count(width, "width", minimum=0)
        return cls([-1] + [0] * width)

    # -- structure --------------------------------------------------------------------------------------
    @property
    def parents(self) -> np.ndarray:
        """The parent array (read-only int64)."""
        return self._parents

    @property
    def size(self) -> int:
        """Number of nodes, root included (tokens the target processes per verification)."""
        return int(self._parents.size)

    def __len__(self) -> int:
        return self.size

    @property
    def depths(self) -> np.ndarray:
        """Depth of every node (root 0), read-only int64."""
        return self._depths

    @property
    def depth(self) -> int:
        """Number of drafted levels (the largest node depth)."""
        return int(self._depths.max())

    @property
    def ranks(self) -> np.ndarray:
        """Position ``k`` (1-based) of each node among its siblings; 0 for the root."""
        return self._ranks

    def children(self, node: int) -> np.ndarray:
        """Children of ``node`` in order (the ``k``-th uses acceptance entry ``k``)."""
        if isinstance(node, bool) or not isinstance(node, Integral) or not 0 <= node < self.size:
            raise ValueError(f"node must be an integer in [0, {self.size - 1}], got {node!r}")
        return np.flatnonzero(self._parents == node)

    def num_children(self) -> np.ndarray:
        """Number of children of every node."""
        return np.bincount(self._parents[1:], minlength=self.size)

    def level_sizes(self) -> np.ndarray:
        """Number of nodes at each depth ``0 .. depth``."""
        return np.bincount(self._depths)

    def _levels(self) -> list[np.ndarray]:
        if self._level_order is None:
            order = np.argsort(self._depths, kind="stable")
            self._level_order = np.split(order, np.cumsum(self.level_sizes())[:-1])
        return self._level_order

    # -- what the executor needs ------------------------------------------------------------------------
    def attention_mask(self) -> np.ndarray:
        """``(size, size)`` bool mask: ``mask[i, j]`` is True iff ``j`` is ``i`` or an ancestor of ``i``.

        Row ``i`` is the tree-causal mask of node ``i`` inside the speculated block (SpecInfer's tree
        attention); it is built one depth level at a time.
        """
        mask = np.zeros((self.size, self.size), dtype=bool)
        for level in self._levels():
            if level[0] != 0:
                mask[level] = mask[self._parents[level]]
            mask[level, level] = True
        return mask

    def positions(self, offset: int = 0) -> np.ndarray:
        """Position id of every node: ``offset + depth`` (the root sits at ``offset``)."""
        offset = as_count(offset, "offset", minimum=0)
        return self._depths + offset

    def path(self, node: int) -> list[int]:
        """Node indices from the root to ``node``, inclusive."""
        self.children(node)  # validates node
        nodes = [int(node)]
        while nodes[-1] != 0:
            nodes.append(int(self._parents[nodes[-1]]))
        return nodes[::-1]

    # -- serialisation and display ----------------------------------------------------------------------
    def to_json(self) -> str:
        """JSON object ``{"parents": [...]}``; :meth:`from_json` reads it back."""
        return json.dumps({"parents": self._parents.tolist()})

    @classmethod
    def from_json(cls, text: str) -> Tree:
        """Read a tree written by :meth:`to_json` (an object with a ``parents`` list, or a bare list)."""
        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError) as error:
            raise ValueError(f"text is not valid JSON: {error}") from None
        if isinstance(data, dict):
            if "parents" not in data:
                raise ValueError("text must be a JSON object with a 'parents' key")
            data = data["parents"]
        if not isinstance(data, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in data
        ):
            raise ValueError("parents in the JSON text must be a list of integers")
        return cls(data)

    def ascii(self, labels: Sequence[str] | None = None) -> str:
        """Draw the tree with box characters, one node per line; ``labels[i]`` replaces the node index."""
        if labels is not None and len(labels) != self.size:
            raise ValueError(f"labels must have one entry per node ({self.size}), got {len(labels)}")
        name = (lambda i: str(i)) if labels is None else (lambda i: str(labels[i]))
        children = [[] for _ in range(self.size)]
        for i in range(1, self.size):
            children[self._parents[i]].append(i)
        lines = [name(0)]
        stack = [(child, "", k == len(children[0]) - 1) for k, child in enumerate(children[0])][::-1]
        while stack:
            node, prefix, last = stack.pop()
            lines.append(f"{prefix}{'└── ' if last else '├── '}{name(node)}")
            below = prefix + ("    " if last else "│   ")
            kids = children[node]
            stack.extend([(child, below, k == len(kids) - 1) for k, child in enumerate(kids)][::-1])
        return "\n".join(lines)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tree) and np.array_equal(self._parents, other._parents)

    def __hash__(self) -> int:
        return hash(self._parents.tobytes())

    def __repr__(self) -> str:
        return f"Tree(size={self.size}, depth={self.depth}, levels={self.level_sizes().tolist()})"


def as_tree(value, name: str = "tree") -> Tree:
    """Accept a :class:`Tree`, a :class:`TreeSolution` or a parent array."""
    if isinstance(value, Tree):
        return value
    if isinstance(value, TreeSolution):
        return value.tree
    try:
        return Tree(value)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None


def as_acceptance(acc, name: str = "acc") -> np.ndarray:
    """Validate a positional acceptance vector ``(W,)`` or per-depth matrix ``(rows, W)``; return it 2-D.

    Entries must lie in [0, 1] and every row must sum to at most 1 (the accepted child is unique), within
    :data:`theory.checks.SUM_TOLERANCE`.
    """
    array = as_probabilities(acc, name)
    if array.ndim not in (1, 2) or array.shape[-1] == 0 or array.size == 0:
        raise ValueError(
            f"{name} must be a non-empty vector (W,) or matrix (depths, W), got shape {array.shape}"
        )
    matrix = np.atleast_2d(array)
    sums = matrix.sum(axis=1)
    if np.any(sums > 1 + SUM_TOLERANCE):
        row = int(np.argmax(sums))
        where = "" if array.ndim == 1 else f" (row {row})"
        raise ValueError(
            f"{name} must sum to at most 1{where}: entry k is the probability that the k-th child is the "
            f"accepted one, and siblings exclude each other; got sum {sums[row]:.9g}"
        )
    return matrix


def _node_acceptance(tree: Tree, matrix: np.ndarray, per_depth: bool) -> np.ndarray:
    """Acceptance of each node as a child of its parent (root 1); positions beyond the vector accept never."""
    if per_depth and tree.depth > matrix.shape[0]:
        raise ValueError(
            f"acc: the per-depth acceptance matrix has {matrix.shape[0]} rows (one per depth) but the tree "
            f"has depth {tree.depth}; give a row for every depth"
        )
    padded = np.concatenate([matrix, np.zeros((matrix.shape[0], 1))], axis=1)
    ranks = np.minimum(tree.ranks, matrix.shape[1] + 1) - 1  # rank beyond W -> the zero column
    rows = np.maximum(tree.depths - 1, 0) if per_depth else np.zeros(tree.size, dtype=np.int64)
    node_acc = padded[rows, ranks]
    node_acc[0] = 1.0
    return node_acc


def _node_scores(tree: Tree, acc) -> np.ndarray:
    """Sequoia's score f(v) = prod of acceptance along the root-to-v path (Def. 3.3), f(root) = 1."""
    matrix = as_acceptance(acc)
    node_acc = _node_acceptance(tree, matrix, per_depth=np.ndim(acc) == 2)
    scores = node_acc.copy()
    for level in tree._levels()[1:]:
        scores[level] *= scores[tree.parents[level]]
    return scores


def tree_expected_tokens(tree, acc) -> float:
    """Expected tokens per verification step of ``tree`` under positional acceptance, per depth or not.

    .. math:: F(T) = \\sum_{v \\in T} f(v), \\qquad
              f(v) = \\prod_{e \\in \\mathrm{Path}(v)} p_{\\mathrm{depth}(e),\\, \\mathrm{rank}(e)},

    with ``f(root) = 1`` for the bonus token: the expected accepted length plus one is the sum over nodes of
    the product, over the edges of the root-to-node path, of the probability that the child at that edge's
    depth and sibling rank is the accepted one (Chen et al., Sequoia, NeurIPS 2024, arXiv 2402.12374,
    Prop. 3.4; App. F.1.1 lets the acceptance vector depend on the depth, as DySpec's estimate of a node's
    value by its path probability does, Xiong et al. 2024, arXiv 2410.11744, Alg. 1). ``acc`` is a vector
    (``p_{d,k} = acc[k-1]`` at every depth, Sequoia's depth-independent model) or a per-depth table
    (``p_{d,k} = acc[d-1, k-1]``, one row per depth, at least ``tree.depth`` rows); a child beyond the row's
    length is never accepted. A table whose rows all equal a vector gives that vector's value bitwise.
    A chain of ``gamma`` tokens with ``acc = [alpha]`` gives Leviathan et al.'s
    ``(1 - alpha**(gamma + 1)) / (1 - alpha)``; with ``acc = [[alpha_1], ..., [alpha_gamma]]`` it gives
    ``1 + sum_t prod_{j <= t} alpha_j`` (:func:`theory.expected_tokens` with per-position rates).

    Raises ``ValueError`` naming ``acc`` for entries outside [0, 1], a row summing above 1 or a table with
    fewer rows than the tree's depth, and naming ``tree`` for a malformed parent array.
    """
    tree = as_tree(tree)
    return float(_node_scores(tree, acc).sum())


def tree_token_distribution(tree, acc) -> np.ndarray:
    """Law of the number ``K`` of tokens one verification of ``tree`` yields: entry ``k - 1`` is ``P(K = k)``.

    ``P(K >= j + 1)`` is the sum of the scores of the depth-``j`` nodes (the accepted path reaches depth
    ``j`` through exactly one of them), so ``P(K = k) = S_{k-1} - S_k`` for ``k = 1 .. depth + 1``; its mean
    is :func:`tree_expected_tokens`.
    """
    tree = as_tree(tree)
    reach = np.bincount(tree.depths, weights=_node_scores(tree, acc))
    # S_{k-1} >= S_k exactly (each depth-k score is a share of its parent's); clip the rounding residue
    return np.maximum(reach - np.append(reach[1:], 0.0), 0.0)


def simulate_tree_tokens(tree, acc, n_steps: int, rng: np.random.Generator) -> np.ndarray:
    """Monte Carlo tokens per step under positional acceptance (the oracle for :func:`tree_expected_tokens`).

    At the current node (starting at the root) the accepted child position is drawn with probabilities
    ``acc`` (or none with ``1 - sum(acc)``); the walk descends if the tree has that child and stops otherwise.
    A step yields the depth reached plus one (the bonus token). All steps advance together, one level at a
    time.
    """
    tree = as_tree(tree)
    matrix = as_acceptance(acc)
    per_depth = np.ndim(acc) == 2
    n_steps = as_count(n_steps, "n_steps")
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if per_depth and tree.depth > matrix.shape[0]:
        raise ValueError(f"tree has depth {tree.depth} but acc has only {matrix.shape[0]} rows")
    width = matrix.shape[1]
    # child_table[node, k] = index of the (k+1)-th child, or -1; column `width` stands for "no child".
    child_table = np.full((tree.size, width + 1), -1, dtype=np.int64)
    inside = (tree.ranks > 0) & (tree.ranks <= width)
    child_table[tree.parents[inside], tree.ranks[inside] - 1] = np.flatnonzero(inside)
    cumulative = np.cumsum(matrix, axis=1)
    node = np.zeros(n_steps, dtype=np.int64)
    alive = np.ones(n_steps, dtype=bool)
    for level in range(tree.depth):
        row = cumulative[level if per_depth else 0]
        position = np.searchsorted(row, rng.random(n_steps), side="right")  # == width when none accepted
        nxt = child_table[node, position]
        alive &= nxt >= 0
        node = np.where(alive, nxt, node)
    return tree.depths[node] + 1


# --------------------------------------------------------------------------------------------------------
# Optimal trees: Sequoia's dynamic programme
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeSolution:
    """A tree and its expected tokens per step; unpacks as ``tree, expected_tokens = ...``."""

    tree: Tree
    expected_tokens: float

    def __iter__(self):
        return iter((self.tree, self.expected_tokens))


class _SequoiaTable:
    """Sequoia's DP table: best value of a subtree with ``n`` nodes in each depth state.

    States: with a depth limit ``D``, state ``d`` (0..D) is a node that may still grow ``d`` levels below it;
    it sits at absolute depth ``D - d`` and its children use acceptance row ``D - d``. Without a limit (vector
    acceptance only) a single state stands for every node.
    """

    def __init__(self, matrix: np.ndarray, budget: int, depth_limit: int | None, width: int):
        if depth_limit is None:
            child_row = np.array([0])
            child_state = np.array([0])
        else:
            states = np.arange(depth_limit + 1)
            child_row = np.where(states > 0, depth_limit - states, -1)
            child_state = np.maximum(states - 1, 0)
        n_states = child_row.size
        has_children = child_row >= 0
        # rows[s, b-1] = acceptance of the b-th child of a node in state s (0 where it may have no children)
        # a vector (one row) serves every depth; a matrix has a row for each depth the limit allows
        row_index = np.clip(child_row, 0, matrix.shape[0] - 1)
        rows = np.where(has_children[:, None], matrix[row_index, :width], 0.0)

        value = np.full((budget + 1, n_states, width + 1), -np.inf)  # T[n, s, b]
        split = np.zeros((budget + 1, n_states, width + 1), dtype=np.int32)  # nodes before the last child
        best = np.full((budget + 1, n_states), -np.inf)  # Tmax[n, s]
        best_width = np.zeros((budget + 1, n_states), dtype=np.int32)
        # gain[m, s, b-1]: a size-m subtree as the b-th child of a state-s node; -inf where infeasible
        # (kept separate so that a zero acceptance never multiplies -inf into NaN).
        gain = np.full((budget + 1, n_states, width), -np.inf)

        def finish(n: int) -> None:
            best_width[n] = np.argmax(value[n], axis=1)
            best[n] = np.take_along_axis(value[n], best_width[n][:, None], axis=1)[:, 0]
            sub = best[n, child_state]
            feasible = has_children & np.isfinite(sub)
            gain[n] = np.where(feasible[:, None], rows * np.where(feasible, sub, 0.0)[:, None], -np.inf)

        value[1, :, 0] = 1.0
        finish(1)
        for n in range(2, budget + 1):
            # T[n, s, b] = max_y T[y, s, b-1] + P[row(s), b] * Tmax[n-y, child(s)], y < n (Sequoia Alg. 1/4);
            # the first maximum (smallest y) wins ties, as in the Sequoia repository's tree_search.py.
            candidates = value[1:n, :, :width] + gain[n - 1 : 0 : -1]
            first = np.argmax(candidates, axis=0)
            value[n, :, 1:] = np.take_along_axis(candidates, first[None], axis=0)[0]
            split[n, :, 1:] = first + 1
            finish(n)

        self.child_state = child_state
        self.value = value
        self.split = split
        self.best = best
        self.best_width = best_width

    def largest_feasible(self, budget: int, state: int) -> int:
        """Largest size <= budget that fits the width and depth limits (values grow with size until then)."""
        sizes = np.flatnonzero(np.isfinite(self.best[: budget + 1, state]))
        return int(sizes[-1])

    def tree(self, size: int, state: int) -> Tree:
        """Rebuild the optimal tree of ``size`` nodes in ``state``, breadth first (as Sequoia's growmaps)."""
        parents = [-1]
        queue = [(size, state)]
        head = 0
        while head < len(queue):
            n, s = queue[head]
            b = int(self.best_width[n, s])
            subtrees = []
            while b > 0:  # peel children from the last one backwards
                y = int(self.split[n, s, b])
                subtrees.append(n - y)
                n, b = y, b - 1
            for m in reversed(subtrees):
                parents.append(head)
                queue.append((m, int(self.child_state[s])))
            head += 1
        return Tree(parents)


def _depth_and_width(matrix, per_depth, budget, max_depth, max_width) -> tuple[int | None, int]:
    if max_depth is not None:
        max_depth = as_count(max_depth, "max_depth", minimum=0)
        if per_depth and max_depth > matrix.shape[0]:
            raise ValueError(
                f"max_depth={max_depth} exceeds the {matrix.shape[0]} rows of the acceptance matrix"
            )
    elif per_depth:
        max_depth = matrix.shape[0]
    width = matrix.shape[1] if max_width is None else min(as_count(max_width, "max_width"), matrix.shape[1])
    return max_depth, max(min(width, budget - 1), 1)


def _sequoia_table(
    acc, budget: int, max_depth, max_width, *, every_depth: bool = False
) -> tuple[_SequoiaTable, int | None]:
    """Run the programme; ``every_depth`` keeps the depth states even when the limit cannot bind."""
    matrix = as_acceptance(acc)
    per_depth = np.ndim(acc) == 2
    budget = as_count(budget, "budget")
    depth_limit, width = _depth_and_width(matrix, per_depth, budget, max_depth, max_width)
    if not (per_depth or every_depth) and depth_limit is not None and depth_limit >= budget - 1:
        depth_limit = None  # a tree of `budget` nodes cannot be deeper than budget - 1: no limit at all
    return _SequoiaTable(matrix, budget, depth_limit, width), depth_limit


def optimal_tree(
    acc, budget: int, *, max_depth: int | None = None, max_width: int | None = None
) -> TreeSolution:
    """The tree of at most ``budget`` nodes with the most expected tokens (Sequoia's dynamic programme).

    With ``T[n, b]`` the best value of an ``n``-node tree whose root has ``b`` children,

    .. math:: T[n, b] = \\max_{1 \\le y < n} T[y, b-1] + p_b \\max_{b'} T[n - y, b'], \\quad T[1, 0] = 1

    (Chen et al., Sequoia, NeurIPS 2024, arXiv 2402.12374, Alg. 1; Alg. 4 adds the depth index and a
    per-depth acceptance matrix). The programme is exact: it maximises :func:`tree_expected_tokens` over all
    trees with at most ``budget`` nodes, at most ``max_depth`` drafted levels and at most ``max_width``
    children per node. It runs in ``O(budget**2 * depth * width)`` time, vectorised over all but the size.

    Parameters
    ----------
    acc : array_like
        Acceptance vector ``(W,)`` (``acc[k-1]`` = probability that the ``k``-th child is accepted) or
        per-depth matrix ``(rows, W)``; a matrix limits the depth to ``rows``.
    budget : int
        Maximum number of nodes, root included (>= 1).
    max_depth, max_width : int, optional
        Limits on drafted levels and children per node (width is always at most ``W``).

    Returns
    -------
    TreeSolution
        The tree (exactly ``budget`` nodes unless the limits allow fewer) and its expected tokens. Ties are
        broken as in the Sequoia repository's ``tree_search.py``.
    """
    table, depth_limit = _sequoia_table(acc, budget, max_depth, max_width)
    state = 0 if depth_limit is None else depth_limit
    size = table.largest_feasible(int(budget), state)
    return TreeSolution(table.tree(size, state), float(table.best[size, state]))
