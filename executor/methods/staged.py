"""Staged speculative decoding (Spector & Ré, ES-FoMo @ ICML 2023, arXiv 2308.04623).

Two ideas: (a) the draft proposes a *tree* of continuations verified by the target in one pass (here the same
static tree as Sequoia's optimal tree for the measured per-depth acceptance; the single-stage comparison is
``staged-single``, the same drafter and tree without the second stage); (b) the draft itself is sped up by a
second speculative stage: a much cheaper *draft²* (the paper: a Katz-backoff trigram model fit on the draft's
outputs) proposes the draft's own tokens and the draft verifies them in one pass.

:class:`StagedDrafter` wraps a drafter on the target's first ``K`` layers: the trained ``exit:K`` head
(:class:`executor.drafters.exit_head.ExitDrafter`, the deepest one cached for the target by default) or the
untrained early exit. The EAGLE-style feature head does not fit: its input at each position is its own output
feature at the previous one, so it cannot score a proposed chain in one pass. At the root of each step draft²
proposes a chain ``g_1..g_k`` (prompt lookup in the context first, then a trigram/bigram table fit on
calibration text); the drafter scores ``[root, g_1..g_k]`` in one pass (cache slots past the outer tree, RoPE
positions by depth). Its logits after ``g_1..g_d`` are the drafter's exact distribution for *any* outer node
whose path is ``g_1..g_d``, so when the outer tree reaches such a node its draft pass is skipped (its K/V is
copied from the scratch slot into the node's slot, where descendants expect it). Every draft distribution is
the drafter's exact one, so the outer verification is unchanged and the method is lossless; what changes is
the number of sequential draft passes (reported as ``draft_passes`` against ``draft_levels``).
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import torch

from executor.decoders import TreeDecoder
from executor.drafters import PromptLookupDrafter
from executor.drafters.exit_head import ExitDrafter, shallow_forward
from executor.methods._common import deepest_exit_head
from executor.methods.dyspec import Sequoia
from theory.checks import as_count

__all__ = ["Draft2", "Staged", "StagedDrafter", "StagedSingleStage", "StagedTreeDecoder"]


class Draft2:
    """The second-stage draft: prompt lookup, then a most-frequent-continuation trigram/bigram table."""

    def __init__(self, max_ngram: int = 3) -> None:
        self.lookup = PromptLookupDrafter(max_ngram=max_ngram)
        self.trigram: dict = {}
        self.bigram: dict = {}

    def fit(self, sequences) -> Draft2:
        tri, bi = defaultdict(Counter), defaultdict(Counter)
        for seq in sequences:
            for a, b, c in zip(seq, seq[1:], seq[2:], strict=False):
                tri[(a, b)][c] += 1
            for a, b in zip(seq, seq[1:], strict=False):
                bi[a][b] += 1
        self.trigram = {k: v.most_common(1)[0][0] for k, v in tri.items()}
        self.bigram = {k: v.most_common(1)[0][0] for k, v in bi.items()}
        return self

    def propose(self, context: list[int], length: int) -> list[int]:
        proposal = self.lookup.propose(context)[:length]
        if proposal:
            return proposal
        tokens = list(context)
        while len(proposal) < length:
            nxt = self.trigram.get(tuple(tokens[-2:])) if len(tokens) >= 2 else None
            if nxt is None:
                nxt = self.bigram.get(tokens[-1])
            if nxt is None:
                break
            proposal.append(nxt)
            tokens.append(nxt)
        return proposal


class StagedDrafter:
    """A layer-``K`` drafter (``inner``: early exit or trained exit head) accelerated by draft² (see the
    module docstring)."""

    deterministic = False

    def __init__(self, target, inner, draft2: Draft2, *, scratch_offset: int, inner_length: int = 4):
        self.model = target
        self.inner = inner
        self.exit_layer = inner.exit_layer
        self.draft2 = draft2
        self.scratch_offset = scratch_offset
        self.inner_length = inner_length
        self.name = f"staged:{inner.name}"
        self._cache: dict[tuple, int] = {}
        self._logits: torch.Tensor | None = None
        self.draft_passes = 0
        self.draft_levels = 0
        self.inner_accepted: list[int] = []

    def check_target(self, target) -> None:
        if target is not self.model:
            raise ValueError("a StagedDrafter must be built on the target it drafts for")

    def start(self, prompt, cache_slots) -> None:
        self.inner.start(prompt, cache_slots)

    def _score_chain(self, tokens, slots, positions, mask) -> torch.Tensor:
        """The drafter's logits on a chain written at scratch ``slots``, in one pass."""
        if isinstance(self.inner, ExitDrafter):
            hidden = shallow_forward(self.model, tokens, slots, positions, mask, self.exit_layer)
            return self.inner.head_logits(hidden)
        device = self.model.tok_embeddings.weight.device
        return self.model(
            torch.tensor([tokens], device=device),
            slots,
            positions=positions,
            attention_mask=mask,
            exit_layer=self.exit_layer,
        )[0]

    def _inner(self, state) -> torch.Tensor:
        committed = state.committed
        device = self.model.tok_embeddings.weight.device
        proposal = self.draft2.propose(state.tokens, self.inner_length)
        k = len(proposal)
        scratch = committed + self.scratch_offset
        slots = torch.tensor([committed] + [scratch + i for i in range(1, k + 1)], device=device)
        positions = torch.arange(committed, committed + k + 1, device=device)
        mask = torch.zeros(k + 1, scratch + k + 1, dtype=torch.bool, device=device)
        mask[:, : committed + 1] = True
        for i in range(1, k + 1):
            mask[i:, scratch + i] = True
        logits = self._score_chain([state.tokens[-1], *proposal], slots, positions, mask)
        self._logits = logits
        self._cache = {tuple(proposal[:d]): d for d in range(k + 1)}
        greedy = logits.argmax(-1).tolist()
        accepted = 0
        while accepted < k and greedy[accepted] == proposal[accepted]:
            accepted += 1
        self.inner_accepted.append(accepted)
        return logits[:1]

    def draft_logits(self, state, tree, nodes):
        self.draft_levels += 1
        if nodes == [0]:
            self.draft_passes += 1
            return self._inner(state)
        committed = state.committed
        rows: dict[int, torch.Tensor] = {}
        missing = []
        sources, destinations = [], []
        for node in nodes:
            path = tuple(tree.tokens[v] for v in tree.path(node)[1:])
            depth = self._cache.get(path)
            if depth is None:
                missing.append(node)
                continue
            rows[node] = self._logits[depth]
            sources.append(committed + self.scratch_offset + depth)
            destinations.append(committed + node)
        if sources:
            device = self.model.tok_embeddings.weight.device
            self.model.copy_cache_slots(
                torch.tensor(sources, device=device), torch.tensor(destinations, device=device)
            )
        if missing:
            self.draft_passes += 1
            computed = self.inner.draft_logits(state, tree, missing)
            rows.update(zip(missing, computed, strict=True))
        return torch.stack([rows[node] for node in nodes])

    def commit(self, state, tree, accepted_path) -> None:
        self.inner.commit(state, tree, accepted_path)


