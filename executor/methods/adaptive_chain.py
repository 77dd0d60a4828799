"""A chain decoder whose draft length is decided token by token by a pluggable policy, after each draft.

Kangaroo's confidence stop, DEL's dynamic draft exit and SpecDec++'s rejection-probability threshold all
decide *after* drafting token ``k`` whether to draft token ``k + 1`` (the low-confidence token is still
verified), from what the drafter revealed. :class:`executor.decoders.ChainDecoder`'s stop rule instead looks
at the next position's logits before drafting it, which costs one draft pass more per step and drops the last
token; this decoder implements the papers' order without touching the shared decoder. A policy that only sees
the draft keeps the chain lossless (verification is the chain decoder's speculative sampling).
"""

from __future__ import annotations

import torch

from executor.decoders import ChainDecoder, DraftTree
from executor.decoders.base import DecodingState

__all__ = ["AdaptiveChainDecoder", "DraftPolicy"]


class DraftPolicy:
    """Base policy: draft ``max_length`` tokens. Override the hooks.

    ``start_round(state)`` runs before drafting, ``continue_after(k, logits, feature)`` after drafting token
    ``k`` (``logits`` = the draft logits that token was drawn from, ``feature`` = the drafter's hidden state
    behind them when the drafter exposes one as ``draft_feature(node)``, else ``None``) and
    ``after_step(log)`` after verification.
    """

    max_length: int = 4

    def round_length(self) -> int:
        """The largest number of tokens this round may draft (``<= max_length``)."""
        return self.max_length

    def start_round(self, state: DecodingState) -> None:
        pass

    def continue_after(self, drafted: int, logits: torch.Tensor, feature: torch.Tensor | None = None) -> bool:
        return True

    def after_step(self, log) -> None:
        pass


class AdaptiveChainDecoder(ChainDecoder):
    """Chain speculative sampling with a :class:`DraftPolicy` deciding the length of every round."""

    name = "adaptive-chain"

    def __init__(self, target, drafter, *, policy: DraftPolicy, sampling=None, log_distributions="none"):
        super().__init__(
            target, drafter, gamma=policy.max_length, sampling=sampling, log_distributions=log_distributions
        )
        self.policy = policy
        self.drafted_lengths: list[int] = []

    def draft(self, state: DecodingState, generator: torch.Generator) -> DraftTree:
        self.policy.start_round(state)
        tree = DraftTree(state.tokens[-1])
        node = 0
        features = getattr(self.drafter, "draft_feature", None)
        for drafted in range(1, min(self.policy.round_length(), self.gamma) + 1):
            logits = self.drafter.draft_logits(state, tree, [node])
            if logits is None:
                break
            q = self.sampling.probs(logits[0])
            tree.draft_probs[node] = q
            feature = None if features is None else features(node)
            node = tree.add_child(node, self.sampling.draw(q, generator))
            if not self.policy.continue_after(drafted, logits[0], feature):
                break
        self.drafted_lengths.append(len(tree) - 1)
        return tree

    def step(self, state, generator):
        log = super().step(state, generator)
        self.policy.after_step(log)
        return log
