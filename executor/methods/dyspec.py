"""DySpec's dynamic token tree against Sequoia's static optimal tree of the same node budget.

**DySpec** (Xiong et al., arXiv 2410.11744, Alg. 1): the tree of at most ``budget`` nodes is grown greedily
from a heap of *sampling sites*, keyed by the estimated probability that the site is reached: the first-child
site of node ``u`` has key :math:`v(u) = \\prod_{a \\in \\mathrm{path}(u)} q(a)` (the node's path
probability, the draft's probabilities standing for acceptance), the ``k``-th sibling site
:math:`v(u)\\,(1 - \\sum_{j<k} q_j)` (all earlier siblings rejected); popping a site adds its sample, with
value :math:`v(u)\\,q_k`. (The appendix's optimality theorem is stated for node weights; Alg. 1, which
:func:`theory.dynamic_tree` implements, orders by the site keys, and so does this decoder.) The executor's
:class:`executor.decoders.DynamicTree` is *not* this rule: it keeps the ``branching`` best candidates of each
*level* (EAGLE-2's per-level beam), so a deep likely chain and a wide shallow fan are traded differently.
:class:`DySpecDecoder` implements the paper's global rule with one draft call per level (its Alg. 2 with the
threshold that reproduces Alg. 1): all sampling sites of every expanded node are candidates, keyed as above
with the ranked draft probabilities :math:`\\tilde q^{(j)}`; after each level the ``budget - 1`` best known
candidates are the tentative tree; a node is expanded only if its value (its first-child key) beats the
weakest tentative candidate (otherwise none of its descendants can enter: keys only shrink along paths). The
final tree is the ``budget - 1`` best candidates, exactly Alg. 1's tree (tested against
:func:`theory.dynamic_tree`).

At temperature 0 the children are the draft's top tokens and the walk follows the target's argmax. At
temperature > 0 the children of a node are drawn without replacement (``rrs_wor``) and a node keeps its first
``k`` draws, ``k`` decided from ranked values that never depend on the identity of the draws it drops, which
keeps the walk lossless (tested against the exact law).

**Sequoia** (Chen et al., NeurIPS 2024, arXiv 2402.12374): :func:`theory.optimal_tree` returns the tree
maximising :math:`F(T) = \\sum_v \\prod_{e \\in \\mathrm{path}(v)} p_{\\mathrm{depth}(e), \\mathrm{rank}(e)}`
for the budget, from the positional acceptance ``p`` measured on calibration prompts. The paper measures one
vector with a one-level tree of ``W`` children (the repository's ``test_accept``) and uses it at every depth;
here the measurement is extended down the tree (:func:`calibration_tree`: ``W`` children at every node of the
first-child chain, ``max_depth`` levels) and :func:`~executor.methods.calibration.depth_acceptance` estimates
one row per depth from its step logs, since a drafter's acceptance falls with depth (Sequoia App. F.1.1 plans
with such a per-depth matrix). The same table predicts both methods' tokens per step
(:func:`theory.greedy_tree` for DySpec's rule) and plans Sequoia's tree.
"""

from __future__ import annotations

import numpy as np
import torch

from executor.decoders import DraftTree, TreeDecoder
from executor.decoders.base import DecodingState
from executor.methods._common import MethodDrafter, check_exit_layer, checkpoint_cards, default_exit_layer
from executor.methods.base import Method, Prediction
from executor.methods.calibration import DepthAcceptance, depth_acceptance
from executor.sampling import largest_positive
from theory.checks import as_count

__all__ = ["DySpec", "DySpecDecoder", "Sequoia", "calibration_tree", "tree_acceptance"]


