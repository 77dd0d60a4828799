"""Trained heads on the target's own first ``K`` layers: exit heads (``exit:K``) and Kangaroo's adapter
(``kangaroo:K``).

Both draft from :math:`h_K`, the target's hidden state after its first ``K`` layers (self-speculation:
LayerSkip, Elhoushi et al., ACL 2024, arXiv 2404.16710), through the target's frozen final norm and LM head
:math:`E'` (optionally on a reduced draft vocabulary, :class:`executor.drafters.vocab.DraftVocabulary`):

* **exit head** (``attention=False``; one per candidate layer, so DEL, Zarch et al., COLM 2025,
  arXiv 2504.05598, can choose among them):

  .. math::  z_t = W\\,\\mathrm{RMSNorm}(h_{K,t}) + b, \\qquad q_{t+1} = \\mathrm{softmax}(E'\\,\\mathrm{norm}(z_t))

* **Kangaroo adapter** (``attention=True``; Liu et al., "Kangaroo: Lossless Self-Speculative Decoding via
  Double Early Exiting", NeurIPS 2024, arXiv 2404.18911): the same map plus one attention layer of the
  target's shape over the earlier positions' :math:`h_K`, with its own small KV cache,

  .. math::  z_t = W\\,\\mathrm{RMSNorm}(h_{K,t}) + b + W_o\\,\\mathrm{Attn}(\\mathrm{RMSNorm}'(h_{K,\\le t})).

  Kangaroo's adapter is the residual ``h + Attn(norm(h))`` then its own norm; here the residual is the
  exit head's affine map (so training starts from the ridge-fitted exit head, the attention branch at zero)
  and the final norm is the target's, frozen. The confidence stop (the second early exit) is the decoder's:
  :class:`executor.decoders.chain.ConfidenceStop` or :class:`executor.methods.kangaroo.KangarooStop`.

Both start untrained as the plain early exit (``W = I``, ``b = 0``, ``W_o = 0``). The shallow layers share the
target's KV cache, as :class:`executor.drafters.EarlyExitDrafter` does (their K/V at a tree slot are what the
verification pass writes there), and skip the target's LM head. Training:
:mod:`executor.training.exit_heads`.

**Adapter cache.** Entry ``s`` is built from :math:`h_{K,s}` of committed token ``s`` at RoPE position ``s``.
A forward hook on the target's layer ``K`` keeps the latest :math:`h_K` written at every cache slot, so the
prefill and each verification pass leave the *exact* shallow states of the committed tokens (Kangaroo's
observation that the shallow part never needs recomputing); after a step the accepted path is compacted like
the target's cache, the adapter's length pointer rolls back to the committed prefix, and the next step feeds
the new committed entries from those exact states. The adapter's cache therefore always equals a fresh
prefill of the committed text.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from executor.drafters.vocab import DraftVocabulary
from executor.model import Attention, RMSNorm

__all__ = ["ExitDrafter", "ExitHead", "KangarooDrafter", "load_exit_head", "shallow_forward", "shallow_tree"]


class ExitHead(DraftVocabulary):
    """The trainable head at layer ``layer``: ``norm`` + ``fc`` (d -> d, bias), and for Kangaroo
    ``attention_norm`` + ``attention`` (the target's head layout, output projection starting at zero).

    Parameters
    ----------
    config : executor.model.ModelConfig
        The target's config.
    layer : int
        ``K``, the number of target layers run before the head, in ``[1, n_layers)``.
    vocab : LongTensor, optional
        Sorted token ids of a reduced draft vocabulary; ``None`` for the full vocabulary.
    attention : bool
        ``True`` for Kangaroo's adapter.
    """

    def __init__(self, config, layer: int, vocab=None, *, attention: bool = False) -> None:
        super().__init__()
        if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer < config.n_layers:
            raise ValueError(f"layer must be an integer in [1, {config.n_layers}), got {layer!r}")
        self.config = config
        self.layer = layer
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.fc = nn.Linear(config.dim, config.dim, bias=True)
        with torch.no_grad():
            self.fc.weight.copy_(torch.eye(config.dim))
            self.fc.bias.zero_()
        self.has_attention = bool(attention)
        if self.has_attention:
            self.attention_norm = RMSNorm(config.dim, config.norm_eps)
            self.attention = Attention(config)
            with torch.no_grad():
                self.attention.wo.weight.zero_()
        self.init_vocab(config.vocab_size, vocab)

    @property
    def kind(self) -> str:
        return f"{'kangaroo' if self.has_attention else 'exit'}:{self.layer}"

    def setup_cache(self, slots: int, batch_size: int = 1) -> None:
        if self.has_attention:
            self.attention.allocate_cache(batch_size, slots, like=self.fc.weight)

    def forward(self, target, hidden, cache_positions=None, positions=None, attention_mask=None):
        """Features ``z`` ``(B, T, d)`` from ``h_K`` ``(B, T, d)``; Kangaroo's adapter writes its K/V at
        ``cache_positions`` (RoPE ``positions``, boolean ``attention_mask`` over its cache slots)."""
        dtype = self.fc.weight.dtype
        hidden = hidden.to(dtype)
        z = self.fc(self.norm(hidden))
        if self.has_attention:
            cos, sin = target._rope(positions)
            z = z + self.attention(
                self.attention_norm(hidden), cos.to(dtype), sin.to(dtype), cache_positions, attention_mask
            )
        return z


def shallow_forward(model, tokens, slots, positions, attention_mask, n_layers: int) -> torch.Tensor:
    """Hidden states ``(T, d)`` after the target's first ``n_layers`` layers on ``tokens`` (``T`` ids) at
    cache ``slots`` with RoPE ``positions`` and boolean ``attention_mask`` ``(T, S)`` over the cache slots;
    writes those layers' K/V and skips the final norm and the LM head."""
    device = model.tok_embeddings.weight.device
    slots = torch.as_tensor(slots, device=device)
    x = model.tok_embeddings(torch.as_tensor(tokens, device=device)[None])
    n_slots, mask = model._additive_mask(slots, attention_mask.to(device), x.dtype)
    cos, sin = model._rope(torch.as_tensor(positions, device=device))
    for layer in model.layers[:n_layers]:
        x = layer(x, cos, sin, slots, mask, n_slots)
    return x[0]


def shallow_tree(model, tree, nodes: list[int], committed: int, n_layers: int) -> torch.Tensor:
    """:func:`shallow_forward` on tree ``nodes`` (slot ``committed + node``, RoPE position ``committed +
    depth``, tree mask)."""
    slots = torch.tensor(nodes) + committed
    positions = torch.tensor([tree.depths[v] for v in nodes]) + committed
    tokens = [tree.tokens[v] for v in nodes]
    return shallow_forward(model, tokens, slots, positions, tree.attention_mask(nodes, committed), n_layers)


def load_exit_head(target, path: str | Path, kind: str) -> tuple[ExitHead, dict]:
    """The :class:`ExitHead` of checkpoint ``path`` for ``target``, refused unless its card says ``kind``."""
    from executor.training.checkpoint import load_checkpoint

    tensors, card = load_checkpoint(path, target=target, kind=kind)
    family, _, layer = kind.partition(":")
    head = ExitHead(target.config, int(layer), tensors.get("vocab"), attention=family == "kangaroo")
    try:
        head.load_state_dict(tensors, strict=True)
    except RuntimeError as error:
        raise ValueError(f"checkpoint {str(path)!r} does not hold a {kind} head: {error}") from None
    return head, card


class ExitDrafter:
    """Drafts with a trained exit head on the target's first ``head.layer`` layers (``exit:K``).

    Parameters
    ----------
    target : executor.model.Transformer
    head : ExitHead
        Moved to the target's device and dtype.
    name : str, optional
        As written on the command line (default ``head.kind``).
    card : dict, optional
        The checkpoint card the head came from.
    """

    deterministic = False
    attention = False

    def __init__(self, target, head: ExitHead, name: str | None = None, card: dict | None = None) -> None:
        if head.has_attention != self.attention:
            raise ValueError(f"a {type(self).__name__} needs a head with attention={self.attention}")
        config = target.config
        if head.config.dim != config.dim or head.config.vocab_size != config.vocab_size:
            raise ValueError(
                f"the {head.kind} head (dim {head.config.dim}, vocabulary {head.config.vocab_size}) does not "
                f"fit the target (dim {config.dim}, vocabulary {config.vocab_size})"
            )
        if head.layer >= config.n_layers:
            raise ValueError(
                f"the head's layer {head.layer} is not below the target's {config.n_layers} layers"
            )
        weight = target.tok_embeddings.weight
        self.target = target
        self.head = head.to(weight.device, weight.dtype).requires_grad_(False).eval()
        self.head.vocab = self.head.vocab.long()
        self.head.freeze_for_drafting(target)
        self.exit_layer = head.layer
        self.name = name or head.kind
        self.card = card

    @classmethod
    def from_checkpoint(cls, target, path: str | Path, layer: int, name: str | None = None):
        """Load a checkpoint written by :func:`executor.training.train_drafter` for ``target`` and ``layer``."""
        kind = f"{'kangaroo' if cls.attention else 'exit'}:{layer}"
        head, card = load_exit_head(target, path, kind)
        return cls(target, head, name=name or f"{kind}:{path}", card=card)

    def check_target(self, target) -> None:
        if target is not self.target:
            raise ValueError(f"a {type(self).__name__} must be built on the target model it drafts for")

    def start(self, prompt: list[int], cache_slots: int) -> None:
        pass  # the target's prefill already wrote the shallow layers

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits ``(T, V)`` from the layer-``K`` hidden states ``(T, d)``."""
        return self.head.logits(self.target, self.head(self.target, hidden[None])[0])

    def draft_logits(self, state, tree, nodes):
        return self.head_logits(shallow_tree(self.target, tree, nodes, state.committed, self.exit_layer))

    def commit(self, state, tree, accepted_path) -> None:
        pass  # the verification pass overwrote the shallow layers' slots; the target's commit compacts them


class KangarooDrafter(ExitDrafter):
    """Kangaroo's self-draft model: the target's first ``K`` layers, the trained adapter (own KV cache) and
    the LM head (``kangaroo:K``); see the module docstring for the cache protocol."""

    attention = True

    def __init__(self, target, head: ExitHead, name: str | None = None, card: dict | None = None) -> None:
        super().__init__(target, head, name, card)
        self.length = 0  # adapter slots [0, length) hold the entries of committed tokens 0 .. length - 1
        self._states: torch.Tensor | None = None
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None
        # Registered now, so the decoder's prefill (which runs before start()) is captured too.
        self._hook = target.layers[self.exit_layer - 1].register_forward_hook(self._capture)

    def _capture(self, module, args, output) -> None:
        if output.shape[0] != 1:
            return  # a batched forward (training, feature prefill) is not a decoding step
        self._last = (args[3], output[0])
        if self._states is not None and int(args[3].max()) < self._states.shape[0]:
            self._states[args[3]] = output[0]

    def start(self, prompt: list[int], cache_slots: int) -> None:
        weight = self.target.tok_embeddings.weight
        if self._hook is None:
            raise ValueError("this KangarooDrafter was closed; build a new one")
        self.head.setup_cache(cache_slots)
        self.length = 0
        self._states = torch.zeros(
            cache_slots, self.target.config.dim, dtype=weight.dtype, device=weight.device
        )
        if len(prompt) > 1:
            prefill = len(prompt) - 1
            last = self._last
            if last is None or last[0].tolist() != list(range(prefill)):
                raise ValueError(
                    "the KangarooDrafter saw no prefill of the prompt: start() must follow the target's "
                    "prefill of prompt[:-1] (as executor.decoders do)"
                )
            self._states[:prefill] = last[1]
        self._last = None

    def close(self) -> None:
        """Remove the forward hook from the target (the drafter can no longer be used)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._states = None

    def _adapter(self, hidden, slots, positions, mask) -> torch.Tensor:
        device = self.head.fc.weight.device
        z = self.head(
            self.target,
            hidden[None],
            torch.as_tensor(slots, device=device),
            torch.as_tensor(positions, device=device),
            mask.to(device),
        )[0]
        return self.head.logits(self.target, z)

    def draft_logits(self, state, tree, nodes):
        committed = state.committed
        hidden = shallow_tree(self.target, tree, nodes, committed, self.exit_layer)
        if nodes == [0]:
            # Feed the committed entries length .. L - 1 from the exact states, then the root (slot L).
            slots = torch.arange(self.length, committed + 1)
            inputs = torch.cat([self._states[self.length : committed], hidden])
            mask = torch.arange(committed + 1) <= slots[:, None]
            logits = self._adapter(inputs, slots, slots, mask)
            self.length = committed
            return logits[-1:]
        slots = torch.tensor(nodes) + committed
        positions = torch.tensor([tree.depths[v] for v in nodes]) + committed
        return self._adapter(hidden, slots, positions, tree.attention_mask(nodes, committed))

    def commit(self, state, tree, accepted_path) -> None:
        # The verification pass wrote the exact layer-K states at every tree slot; keep the accepted path's.
        committed = state.committed
        source = torch.tensor(accepted_path, device=self._states.device) + committed
        self._states[committed : committed + len(accepted_path)] = self._states[source]
        self.length = min(self.length, committed)
