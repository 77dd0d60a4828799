"""Plain autoregressive decoding: greedy, or sampling with temperature, top-k and top-p.

Each step feeds the last committed token and draws the next one from the target,
:math:`x_{t+1} \\sim \\mathrm{softmax}(z_t / T)` after top-k / top-p filtering (greedy at ``T = 0``). It is
the baseline every speculative decoder must reproduce (token for token at ``T = 0``, in distribution
otherwise), written as the degenerate step whose draft tree is the root alone.
"""

from __future__ import annotations

import torch

from executor.decoders.base import Decoder, DecodingState, DraftTree, Sampling, StepOutcome

__all__ = ["AutoregressiveDecoder"]


class AutoregressiveDecoder(Decoder):
    """One target forward pass per token; stops on EOS or after ``max_new_tokens`` (see :meth:`generate`).

    Parameters
    ----------
    target : executor.model.Transformer
    sampling : Sampling, optional
        Greedy by default.
    log_distributions : str
        Accepted for a uniform interface; plain decoding drafts nothing, so nothing is logged.
    """

    name = "ar"
    max_tree_size = 1

    def __init__(self, target, *, sampling: Sampling | None = None, log_distributions: str = "none") -> None:
        super().__init__(target, None, sampling=sampling, log_distributions=log_distributions)

    def draft(self, state: DecodingState, generator: torch.Generator) -> DraftTree:
        return DraftTree(state.tokens[-1])

    def verify(self, tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator) -> StepOutcome:
        return StepOutcome([0], self.sampling.draw(target_probs[0], generator))