class DySpecDecoder(TreeDecoder):
    """Tree decoder whose tree is grown by DySpec's global greedy rule under a node budget.

    Parameters
    ----------
    target, drafter
        As for :class:`executor.decoders.TreeDecoder`; the drafter must keep no per-node state between
        ``draft_logits`` and ``commit`` (the early-exit drafter), since the final tree is renumbered.
    budget : int
        Largest tree size, root included (``>= 2``).
    max_depth : int
        Largest number of drafted levels (draft calls per step).
    max_width : int
        Largest number of children per node.
    """

    name = "dyspec"

    def __init__(self, target, drafter, *, budget: int, max_depth: int, max_width: int = 8, **kwargs):
        self.budget = as_count(budget, "budget", minimum=2)
        self.max_depth = as_count(max_depth, "max_depth")
        self.max_width = as_count(max_width, "max_width")
        super().__init__(target, drafter, tree=[-1] + [0] * (self.budget - 1), **kwargs)
        self.draft_calls = 0

    @property
    def max_tree_size(self) -> int:
        # Cache slots while drafting: each level may draw up to budget - 1 tentative nodes before the final
        # selection drops some; the verified tree itself has at most ``budget`` nodes.
        return 1 + (self.budget - 1) * self.max_depth

    def settings(self) -> dict:
        return {**super().settings(), "budget": self.budget, "max_depth": self.max_depth}

    def _ranked(self, row: torch.Tensor) -> list[float]:
        weights = row.softmax(-1) if self.sampling.greedy else self.sampling.probs(row)
        return largest_positive(weights, self.max_width)

    def draft(self, state: DecodingState, generator: torch.Generator) -> DraftTree:
        work = DraftTree(state.tokens[-1])
        self._node_verifier = {}
        value = {0: 1.0}
        candidates: list[tuple[float, int, int, int]] = []  # (value, order, node, rank)
        order = 0
        room = self.budget - 1
        frontier = [0]
        for _ in range(self.max_depth):
            if not frontier:
                break
            logits = self.drafter.draft_logits(state, work, frontier)
            if logits is None:
                break
            self.draft_calls += 1
            ranked = {}
            for node, row in zip(frontier, logits, strict=True):
                ranked[node] = self._ranked(row)
                reached = 1.0  # probability that the rank-th sampling site of node is reached
                for rank, q in enumerate(ranked[node]):
                    candidates.append((value[node] * reached, order, node, rank))
                    reached -= q
                    order += 1
            candidates.sort(key=lambda c: (-c[0], c[1]))
            chosen = candidates[:room]
            counts = dict.fromkeys(frontier, 0)
            for _, _, node, _ in chosen:
                if node in counts:
                    counts[node] += 1
            weakest = chosen[-1][0] if len(chosen) == room else 0.0
            next_frontier = []
            for node, row in zip(frontier, logits, strict=True):
                if not counts[node]:
                    continue
                self._draw_children(work, node, row, counts[node], generator)
                for rank, child in enumerate(work.children[node]):
                    value[child] = value[node] * ranked[node][rank]
                    if value[child] > weakest:
                        next_frontier.append(child)
            frontier = next_frontier
        return self._final_tree(work, candidates[:room])

    def _final_tree(self, work: DraftTree, chosen) -> DraftTree:
        """Keep the chosen candidates (each a drawn child ``rank`` of ``node``), renumbered breadth first."""
        keep = {0}
        for _, _, node, rank in chosen:
            if rank < len(work.children[node]):
                keep.add(work.children[node][rank])
        tree = DraftTree(work.tokens[0])
        verifiers = {}
        new_id = {0: 0}
        queue = [0]
        while queue:
            old = queue.pop(0)
            kids = [c for c in work.children[old] if c in keep and work.parents[c] == old]
            # Children are kept as a prefix of the draws (ranked values decrease with the rank).
            kids = work.children[old][: len(kids)]
            if kids:
                tree.draft_probs[new_id[old]] = work.draft_probs[old]
                verifiers[new_id[old]] = self._node_verifier[old]
            for child in kids:
                new_id[child] = tree.add_child(new_id[old], work.tokens[child])
                queue.append(child)
        self._node_verifier = verifiers
        return tree


def calibration_tree(max_depth: int, width: int) -> list[int]:
    """Parent array of the calibration tree: ``width`` children at the root and at every first child down to
    ``max_depth`` levels (``1 + max_depth * width`` nodes, one draft pass per level). Every depth ``d`` then
    tries every rank ``k <= width`` below an accepted parent: Sequoia's one-level ``test_accept`` tree
    repeated along the first-child chain."""
    max_depth = as_count(max_depth, "max_depth")
    width = as_count(width, "width")
    parents, chain = [-1], 0
    for _ in range(max_depth):
        first = len(parents)
        parents += [chain] * width
        chain = first
    return parents


def tree_acceptance(
    target, drafter_factory, width: int, max_depth: int, temperature: float, prompts, max_new_tokens: int
) -> DepthAcceptance:
    """Positional acceptance per depth, measured: decode ``prompts`` with :func:`calibration_tree` (children
    drawn without replacement, or the draft's top tokens at temperature 0) and estimate ``p[d, k]`` from the
    step logs with :func:`~executor.methods.calibration.depth_acceptance`."""
    from executor.decoders import Sampling

    steps = []
    for index, prompt in enumerate(prompts):
        decoder = TreeDecoder(
            target,
            drafter_factory(),
            tree=calibration_tree(max_depth, width),
            verifier="rrs_wor",
            sampling=Sampling(temperature=temperature),
        )
        generator = torch.Generator().manual_seed(2000 + index)
        steps += decoder.generate(prompt, max_new_tokens, generator=generator).steps
    return depth_acceptance(steps, max_depth, width)


_TREE_ACCEPTANCE: dict = {}


