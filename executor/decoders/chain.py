"""Chain speculative sampling (Leviathan, Kalman & Matias, ICML 2023, arXiv 2211.17192; Chen et al.,
"Accelerating Large Language Model Decoding with Speculative Sampling", arXiv 2302.01318).

The drafter proposes :math:`x_1, \\dots, x_\\gamma` with :math:`x_i \\sim q_i`, the target scores the chain in
one pass, and :func:`executor.verification.verify_chain` accepts :math:`x_i` with probability
:math:`\\min(1, p_i(x_i) / q_i(x_i))` up to the first rejection, then draws the correction from
:math:`\\mathrm{norm}((p_k - q_k)_+)` or the bonus token from :math:`p_{\\gamma+1}`. At temperature 0 the
chain is verified by argmax matching, so the output equals greedy decoding.

How many tokens to draft is a pluggable stop rule evaluated on the draft's own logits before each position
(a rule that looks only at the draft keeps the method lossless), e.g. :class:`ConfidenceStop`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from executor.decoders.base import Decoder, DecodingState, DraftTree, Sampling, StepOutcome
from executor.verification import verify_chain, verify_chain_argmax
from theory.checks import as_count, as_probabilities

__all__ = ["ChainDecoder", "ConfidenceStop"]

#: ``stop_rule(depth, draft_logits) -> bool``: stop drafting before position ``depth + 1``.
StopRule = Callable[[int, torch.Tensor], bool]


class ConfidenceStop:
    """Stop drafting when the draft's top probability (softmax at temperature 1) falls below ``threshold``.

    The confidence-based stop of Kangaroo (Liu et al., NeurIPS 2024, arXiv 2404.18911) and of Hugging Face's
    ``assistant_confidence_threshold`` (Mamou et al., arXiv 2405.04304). The first position is always drafted
    when ``min_tokens >= 1``.
    """

    def __init__(self, threshold: float, min_tokens: int = 1) -> None:
        self.threshold = float(as_probabilities(threshold, "threshold"))
        self.min_tokens = as_count(min_tokens, "min_tokens", minimum=0)

    def __call__(self, depth: int, draft_logits: torch.Tensor) -> bool:
        return depth >= self.min_tokens and float(draft_logits.softmax(-1).max()) < self.threshold


class ChainDecoder(Decoder):
    """Draft a chain of up to ``gamma`` tokens, verify it in one target pass.

    Parameters
    ----------
    target : executor.model.Transformer
    drafter : executor.drafters.Drafter
    gamma : int
        Largest draft length :math:`\\gamma \\ge 1`.
    stop_rule : callable, optional
        ``stop_rule(depth, draft_logits) -> bool``; default: always draft ``gamma`` tokens (or until the
        drafter has no proposal).
    sampling, log_distributions
        See :class:`executor.decoders.base.Decoder`.
    """

    name = "chain"

    def __init__(
        self,
        target,
        drafter,
        *,
        gamma: int = 4,
        stop_rule: StopRule | None = None,
        sampling: Sampling | None = None,
        log_distributions: str = "none",
    ) -> None:
        super().__init__(target, drafter, sampling=sampling, log_distributions=log_distributions)
        self.gamma = as_count(gamma, "gamma")
        self.stop_rule = stop_rule

    @property
    def max_tree_size(self) -> int:
        return self.gamma + 1

    def settings(self) -> dict:
        return {**super().settings(), "gamma": self.gamma}

    def draft(self, state: DecodingState, generator: torch.Generator) -> DraftTree:
        tree = DraftTree(state.tokens[-1])
        node = 0
        for depth in range(self.gamma):
            logits = self.drafter.draft_logits(state, tree, [node])
            if logits is None or (self.stop_rule is not None and self.stop_rule(depth, logits[0])):
                break
            q = self.sampling.probs(logits[0])
            tree.draft_probs[node] = q
            node = tree.add_child(node, self.sampling.draw(q, generator))
        return tree

    def verify(self, tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator) -> StepOutcome:
        if len(tree) == 1:
            return StepOutcome([0], self.sampling.draw(target_probs[0], generator))
        drafts = torch.tensor(tree.tokens[1:], device=target_probs.device)
        if self.sampling.greedy:
            n_accepted, token = verify_chain_argmax(target_probs, drafts)
        else:
            draft_probs = torch.stack([tree.draft_probs[v] for v in tree.expanded])
            n_accepted, token = verify_chain(target_probs, draft_probs, drafts, generator)
        return StepOutcome(list(range(int(n_accepted) + 1)), int(token))
