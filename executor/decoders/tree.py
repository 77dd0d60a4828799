"""Token-tree speculative decoding: a whole draft tree verified in one target pass.

The tree is scored with the tree attention mask (each node sees the committed prefix, its ancestors and
itself; RoPE position = committed length + depth; SpecInfer, Miao et al., ASPLOS 2024, arXiv 2305.09781;
Medusa, Cai et al., ICML 2024, arXiv 2401.10774), then verified from the root down:

* temperature > 0, lossless: at every node the children were drawn from the draft distribution ``q`` at that
  node with the verifier's draft law (without replacement for the default ``"rrs_wor"``, Jeon et al.,
  arXiv 2402.05109), and :func:`executor.verification.verify_multidraft` either accepts one child -- the walk
  descends into it -- or returns a token drawn from the residual, which ends the step. Reaching a leaf, the
  bonus token is drawn from the target at the leaf. Every emitted token then follows the target's law.
* temperature 0: the children are the draft's top tokens and the walk follows the child equal to the
  target's argmax (:func:`executor.verification.verify_tree_argmax`), so the output equals greedy decoding.

Tree shapes: a static :class:`theory.Tree` (or any parent array in topological order; the k-th child of a node
is its k-th draw), e.g. from :func:`theory.optimal_tree` (Sequoia, Chen et al., NeurIPS 2024,
arXiv 2402.12374); or a :class:`DynamicTree` grown level by level from the draft's probabilities
(EAGLE-2, Li et al., EMNLP 2024, arXiv 2406.16858; DySpec, Xiong et al., arXiv 2410.11744). The number of
children of a node is fixed from ``q`` before they are drawn, which keeps the dynamic tree lossless.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from executor.decoders.base import Decoder, DecodingState, DraftTree, Sampling, StepOutcome
from executor.sampling import count_above, largest_positive, sample_drafts_unchecked, top_tokens
from executor.verification import VERIFIER_DRAFT_LAW, verify_multidraft_unchecked, verify_tree_argmax
from theory.checks import as_choice, as_count

__all__ = ["DynamicTree", "TreeDecoder", "TREE_VERIFIERS", "check_parents", "default_tree"]

#: Verifiers a tree (or multi-draft) decoder can use at temperature > 0; temperature 0 always uses argmax.
TREE_VERIFIERS = tuple(name for name in VERIFIER_DRAFT_LAW if name != "argmax")


@dataclass(frozen=True)
class DynamicTree:
    """A tree grown per step from the draft distributions (best-first by estimated path probability).

    At each level, every frontier node ``v`` offers candidate children ranked ``j = 0, 1, ...`` with score
    :math:`s(v) \\cdot \\tilde q_v^{(j)}` (``s`` = product along the path, :math:`\\tilde q^{(j)}` = the
    ``j``-th largest draft probability; at temperature 0 the draft softmax at temperature 1); the
    ``branching`` best candidates over the level (fewer if the budget runs out) are drafted.

    Parameters
    ----------
    budget : int
        Largest tree size, root included (``>= 2``).
    max_depth : int
        Largest number of drafted levels.
    branching : int
        Largest number of children per node and of nodes per level.
    """

    budget: int
    max_depth: int
    branching: int

    def __post_init__(self) -> None:
        as_count(self.budget, "budget", minimum=2)
        as_count(self.max_depth, "max_depth")
        as_count(self.branching, "branching")


def check_parents(tree) -> list[int]:
    """A parent array in topological order from a :class:`theory.Tree` or a sequence, else ``ValueError``."""
    parents = getattr(tree, "parents", tree)
    try:
        parents = [int(parent) for parent in parents]
    except (TypeError, ValueError):
        raise ValueError(f"tree must be a theory.Tree or a parent array, got {tree!r}") from None
    if not parents or parents[0] != -1:
        raise ValueError("tree must have the root first: parents[0] == -1")
    for node, parent in enumerate(parents[1:], start=1):
        if not 0 <= parent < node:
            raise ValueError(f"tree parents[{node}] = {parent}: every node's parent must come before it")
    return parents


class TreeDecoder(Decoder):
    """Draft a token tree, verify it in one target pass, commit the accepted path.

    Parameters
    ----------
    target : executor.model.Transformer
    drafter : executor.drafters.Drafter
    tree : theory.Tree, sequence of int, or DynamicTree
        The static shape (parent array, root first, topological order) or a dynamic growth rule.
    verifier : str
        Multi-draft verifier used at every node at temperature > 0 (one of :data:`TREE_VERIFIERS`; default
        ``"rrs_wor"``, children without replacement). Where ``q`` has fewer tokens than the node has children,
        only as many children are drawn as the draft law allows.
    sampling, log_distributions
        See :class:`executor.decoders.base.Decoder`.
    """

    name = "tree"

    def __init__(
        self,
        target,
        drafter,
        *,
        tree: Sequence[int] | DynamicTree,
        verifier: str = "rrs_wor",
        sampling: Sampling | None = None,
        log_distributions: str = "none",
    ) -> None:
        super().__init__(target, drafter, sampling=sampling, log_distributions=log_distributions)
        self.verifier = as_choice(verifier, "verifier", TREE_VERIFIERS)
        if isinstance(tree, DynamicTree):
            self.shape = tree
            self._static_children = None
        else:
            parents = check_parents(tree)
            self.shape = parents
            self._static_children = [[] for _ in parents]
            for node, parent in enumerate(parents[1:], start=1):
                self._static_children[parent].append(node)
            if verifier == "spechub" and any(len(c) not in (0, 2) for c in self._static_children):
                raise ValueError(
                    "verifier 'spechub' needs exactly 2 children at every expanded node of the tree"
                )
        self._node_verifier: dict[int, str] = {}

    @property
    def max_tree_size(self) -> int:
        return self.shape.budget if isinstance(self.shape, DynamicTree) else len(self.shape)

    def settings(self) -> dict:
        shape = self.shape.__dict__ if isinstance(self.shape, DynamicTree) else {"parents": self.shape}
        return {**super().settings(), "verifier": self.verifier, "tree": shape}

    # Drafting -------------------------------------------------------------------------------------------

    def _support(self, logits: torch.Tensor, q: torch.Tensor) -> int:
        """Tokens the law can draw: finite logits (greedy; probs() has rejected NaN and +inf) or q > 0."""
        return count_above(logits, -math.inf) if self.sampling.greedy else count_above(q, 0.0)

    def _draw_children(self, tree: DraftTree, node: int, logits: torch.Tensor, count: int, generator) -> None:
        """Draw ``count`` children of ``node`` (fewer if the law cannot) and attach them."""
        q = self.sampling.probs(logits)
        draft = VERIFIER_DRAFT_LAW[self.verifier]
        count = count if draft == "iid" and not self.sampling.greedy else min(count, self._support(logits, q))
        verifier = self.verifier
        if verifier == "spechub" and count != 2:
            # One token in q: a single draft, plain speculative sampling.
            verifier, draft, count = "rrs_wor", "wor", min(count, 1)
        if self.sampling.greedy:
            tokens = top_tokens(logits, count)
        else:
            tokens = sample_drafts_unchecked(q, count, draft, generator)
        tree.draft_probs[node] = q
        self._node_verifier[node] = verifier
        for token in tokens.tolist():
            tree.add_child(node, token)

    def draft(self, state: DecodingState, generator: torch.Generator) -> DraftTree:
        tree = DraftTree(state.tokens[-1])
        self._node_verifier = {}
        if isinstance(self.shape, DynamicTree):
            self._draft_dynamic(state, tree, generator)
        else:
            self._draft_static(state, tree, generator)
        return tree

    def _draft_static(self, state: DecodingState, tree: DraftTree, generator) -> None:
        draft_node = {0: 0}  # static node -> draft node (children the law cannot draw are dropped)
        frontier = [0]
        while frontier:
            expanding = [s for s in frontier if self._static_children[s] and s in draft_node]
            if not expanding:
                return
            logits = self.drafter.draft_logits(state, tree, [draft_node[s] for s in expanding])
            if logits is None:
                return
            frontier = []
            for static, row in zip(expanding, logits, strict=True):
                node = draft_node[static]
                static_children = self._static_children[static]
                self._draw_children(tree, node, row, len(static_children), generator)
                for static_child, child in zip(static_children, tree.children[node], strict=False):
                    draft_node[static_child] = child
                    frontier.append(static_child)

    def _draft_dynamic(self, state: DecodingState, tree: DraftTree, generator) -> None:
        shape = self.shape
        scores = {0: 1.0}
        frontier = [0]
        for _ in range(shape.max_depth):
            room = shape.budget - len(tree)
            if room <= 0 or not frontier:
                return
            logits = self.drafter.draft_logits(state, tree, frontier)
            if logits is None:
                return
            # Candidate (score, node, rank) for the rank-th child of each frontier node.
            ranked = {}
            candidates = []
            for node, row in zip(frontier, logits, strict=True):
                weights = row.softmax(-1) if self.sampling.greedy else self.sampling.probs(row)
                values = largest_positive(weights, shape.branching)
                ranked[node] = values
                candidates += [(scores[node] * value, node, rank) for rank, value in enumerate(values)]
            candidates.sort(key=lambda c: -c[0])
            counts = dict.fromkeys(frontier, 0)
            for _, node, _ in candidates[: min(shape.branching, room)]:
                counts[node] += 1
            frontier = []
            for node, row in zip(list(counts), logits, strict=True):
                if counts[node]:
                    self._draw_children(tree, node, row, counts[node], generator)
                    for rank, child in enumerate(tree.children[node]):
                        scores[child] = scores[node] * ranked[node][rank]
                        frontier.append(child)

    # Verification ---------------------------------------------------------------------------------------

    def verify(self, tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator) -> StepOutcome:
        if self.sampling.greedy:
            path, token = verify_tree_argmax(target_probs, tree.parents, torch.tensor(tree.tokens))
            return StepOutcome([0, *path.tolist()], int(token))
        node, path = 0, [0]
        while tree.children[node]:
            children = tree.children[node]
            drafts = torch.tensor([tree.tokens[c] for c in children], device=target_probs.device)
            index, token = verify_multidraft_unchecked(
                self._node_verifier[node], target_probs[node], tree.draft_probs[node], drafts, generator
            )
            if int(index) < 0:
                return StepOutcome(path, int(token))
            node = children[int(index)]
            path.append(node)
        return StepOutcome(path, self.sampling.draw(target_probs[node], generator))


def default_tree(drafter, gamma: int, width: int):
    """The tree a tree decoder drafts when none is named: Falcon's pass-by-pass tree for a Falcon drafter
    (:func:`executor.decoders.falcon_tree`, ``ceil(gamma / 2)`` passes of ``width``), else a DySpec/EAGLE-2
    dynamic tree of ``gamma * width + 1`` nodes, ``gamma`` levels and ``width`` children per node."""
    from executor.decoders.falcon_tree import falcon_tree

    gamma, width = as_count(gamma, "gamma"), as_count(width, "width")
    if getattr(drafter, "kind", None) == "falcon":
        return falcon_tree(passes=(gamma + 1) // 2, width=width)
    return DynamicTree(budget=gamma * width + 1, max_depth=gamma, branching=width)