class StagedTreeDecoder(TreeDecoder):
    """A static-tree decoder whose cache also holds draft²'s scratch chain past the tree."""

    name = "staged"

    def __init__(self, target, drafter: StagedDrafter, *, tree, **kwargs):
        super().__init__(target, drafter, tree=tree, **kwargs)

    @property
    def max_tree_size(self) -> int:
        return self.drafter.scratch_offset + self.drafter.inner_length + 1


class Staged(Sequoia):
    """Staged speculative decoding on Sequoia's optimal tree; ``staged-single`` is the same drafter and tree
    without draft².

    ``exit_layer`` / ``trained``: the drafter is the trained ``exit:K`` head cached for the target
    (``trained=None``, the default: the deepest cached one, or the one at ``exit_layer``; ``trained=True``
    requires one; ``False`` ignores them), else the untrained early exit at ``exit_layer`` (default 13/15 of
    the depth). The deepest trained head is the default because on SmolLM2 it dominates the untrained exit on
    both counts: ``exit:24`` agrees with the target on 0.81 of held-out tokens (card ``top1``), the untrained
    exits at layers 25-29 on 0.5-0.7 (docs/methods.md), and its head has 9,705 rows instead of 49,152.
    """

    name = "staged"
    paper = "Staged speculative decoding, Spector & Ré, arXiv 2308.04623"

    def __init__(self, target, tokenizer=None, *, inner_length=None, trained=None, **options) -> None:
        if options.pop("drafter", None) is not None:
            raise ValueError(
                "drafter: staged drafts with a layer-K exit (trained exit:K head or early exit) so that its "
                "draft² can score a proposed chain in one pass; choose it with exit_layer and trained"
            )
        layer, self.head_path = deepest_exit_head(target, options.pop("exit_layer", None), trained)
        spec = f"early-exit:{layer}" if self.head_path is None else f"exit:{layer}:{self.head_path}"
        super().__init__(target, tokenizer, drafter=spec, exit_layer=layer, **options)
        self.inner_length = self.check_inner_length(inner_length)
        self.draft2 = Draft2()

    @staticmethod
    def check_inner_length(inner_length) -> int:
        return as_count(4 if inner_length is None else inner_length, "inner_length")

    def options(self) -> dict:
        return {
            **super().options(),
            "inner_length": self.inner_length,
            "head": None if self.head_path is None else str(self.head_path),
        }

    def build(self, temperature: float = 0.0):
        if self.tree is None:
            self.plan()
        drafter = StagedDrafter(
            self.target,
            self.make_drafter(),
            self.draft2,
            scratch_offset=self.tree.tree.size,
            inner_length=self.inner_length,
        )
        return StagedTreeDecoder(
            self.target, drafter, tree=self.tree.tree, sampling=self.sampling(temperature)
        )

    def predict(self, calibration_prompts, temperature, max_new_tokens):
        from executor.methods.calibration import continuation

        texts = [p + continuation(self.target, p, max_new_tokens, 0.0, seed=0) for p in calibration_prompts]
        self.draft2.fit(texts)
        prediction = super().predict(calibration_prompts, temperature, max_new_tokens)
        prediction.details["model"] = (
            "optimal_tree(per-depth acc) (outer tree; draft² changes draft passes, not tokens)"
        )
        return prediction

    def extra(self, decoder) -> dict:
        drafter = decoder.drafter
        return {
            "draft_passes": drafter.draft_passes,
            "draft_levels": drafter.draft_levels,
            "inner_accepted_mean": float(np.mean(drafter.inner_accepted)) if drafter.inner_accepted else 0.0,
        }


class StagedSingleStage(Staged):
    """Staged's single-stage control: the same drafter and tree, decoded by Sequoia's plain tree decoder (every
    draft level one drafter pass; the run counts them as ``draft_levels``)."""

    name = "staged-single"
    paper = Staged.paper + " (single-stage control)"

    @staticmethod
    def check_inner_length(inner_length) -> int:
        if inner_length not in (None, 0):
            raise ValueError(f"inner_length: staged-single has no draft² (0), got {inner_length!r}")
        return 0

    def build(self, temperature: float = 0.0):
        return Sequoia.build(self, temperature)

    def predict(self, calibration_prompts, temperature, max_new_tokens):
        return Sequoia.predict(self, calibration_prompts, temperature, max_new_tokens)

    def extra(self, decoder) -> dict:
        return Sequoia.extra(self, decoder)