class _TreeMethod(Method):
    """``drafter``: a spec as on the command line (``"feature"``, ``"early-exit:K"``, ...) or a factory
    ``() -> Drafter``; by default the trained feature head when one is cached for the target (the papers
    draft with a small trained model), else the early exit at ``exit_layer``."""

    def __init__(
        self,
        target,
        tokenizer=None,
        *,
        exit_layer: int | None = None,
        budget: int = 8,
        max_depth: int = 4,
        width: int = 4,
        drafter=None,
    ) -> None:
        super().__init__(target, tokenizer)
        self.exit_layer = check_exit_layer(
            target, default_exit_layer(target) if exit_layer is None else exit_layer
        )
        self.budget = as_count(budget, "budget", minimum=2)
        self.max_depth = as_count(max_depth, "max_depth")
        self.width = as_count(width, "width")
        self.make_drafter = MethodDrafter(target, drafter, self.exit_layer)
        self.acceptance: DepthAcceptance | None = None

    @property
    def drafter_name(self) -> str | None:
        return self.make_drafter.name

    def options(self) -> dict:
        return {
            "drafter": self.drafter_name or "custom",
            "exit_layer": self.exit_layer,
            "budget": self.budget,
            "max_depth": self.max_depth,
        }

    def drafter_cards(self) -> list[dict]:
        return checkpoint_cards(self.make_drafter())

    def measure(self, prompts, temperature, max_new_tokens) -> DepthAcceptance:
        """The positional acceptance per depth on ``prompts`` (:func:`tree_acceptance`, ``max_depth`` rows
        of ``width`` ranks), kept in ``self.acceptance``; for a named drafter it is memoised, so ``dyspec`` and
        ``sequoia`` (and ``staged``, on its early exit) calibrate once per drafter, prompt set and
        temperature."""
        from executor.methods.calibration import model_key

        key = (
            model_key(self.target),
            self.drafter_name,
            self.exit_layer,
            self.width,
            self.max_depth,
            float(temperature),
            tuple(tuple(p) for p in prompts),
            max_new_tokens,
        )
        named = self.drafter_name is not None
        if named and key in _TREE_ACCEPTANCE:
            self.acceptance = _TREE_ACCEPTANCE[key]
            return self.acceptance
        self.acceptance = tree_acceptance(
            self.target, self.make_drafter, self.width, self.max_depth, temperature, prompts, max_new_tokens
        )
        if named:
            _TREE_ACCEPTANCE[key] = self.acceptance
        return self.acceptance


class DySpec(_TreeMethod):
    """DySpec's greedy dynamic tree (see :mod:`executor.methods.dyspec`)."""

    name = "dyspec"
    paper = "DySpec, Xiong et al., arXiv 2410.11744"

    def build(self, temperature: float = 0.0):
        return DySpecDecoder(
            self.target,
            self.make_drafter(),
            budget=self.budget,
            max_depth=self.max_depth,
            max_width=self.width,
            sampling=self.sampling(temperature),
        )

    def predict(self, calibration_prompts, temperature, max_new_tokens):
        import theory

        acceptance = self.measure(calibration_prompts, temperature, max_new_tokens)
        solution = theory.greedy_tree(acceptance.table, self.budget, max_depth=self.max_depth)
        return Prediction(
            solution.expected_tokens,
            {**acceptance.details(), "model": "greedy_tree(per-depth acc)", "depth_aware": True},
        )

    def extra(self, decoder) -> dict:
        return {"draft_calls": decoder.draft_calls}


class Sequoia(_TreeMethod):
    """Sequoia's static optimal tree for the measured acceptance vector and the same budget."""

    name = "sequoia"
    paper = "Sequoia, Chen et al., NeurIPS 2024, arXiv 2402.12374"

    def __init__(self, target, tokenizer=None, **options) -> None:
        super().__init__(target, tokenizer, **options)
        self.tree = None

    def plan(self):
        """Sequoia's optimal tree for the measured per-depth acceptance (before any measurement: a prior
        vector, 0.6 for the first child and 0.1 for the others, at every depth)."""
        import theory

        if self.acceptance is not None:
            acc = self.acceptance.table
        else:
            acc = np.array([0.6] + [0.1] * (self.width - 1))
        self.tree = theory.optimal_tree(acc, self.budget, max_depth=self.max_depth)
        return self.tree

    def build(self, temperature: float = 0.0):
        if self.tree is None:
            self.plan()
        return TreeDecoder(
            self.target, self.make_drafter(), tree=self.tree.tree, sampling=self.sampling(temperature)
        )

    def predict(self, calibration_prompts, temperature, max_new_tokens):
        acceptance = self.measure(calibration_prompts, temperature, max_new_tokens)
        solution = self.plan()
        return Prediction(
            solution.expected_tokens,
            {
                **acceptance.details(),
                "tree": list(solution.tree.parents),
                "model": "optimal_tree(per-depth acc)",
                "depth_aware": True,
            },
        )
