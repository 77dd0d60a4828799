"""Falcon's semi-autoregressive feature head: two draft tokens per forward pass.

Falcon (Gao, Xie, Xiang & Ji, "Falcon: Faster and Parallel Inference of Large Language Models through Enhanced
Semi-Autoregressive Drafting and Custom-Designed Decoding Tree", AAAI 2025, arXiv 2412.12639) keeps EAGLE's
feature-level head (:mod:`executor.drafters.feature`: entries :math:`e_s = (h_{s-1}, x_s)` -> projection -> one
llama layer -> the target's frozen LM head) and makes it draft :math:`k = 2` tokens per pass:

* the output at entry :math:`e_s` predicts the feature :math:`h_{s+1}`, i.e. the token :math:`x_{s+2}`, *two*
  positions ahead (:math:`q = \\mathrm{softmax}(E'\\,\\mathrm{norm}(g_s))`);
* entries come in blocks of two, and the attention mask is relaxed inside a block (:func:`block_mask`): the
  first entry of a block also sees the second. The block :math:`(e_{s}, e_{s+1})` thus predicts
  :math:`x_{s+2}` (from the first entry, which knows :math:`x_{s+1}`: EAGLE's one-step task) and
  :math:`x_{s+3}` (from the second: the semi-autoregressive step that does not know :math:`x_{s+2}`).

Drafting. The first pass of a step feeds the committed entries, the last two (:math:`e_{L-1}, e_L`) forming the
block; it gives the draft distribution of the root's children (depth 1) and the one shared by every depth-1
node's children (depth 2). Each later pass runs, for every node ``v`` at an even depth ``2j`` with parent ``u``,
the block :math:`(\\hat g(\\mathrm{parent}(u)), x_u), (\\hat g(u), x_v)` -- the head's own features from the
previous pass and the drafted tokens -- and gives depths ``2j + 1`` (children of ``v``) and ``2j + 2`` (shared by
all of ``v``'s children). So a tree of depth ``D`` costs ``ceil(D / 2)`` head passes (Falcon's custom tree:
several tokens per pass, several passes; :func:`executor.decoders.falcon_tree`). The decoder draws children
from the distributions as from any drafter, so verification -- and losslessness -- is untouched.

KV cache of the head: with one layer, an entry's K/V depend on the entry alone (not on the mask), so the
committed entries live in slots ``s - 1`` as in :class:`FeatureDrafter` and always equal a fresh prefill of the
committed text; each drafted block takes two slots past the committed ones, and a step's blocks are dropped at
commit (the length pointer rolls back; the accepted tokens are fed again from the target's exact features).

Training: :mod:`executor.training.falcon` (Coupled Sequential Glancing Distillation).
"""

from __future__ import annotations

import torch

from executor.drafters.feature import FeatureDrafter, FeatureHead

__all__ = ["BLOCK", "FalconDrafter", "FalconHead", "block_mask"]

KIND = "falcon"
#: Tokens drafted per forward pass (Falcon's k; the paper's best value, k = 2).
BLOCK = 2


def block_mask(length: int, offset: int = 0) -> torch.Tensor:
    """``(length, length)`` bool mask: entry ``i`` sees every entry up to the end of its block.

    Blocks are ``[offset + 2m, offset + 2m + 1]`` (entries before ``offset`` form a block of their own), i.e.
    the causal mask relaxed inside each :data:`BLOCK`-entry block (Falcon's k x k blocks).
    """
    index = torch.arange(length)
    end = torch.div(index - offset, BLOCK, rounding_mode="floor") * BLOCK + offset + BLOCK - 1
    end = torch.where(index < offset, torch.full_like(index, offset - 1), end)
    return index[None, :] <= end[:, None]


class FalconHead(FeatureHead):
    """Same parameters as :class:`FeatureHead`; read with :func:`block_mask` and two positions ahead."""


class FalconDrafter(FeatureDrafter):
    """Drafts two tree levels per pass with a trained :class:`FalconHead` (see the module docstring)."""

    kind = KIND
    head_class = FalconHead

    def start(self, prompt: list[int], cache_slots: int) -> None:
        # Committed entries plus two slots per drafted block (at most one block per tree node).
        self.head.setup_cache(2 * cache_slots + BLOCK)
        self.length = 0
        self._reset_step(0)

    def _reset_step(self, committed: int) -> None:
        self._features: dict[int, torch.Tensor] = {}  # g(v): the feature after node v (its children's q)
        self._second: dict[int, torch.Tensor] = {}  # g shared by every child of v (v at an even depth)
        self._second_logits: dict[int, torch.Tensor] = {}
        self._visible: dict[int, list[int]] = {0: []}  # drafted slots the blocks under v attend to
        self._next_slot = committed

    def _committed_pass(self, state) -> torch.Tensor:
        committed = state.committed
        start = min(self.length, committed - BLOCK)  # the last block's outputs are always recomputed
        slots = torch.arange(start, committed)
        ends = torch.where(slots >= committed - BLOCK, torch.full_like(slots, committed - 1), slots)
        mask = torch.arange(committed) <= ends[:, None]
        features = self._run(
            state.hidden[start:committed], state.tokens[start + 1 : committed + 1], slots, slots + 1, mask
        )
        self.length = committed
        self._reset_step(committed)
        self._features[0], self._second[0] = features[-2], features[-1]
        return self.head.logits(self.target, features[-2:-1])

    def _block_pass(self, state, tree, nodes: list[int]) -> torch.Tensor:
        committed = state.committed
        inputs, tokens, slots, positions, rows = [], [], [], [], []
        for v in nodes:
            u = tree.parents[v]
            grand = tree.parents[u]
            a, b = self._next_slot, self._next_slot + 1
            self._next_slot += BLOCK
            inputs += [self._features[grand], self._features[u]]
            tokens += [tree.tokens[u], tree.tokens[v]]
            slots += [a, b]
            positions += [committed + tree.depths[u], committed + tree.depths[v]]
            self._visible[v] = self._visible[grand] + [a, b]
            rows += [self._visible[v]] * BLOCK
        mask = torch.zeros(len(rows), self._next_slot, dtype=torch.bool)
        mask[:, :committed] = True
        for row, visible in enumerate(rows):
            mask[row, visible] = True
        features = self._run(torch.stack(inputs), tokens, torch.tensor(slots), torch.tensor(positions), mask)
        for i, v in enumerate(nodes):
            self._features[v], self._second[v] = features[BLOCK * i], features[BLOCK * i + 1]
        return self.head.logits(self.target, features[0::BLOCK])

    def _shared_logits(self, tree, v: int) -> torch.Tensor:
        """The second output of ``v``'s parent's block: ``q`` for ``v``'s children (``v`` at an odd depth)."""
        parent = tree.parents[v]
        self._features[v] = self._second[parent]
        if parent not in self._second_logits:
            self._second_logits[parent] = self.head.logits(self.target, self._second[parent][None])[0]
        return self._second_logits[parent]

    def draft_logits(self, state, tree, nodes):
        if state.committed < BLOCK or state.hidden is None:
            return None  # the first block needs two committed entries
        if nodes == [0]:
            return self._committed_pass(state)
        even = [v for v in nodes if tree.depths[v] % BLOCK == 0]
        rows = dict(zip(even, self._block_pass(state, tree, even), strict=True)) if even else {}
        return torch.stack([rows[v] if v in rows else self._shared_logits(tree, v) for v in nodes])

    def commit(self, state, tree, accepted_path) -> None:
        # Keep only entries built from the target's exact features; the accepted tokens are fed next step.
        self.length = min(self.length, state.committed)
        self._reset_step(state.committed)
