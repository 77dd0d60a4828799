"""The frozen-LM-head output every trained draft head shares, with an optional reduced draft vocabulary.

A head's feature ``z`` becomes draft logits through the target's frozen final norm and LM head,
:math:`E'\\,\\mathrm{norm}(z)`. With a reduced vocabulary :math:`V'` (sorted token ids) only the rows of
:math:`V'` are multiplied and the logits are :math:`-\\infty` elsewhere, so :math:`q = 0` outside :math:`V'`
and every verifier stays lossless.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from executor.model import Linear
from executor.products import packed_linear, packing_applies, prepack

__all__ = ["DraftVocabulary", "lm_head_weight"]


def lm_head_weight(target) -> torch.Tensor:
    """The target's LM head matrix ``(V, d)`` (the tied embedding when there is no ``output``)."""
    return target.tok_embeddings.weight if target.output is None else target.output.weight


class DraftVocabulary(nn.Module):
    """Base class of heads drafting through the target's LM head; subclasses set ``self.config`` and call
    :meth:`init_vocab` in their constructor."""

    def init_vocab(self, vocab_size: int, vocab) -> None:
        full = torch.arange(vocab_size) if vocab is None else torch.as_tensor(vocab, dtype=torch.long)
        if full.ndim != 1 or full.numel() == 0 or int(full.min()) < 0 or int(full.max()) >= vocab_size:
            raise ValueError(f"vocab must be a non-empty 1-D set of token ids in [0, {vocab_size})")
        self.register_buffer("vocab", full.unique(), persistent=True)

    @property
    def reduced(self) -> bool:
        return self.vocab.numel() < self.config.vocab_size

    def logits(self, target, features: torch.Tensor, *, full: bool = True) -> torch.Tensor:
        """Draft logits from features; ``full`` scatters them into ``V`` columns with ``-inf`` outside ``V'``.

        On a quantised target (:mod:`executor.quantize`) the full vocabulary goes through the target's int8 LM
        head (:meth:`executor.model.Transformer.lm_head`; measured faster than the float rows in
        ``docs/benchmarks/int8.md``); otherwise, for a reduced vocabulary, and when gradients flow (training, online
        distillation: the int8 kernel has no derivative), through the float rows; frozen reduced rows
        (:meth:`freeze_for_drafting`) and the full head go through oneDNN's blocked copy where it applies
        (:mod:`executor.products`).
        """
        weight = lm_head_weight(target)
        reduced = self.reduced
        if reduced:
            weight = weight[self.vocab] if not hasattr(self, "_weight_cache") else self._weight_cache
        normed = target.norm(features.to(weight.dtype))
        if hasattr(self, "_weight_cache") and packing_applies(normed, weight):
            logits = packed_linear(normed, weight).float()
        elif not reduced and not torch.is_grad_enabled():
            logits = target.lm_head(normed).float()  # the int8 head, or the target's packed copy
        else:
            logits = F.linear(normed, weight).float()
        if not (reduced and full):
            return logits
        out = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        out[..., self.vocab] = logits
        return out

    def freeze_for_drafting(self, target) -> None:
        """Keep the reduced LM head rows in a contiguous tensor, and make the packed copy of every product's
        weight now (:func:`executor.products.prepack`), so that a generation's first step does not pay for it
        (drafting speed; not saved)."""
        if self.reduced:
            self._weight_cache = lm_head_weight(target)[self.vocab].contiguous()
            prepack(self._weight_cache)
        prepack(*(module.weight for module in self.modules() if isinstance(module, Linear)))
