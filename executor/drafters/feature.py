"""A feature-level draft head on the target's final hidden states (the EAGLE / Falcon family).

EAGLE (Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty", ICML 2024,
arXiv 2401.15077) drafts at the level of the target's top feature rather than of tokens. At position :math:`t`
the head reads the target's final hidden state :math:`h_t` (after token :math:`x_t`) and the embedding of the
next token :math:`x_{t+1}`, and predicts the feature after :math:`x_{t+1}`:

.. math::  g_{t+1} = \\mathrm{Layer}\\big(W [\\mathrm{norm}(h_t);\\, E x_{t+1}] + b\\big), \\qquad
           q_{t+2} = \\mathrm{softmax}\\big(E'\\, \\mathrm{norm}(g_{t+1})\\big)

with one llama decoder layer (its own KV cache), the target's frozen final norm and LM head :math:`E'` (the
tied embedding, optionally restricted to a reduced draft vocabulary :math:`V'`: logits are :math:`-\\infty`
outside it, so :math:`q = 0` there and verification stays lossless). Deeper tree levels feed the head's own
feature :math:`g` in place of :math:`h` (autoregression at the feature level).

KV cache of the head: entry ``(h_{s-1}, x_s)`` lives in slot ``s - 1`` at RoPE position ``s``; the root of a
draft tree (the last committed token ``x_L``) is slot ``L - 1`` and tree node ``v`` slot ``L - 1 + v`` at
position ``L + depth(v)``. After a step only the committed entries are kept (the length pointer is rolled back
to ``L``): the accepted tokens are fed again at the next step from the target's *exact* hidden states, which
the decoder hands over in :attr:`executor.decoders.base.DecodingState.hidden` (EAGLE re-feeds accepted tokens
the same way), so the head's cache always equals a fresh prefill of the committed text.

Training: :mod:`executor.training.trainer` (KL(p || q) at T = 1 plus a SmoothL1 feature regression, the input
projection initialised by ridge regression).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from executor.drafters.vocab import DraftVocabulary
from executor.model import TransformerBlock

__all__ = ["FeatureDrafter", "FeatureHead"]

KIND = "feature"


class FeatureHead(DraftVocabulary):
    """The trainable part: ``fc`` (2d -> d, with bias) and one llama decoder layer shaped like the target's.

    Parameters
    ----------
    config : executor.model.ModelConfig
        The target's config (width, heads, feed-forward width, RoPE base).
    vocab : LongTensor, optional
        Sorted token ids of a reduced draft vocabulary; ``None`` for the full vocabulary.
    """

    def __init__(self, config, vocab: torch.Tensor | None = None) -> None:
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.dim, config.dim, bias=True)
        self.layer = TransformerBlock(config)
        with torch.no_grad():  # the layer starts as the identity (its residual branches output zero)
            self.layer.attention.wo.weight.zero_()
            self.layer.feed_forward.w2.weight.zero_()
        self.init_vocab(config.vocab_size, vocab)

    def setup_cache(self, slots: int, batch_size: int = 1) -> None:
        self.layer.attention.allocate_cache(batch_size, slots, like=self.fc.weight)

    def forward(
        self,
        target,
        features: torch.Tensor,
        next_tokens: torch.Tensor,
        cache_positions: torch.Tensor,
        positions: torch.Tensor,
        attention_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Predicted features ``g`` ``(B, T, d)`` from pre-norm features ``(B, T, d)`` and tokens ``(B, T)``.

        Writes the layer's K/V at ``cache_positions`` (call :meth:`setup_cache` first).
        """
        dtype = self.fc.weight.dtype
        inputs = torch.cat(
            [target.norm(features).to(dtype), target.tok_embeddings(next_tokens).to(dtype)], -1
        )
        cos, sin = target._rope(positions)
        return self.layer(self.fc(inputs), cos.to(dtype), sin.to(dtype), cache_positions, attention_mask)


