"""n-gram prompt lookup (PLD, Saxena 2023; Hugging Face ``PromptLookupCandidateGenerator``)."""

from __future__ import annotations

import numpy as np
import torch

from theory.checks import as_count

__all__ = ["PromptLookupDrafter"]


class PromptLookupDrafter:
    """n-gram prompt lookup: propose the tokens that followed an earlier occurrence of the context's suffix.

    For the root, the last ``n`` tokens (``n = max_ngram, ..., min_ngram``) are searched for in the context,
    first occurrence first (Hugging Face's rule, which goes down to ``n = 1``); the tokens after the match (up
    to ``max_tokens``) are the proposal, served one per tree level along the drafted path. ``q`` is one-hot
    (logits 0 on the proposed token, ``-inf`` elsewhere); ``None`` (no proposal) ends drafting.
    """

    deterministic = True
    name = "ngram"

    def __init__(self, max_ngram: int = 3, max_tokens: int = 64, min_ngram: int = 1) -> None:
        self.max_ngram = as_count(max_ngram, "max_ngram")
        self.max_tokens = as_count(max_tokens, "max_tokens")
        self.min_ngram = as_count(min_ngram, "min_ngram")
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"min_ngram ({min_ngram}) must be at most max_ngram ({max_ngram})")
        self.vocab_size = 0
        self.device = torch.device("cpu")
        self.proposal: list[int] = []  # the current step's proposal (set at the root)

    def check_target(self, target) -> None:
        # Prompt lookup drafts from the target's own vocabulary, so it adopts its size and device.
        self.vocab_size = target.config.vocab_size
        self.device = target.tok_embeddings.weight.device

    def start(self, prompt: list[int], cache_slots: int) -> None:
        self.proposal = []

    def propose(self, context: list[int]) -> list[int]:
        """The continuation after the first earlier occurrence of the longest matching suffix n-gram."""
        array = np.asarray(context)
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(array[:-1], n)
            hits = np.flatnonzero((windows == array[-n:]).all(axis=1))
            if hits.size:
                start = int(hits[0]) + n
                return context[start : start + self.max_tokens]
        return []

    def draft_logits(self, state, tree, nodes):
        if nodes == [0]:
            self.proposal = self.propose(state.tokens)
        return self.proposal_logits(tree, nodes)

    def proposal_logits(self, tree, nodes: list[int]) -> torch.Tensor | None:
        """One-hot logits of :attr:`proposal` at ``nodes``, or ``None`` where a node is off or past it."""
        rows = []
        for node in nodes:
            path = [tree.tokens[v] for v in tree.path(node)[1:]]
            depth = len(path)
            if depth >= len(self.proposal) or path != self.proposal[:depth]:
                return None
            row = torch.full((self.vocab_size,), float("-inf"))
            row[self.proposal[depth]] = 0.0
            rows.append(row)
        return torch.stack(rows).to(self.device)

    def commit(self, state, tree, accepted_path) -> None:
        pass