class FeatureDrafter:
    """Drafts with a trained :class:`FeatureHead` from the target's final hidden states.

    Parameters
    ----------
    target : executor.model.Transformer
    head : FeatureHead
        Moved to the target's device and dtype.
    name : str
        As written on the command line.
    card : dict, optional
        The checkpoint card the head came from.
    """

    deterministic = False
    needs_target_hidden = True
    kind = KIND
    head_class = FeatureHead

    def __init__(self, target, head: FeatureHead, name: str = KIND, card: dict | None = None) -> None:
        if head.config.dim != target.config.dim or head.config.vocab_size != target.config.vocab_size:
            raise ValueError(
                f"the feature head (dim {head.config.dim}, vocabulary {head.config.vocab_size}) does not fit the "
                f"target (dim {target.config.dim}, vocabulary {target.config.vocab_size})"
            )
        weight = target.tok_embeddings.weight
        self.target = target
        self.head = head.to(weight.device, weight.dtype).requires_grad_(False).eval()
        self.head.vocab = self.head.vocab.long()
        self.head.freeze_for_drafting(target)
        self.name = name
        self.card = card
        self.length = 0  # head slots [0, length) hold the entries of committed tokens 1 .. length
        self._features: dict[int, torch.Tensor] = {}

    @classmethod
    def from_checkpoint(cls, target, path: str | Path, name: str | None = None) -> FeatureDrafter:
        """Load a checkpoint directory written by :func:`executor.training.train_drafter` for ``target``."""
        from executor.training.checkpoint import load_checkpoint

        tensors, card = load_checkpoint(path, target=target, kind=cls.kind)
        head = cls.head_class(target.config, tensors.get("vocab"))
        try:
            head.load_state_dict(tensors, strict=True)
        except RuntimeError as error:
            raise ValueError(f"checkpoint {str(path)!r} does not hold a {cls.kind} head: {error}") from None
        return cls(target, head, name=name or f"{cls.kind}:{path}", card=card)

    def check_target(self, target) -> None:
        if target is not self.target:
            raise ValueError("a FeatureDrafter must be built on the target model it drafts for")

    def start(self, prompt: list[int], cache_slots: int) -> None:
        self.head.setup_cache(cache_slots)
        self.length = 0
        self._features = {}

    def prefill(self, state) -> None:
        """Read the prompt's committed entries now, as part of the generation's prefill, so that the first
        step's root pass feeds one entry, as a steady step's does (the last entry stays for it)."""
        if state.hidden is not None and state.committed - 1 > self.length:
            self._feed_committed(state, state.committed - 1)

    def _feed_committed(self, state, stop: int) -> torch.Tensor:
        """Feed the committed entries (h_{s-1}, x_s), s = length + 1 .. stop, from the target's exact features;
        returns their output features."""
        slots = torch.arange(self.length, stop)
        mask = torch.arange(stop) <= slots[:, None]
        features = self._run(
            state.hidden[self.length : stop], state.tokens[self.length + 1 : stop + 1], slots, slots + 1, mask
        )
        self.length = stop
        return features

    def _run(self, features, tokens, slots, positions, mask) -> torch.Tensor:
        device = self.head.fc.weight.device
        return self.head(
            self.target,
            features[None],
            torch.tensor([tokens], device=device),
            torch.as_tensor(slots, device=device),
            torch.as_tensor(positions, device=device),
            mask.to(device),
        )[0]

    def draft_logits(self, state, tree, nodes):
        committed = state.committed
        if committed == 0 or state.hidden is None:
            return None  # no target feature yet (a one-token prompt's first step is plain decoding)
        if nodes == [0]:
            features = self._feed_committed(state, committed)
            self._features = {0: features[-1]}
            return self.head.logits(self.target, features[-1:])
        inputs = torch.stack([self._features[tree.parents[v]] for v in nodes])
        slots = torch.tensor(nodes) + committed - 1
        positions = torch.tensor([tree.depths[v] for v in nodes]) + committed
        mask = tree.attention_mask(nodes, committed - 1)
        features = self._run(inputs, [tree.tokens[v] for v in nodes], slots, positions, mask)
        for node, feature in zip(nodes, features, strict=True):
            self._features[node] = feature
        return self.head.logits(self.target, features)

    def draft_feature(self, node: int) -> torch.Tensor:
        """The head's output feature at ``node`` (the hidden state its children's logits came from), after
        :meth:`draft_logits` drafted them: what SpecDec++'s acceptance head reads."""
        return self._features[node]

    def commit(self, state, tree, accepted_path) -> None:
        # Keep only entries built from the target's exact features; the accepted tokens are fed next step.
        self.length = min(self.length, state.committed)
        self._features = {}
