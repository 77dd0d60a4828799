"""A compact llama-family decoder with a static, position-indexed KV cache.

The model is the Llama architecture (Touvron et al., "LLaMA: Open and Efficient Foundation Language Models",
arXiv 2302.13971, 2023) as used by SmolLM2 (Allal et al., "SmolLM2: When Smol Goes Big", arXiv 2502.02737,
2025): RMSNorm (Zhang & Sennrich, NeurIPS 2019, arXiv 1910.07467), rotary position embeddings (Su et al.,
"RoFormer", arXiv 2104.09864, 2021) in the Hugging Face ``rotate_half`` convention, grouped-query attention
(Ainslie et al., EMNLP 2023, arXiv 2305.13245), a SwiGLU feed-forward (Shazeer, "GLU Variants Improve
Transformer", arXiv 2002.05202, 2020) and, by default, tied input/output embeddings.

The layout follows gpt-fast (pytorch-labs/gpt-fast, ``model.py``): the KV cache is preallocated and written at
the slots named by ``cache_positions``, so rolling back rejected draft tokens is moving the caller's length
pointer; nothing is ever cropped. Speculative decoding needs three more things, all in
:meth:`Transformer.forward`:

* a tree attention mask over cache slots and per-node RoPE positions (SpecInfer, Miao et al., ASPLOS 2024,
  arXiv 2305.09781; Medusa, Cai et al., ICML 2024, arXiv 2401.10774), with
  :meth:`Transformer.copy_cache_slots` to move the accepted path's K/V into contiguous slots afterwards;
* early-exit logits from the first ``exit_layer`` layers through the shared final norm and LM head (LayerSkip,
  Elhoushi et al., ACL 2024, arXiv 2404.16710);
* the hidden state after the last layer run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from executor.products import linear, product

__all__ = ["Linear", "ModelConfig", "Transformer", "attention_dtype"]


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a llama-family decoder.

    Parameters
    ----------
    vocab_size : int
        Number of tokens :math:`V`.
    dim : int
        Width of the residual stream :math:`d`.
    n_layers : int
        Number of decoder layers :math:`L`.
    n_heads : int
        Query heads :math:`H`.
    n_kv_heads : int
        Key/value heads :math:`H_{kv}`; :math:`H` must be a multiple (grouped-query attention).
    hidden_dim : int
        Inner width of the SwiGLU feed-forward.
    rope_theta : float
        RoPE base :math:`\\theta`; frequencies are :math:`\\theta^{-2i/d_h}`.
    norm_eps : float
        RMSNorm :math:`\\varepsilon`.
    max_seq_len : int
        Default number of KV-cache slots allocated by :meth:`Transformer.setup_cache`.
    tie_embeddings : bool
        The LM head reuses ``tok_embeddings.weight`` (no ``output.weight`` parameter).
    """

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden_dim: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 2048
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "max_seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of n_heads ({self.n_heads})")
        if self.head_dim % 2:
            raise ValueError(f"the head dimension dim // n_heads ({self.head_dim}) must be even for RoPE")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta!r}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be positive, got {self.norm_eps!r}")

    @property
    def head_dim(self) -> int:
        """Width of one attention head, :math:`d_h = d / H`."""
        return self.dim // self.n_heads


class Linear(nn.Linear):
    """A bias-free ``nn.Linear`` whose product is :func:`linear`, or oneDNN's on a blocked copy of the weight
    where that applies (:mod:`executor.products`: float32 inference on the CPU); ``forward(x, rows)`` may take a
    ``slice`` of output rows. :class:`executor.quantize.Int8Linear` has the same call, so the int8 path swaps
    modules only."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
        if rows is None:
            return product(x, self.weight)
        return linear(x, self.weight[rows])


class RMSNorm(nn.Module):
    """:math:`x / \\sqrt{\\mathrm{mean}(x^2) + \\varepsilon} \\cdot w`, normalised in float32 (as in HF)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Map the two halves ``(a, b)`` of the last axis to ``(-b, a)`` (Hugging Face RoPE convention)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def attention_dtype(dtype: torch.dtype, device: torch.device | str) -> torch.dtype:
    """The dtype of the KV cache and of attention for a model in ``dtype`` on ``device``.

    float32 for a bfloat16 model on the CPU, else ``dtype``. torch's CPU flash attention is slow for one query
    row in bfloat16 (measured on an AMD EPYC Zen 4 with avx512_bf16, 2 threads, 9 query and 3 key/value heads
    of 64: 152 us at 256 keys and 569 us at 1024, against 27 and 111 us in float32; two query rows cost 54 us in
    either dtype), and decoding and the row-wise verification pass run exactly one query row per call. The
    keys and values are still rounded to bfloat16 by the layer that computes them; the cache holds those
    values exactly in float32, and the attention's output is rounded to bfloat16 again.
    """
    if dtype == torch.bfloat16 and torch.device(device).type == "cpu":
        return torch.float32
    return dtype


class KVCache(nn.Module):
    """Static per-layer key/value storage, shape ``(batch, n_kv_heads, slots, head_dim)``, written by slot.

    ``k`` and ``v`` are plain tensor attributes, not registered buffers (run-time state, never in a state dict):
    ``torch.compile`` gives a module's buffers static shapes, so every cache size would be a new graph
    (``executor.compiled``). :meth:`_apply` still moves them with ``.to()`` like buffers.
    """

    def __init__(self, batch_size: int, n_kv_heads: int, slots: int, head_dim: int, *, dtype, device) -> None:
        super().__init__()
        shape = (batch_size, n_kv_heads, slots, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.k, self.v = fn(self.k), fn(self.v)
        return self

    def write(self, cache_positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k.index_copy_(2, cache_positions, k.to(self.k.dtype))
        self.v.index_copy_(2, cache_positions, v.to(self.v.dtype))

    def copy_slots(self, source: torch.Tensor, destination: torch.Tensor) -> None:
        # index_select copies first, so overlapping source/destination slots are safe.
        self.k.index_copy_(2, destination, self.k.index_select(2, source))
        self.v.index_copy_(2, destination, self.v.index_select(2, source))


def _fuse_on_load(parts: tuple[str, ...], fused: str):
    """A load-state-dict pre-hook concatenating the rows of the checkpoint's ``parts`` into ``fused``."""

    def hook(module, state_dict, prefix, *args) -> None:
        if all(prefix + part in state_dict for part in parts):
            state_dict[prefix + fused] = torch.cat([state_dict.pop(prefix + part) for part in parts])

    return hook


def _split_on_save(parts: dict[str, int], fused: str):
    """A state-dict post-hook splitting ``fused`` back into the documented ``parts`` (name -> rows)."""

    def hook(module, state_dict, prefix, local_metadata) -> None:
        weight = state_dict.pop(prefix + fused)
        # Copies, not views: a checkpoint writer (safetensors) refuses tensors that share storage.
        for part, chunk in zip(parts, weight.split(list(parts.values())), strict=True):
            state_dict[prefix + part] = chunk.clone()

    return hook


class Attention(nn.Module):
    """Grouped-query self-attention over the KV-cache slots ``[0, S)`` under a boolean mask.

    The query, key and value projections are one ``wqkv`` matrix (rows ``[W_q; W_k; W_v]``, as in gpt-fast);
    the state dict still holds ``wq``, ``wk`` and ``wv`` (split on save, concatenated on load).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        q_rows, kv_rows = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
        self.wqkv = Linear(config.dim, q_rows + 2 * kv_rows)
        self.wo = Linear(q_rows, config.dim)
        self.kv_cache: KVCache | None = None
        parts = {"wq.weight": q_rows, "wk.weight": kv_rows, "wv.weight": kv_rows}
        self.register_load_state_dict_pre_hook(_fuse_on_load(tuple(parts), "wqkv.weight"))
        self.register_state_dict_post_hook(_split_on_save(parts, "wqkv.weight"))

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache_positions: torch.Tensor,
        attention_mask: torch.Tensor | None,
        slots: int | None = None,
    ) -> torch.Tensor:
        """``attention_mask``: shape (T, slots), additive (0 or -inf) or boolean (``True`` = may attend), or
        ``None`` when every query sees every slot; ``slots`` defaults to the mask's width (the drafters that
        run single layers pass a boolean mask and no ``slots``), or a tuple from :func:`visible_slots`."""
        if slots is None:
            if attention_mask is None:
                raise ValueError("slots is needed when attention_mask is None")
            slots = attention_mask.shape[-1]
        batch, length, _ = x.shape
        heads = self.n_heads + self.n_kv_heads
        qkv = self.wqkv(x).view(batch, length, heads + self.n_kv_heads, self.head_dim)
        # RoPE on the query and key heads in one pass (cos, sin broadcast over heads).
        qk, v = qkv[:, :, :heads].transpose(1, 2), qkv[:, :, heads:].transpose(1, 2)
        qk = qk * cos + rotate_half(qk) * sin
        q, k = qk[:, : self.n_heads], qk[:, self.n_heads :]
        self.kv_cache.write(cache_positions, k, v)
        q = q.to(self.kv_cache.k.dtype)  # exact: a float32 cache only widens bfloat16 (attention_dtype)
        if isinstance(attention_mask, tuple):
            out = self._rowwise(q, attention_mask)
        else:
            keys = self.kv_cache.k[:, :, :slots]
            values = self.kv_cache.v[:, :, :slots]
            if attention_mask is not None and attention_mask.is_floating_point():
                attention_mask = attention_mask.to(q.dtype)
            # Query head h reads key/value head h // group (Hugging Face's repeat_kv), without copying K/V.
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=attention_mask, enable_gqa=self.n_heads != self.n_kv_heads
            )
        out = out.to(x.dtype)
        return self.wo(out.transpose(1, 2).reshape(batch, length, self.n_heads * self.head_dim))

    def _rowwise(self, q: torch.Tensor, rows: tuple) -> torch.Tensor:
        """Attention one query at a time over exactly the slots it sees (``rows`` from :func:`visible_slots`):
        the computation of a one-token pass, so the result does not depend on how many tokens share a call."""
        cache, outs = self.kv_cache, []
        for t, index in enumerate(rows):
            keys, values = (
                (cache.k[:, :, :index], cache.v[:, :, :index])
                if isinstance(index, int)
                else (cache.k[:, :, index], cache.v[:, :, index])
            )
            outs.append(
                F.scaled_dot_product_attention(
                    q[:, :, t : t + 1], keys, values, enable_gqa=self.n_heads != self.n_kv_heads
                )
            )
        return torch.cat(outs, dim=2)

    def allocate_cache(self, batch_size: int, slots: int, *, like: torch.Tensor) -> None:
        """Give this layer a zeroed :class:`KVCache` of ``slots`` slots on the device of ``like``, in the dtype
        its attention runs in (:func:`attention_dtype`)."""
        self.kv_cache = KVCache(
            batch_size,
            self.n_kv_heads,
            slots,
            self.head_dim,
            dtype=attention_dtype(like.dtype, like.device),
            device=like.device,
        )

    def key_value(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotated keys and the values of ``x`` (shape (B, T, dim)), as ``forward`` writes them to the cache.

        For methods that fill a layer's cache without running its attention (skipped layers).
        """
        batch, length, _ = x.shape
        rows = self.n_heads * self.head_dim
        kv = self.wqkv(x, slice(rows, None)).view(batch, length, 2 * self.n_kv_heads, self.head_dim)
        k, v = kv[:, :, : self.n_kv_heads].transpose(1, 2), kv[:, :, self.n_kv_heads :].transpose(1, 2)
        return k * cos + rotate_half(k) * sin, v


class FeedForward(nn.Module):
    """SwiGLU: :math:`W_2(\\mathrm{silu}(W_1 x) \\odot W_3 x)` (w1 = gate, w3 = up, w2 = down).

    Gate and up projections are one ``w13`` matrix (rows ``[W_1; W_3]``); the state dict holds ``w1``, ``w3``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w13 = Linear(config.dim, 2 * config.hidden_dim)
        self.w2 = Linear(config.hidden_dim, config.dim)
        parts = {"w1.weight": config.hidden_dim, "w3.weight": config.hidden_dim}
        self.register_load_state_dict_pre_hook(_fuse_on_load(tuple(parts), "w13.weight"))
        self.register_state_dict_post_hook(_split_on_save(parts, "w13.weight"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class TransformerBlock(nn.Module):
    """Pre-norm decoder layer over the residual stream ``x``.

    :math:`h = x + \\mathrm{Attn}(\\mathrm{RMS}(x))`, output :math:`h + \\mathrm{FFN}(\\mathrm{RMS}(h))`.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x, cos, sin, cache_positions, attention_mask, slots=None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, cache_positions, attention_mask, slots)
        return h + self.feed_forward(self.ffn_norm(h))


def visible_slots(mask: torch.Tensor) -> tuple:
    """Per query row of an additive mask (0 = may attend): the number of slots when they are ``0 .. k-1``,
    else the LongTensor of visible slots in slot order (a tree node's ancestors)."""
    rows = []
    for row in mask == 0:
        index = row.nonzero().flatten()
        rows.append(index.numel() if int(index[-1]) == index.numel() - 1 else index)
    return tuple(rows)


def _align_parameters(module: nn.Module, incompatible_keys) -> None:
    """Copy loaded parameters that do not start on a 64-byte boundary (e.g. from a safetensors buffer).

    MKL's GEMM rounds differently on unaligned data (the ``(W x^T)^T`` head differs by ~1e-5 between an
    aligned and an unaligned copy of the same weight), and the same weights must give the same logits.
    """
    for parameter in module.parameters():
        if parameter.device.type == "cpu" and parameter.data_ptr() % 64:
            parameter.data = parameter.data.clone()


class Transformer(nn.Module):
    """A llama-family decoder with a static KV cache, tree attention and early exit.

    Parameters
    ----------
    config : ModelConfig
        The architecture. Parameters are initialised like a freshly built ``nn.Linear``/``nn.Embedding``;
        load real weights with :func:`executor.weights.load_model`.

    Notes
    -----
    State-dict keys: ``tok_embeddings.weight``, ``layers.{i}.attention_norm.weight``,
    ``layers.{i}.attention.{wq,wk,wv,wo}.weight``, ``layers.{i}.ffn_norm.weight``,
    ``layers.{i}.feed_forward.{w1,w2,w3}.weight``, ``norm.weight`` and, only when embeddings are untied,
    ``output.weight``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = None if config.tie_embeddings else Linear(config.dim, config.vocab_size)
        self.cache_slots = 0
        self.cache_batch_size = 0
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None
        # A replacement for layers_and_head (the compiled step of executor.compiled); None runs it eagerly.
        self.step = None
        # Attention one query at a time (Attention._rowwise) when an eager call has several tokens: each row's
        # logits are then bitwise those of a one-token pass, which a quantised model's bfloat16 roundings need.
        self.rowwise_attention = False
        # Weight-only quantisation (executor.quantize): the scheme name, the int8 LM head, and the fingerprint
        # of the float weights it was made from. None for a float model.
        self.quantization: str | None = None
        self.quantized_head: nn.Module | None = None
        self.source_fingerprint: dict | None = None
        self.register_load_state_dict_post_hook(_align_parameters)

    def setup_cache(self, max_seq_len: int | None = None, batch_size: int = 1) -> None:
        """(Re)allocate a zeroed static KV cache of ``max_seq_len`` slots per layer.

        Each layer gets keys and values of shape ``(batch_size, n_kv_heads, max_seq_len, head_dim)`` on the
        parameters' device and dtype. ``max_seq_len`` defaults to ``config.max_seq_len``.
        """
        slots = self.config.max_seq_len if max_seq_len is None else max_seq_len
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"max_seq_len must be a positive integer, got {max_seq_len!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        for layer in self.layers:
            layer.attention.allocate_cache(batch_size, slots, like=self.tok_embeddings.weight)
        self.cache_slots = slots
        self.cache_batch_size = batch_size
        # RoPE cos/sin for every position a cache slot can hold (a plain attribute: run-time state).
        self._rope_table = self._rope_angles(
            torch.arange(max(slots, self.config.max_seq_len), device=self.tok_embeddings.weight.device)
        )

    def forward(
        self,
        tokens: torch.Tensor,
        cache_positions: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        exit_layer: int | None = None,
        return_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run ``tokens`` through the first ``exit_layer`` layers, writing their K/V at ``cache_positions``.

        Parameters
        ----------
        tokens : LongTensor, shape (B, T)
            Token ids; ``B`` must equal the cache's batch size.
        cache_positions : LongTensor, shape (T,)
            KV-cache slot of each token (distinct, in ``[0, max_seq_len)``).
        positions : LongTensor, shape (T,), optional
            RoPE positions; default ``cache_positions``. For a token tree, committed length + depth.
        attention_mask : BoolTensor, shape (T, S), optional
            ``True`` where query ``t`` may attend to cache slot ``s``; the keys are slots ``0 .. S-1``
            (after this call's writes). Default: causal over slots, slot ``s`` visible to query ``t`` iff
            ``s <= cache_positions[t]``, with ``S = max(cache_positions) + 1``. Every row needs one ``True``.
        exit_layer : int, optional
            Run only layers ``[0, exit_layer)`` and then the final norm and LM head (early-exit logits).
            Default: all layers.
        return_hidden : bool
            Also return the hidden state after the last layer run (before the final norm).

        Returns
        -------
        logits : Tensor, shape (B, T, V), float32
        hidden : Tensor, shape (B, T, dim), only if ``return_hidden``
        """
        if self.cache_slots == 0:
            raise ValueError("the KV cache is not allocated; call setup_cache(max_seq_len, batch_size) first")
        self._check_inputs(tokens, cache_positions, positions, attention_mask)
        n_layers = self.config.n_layers if exit_layer is None else exit_layer
        if (
            isinstance(n_layers, bool)
            or not isinstance(n_layers, int)
            or not 0 <= n_layers <= self.config.n_layers
        ):
            raise ValueError(
                f"exit_layer must be an integer in [0, {self.config.n_layers}], got {exit_layer!r}"
            )
        cos, sin = self._rope(cache_positions if positions is None else positions)
        x = self.tok_embeddings(tokens)
        slots, mask = self._additive_mask(cache_positions, attention_mask, attention_dtype(x.dtype, x.device))
        step = self.layers_and_head if self.step is None else self.step
        logits, hidden = step(x, cos, sin, cache_positions, mask, slots, n_layers)
        return (logits, hidden) if return_hidden else logits

    def layers_and_head(self, x, cos, sin, cache_positions, mask, slots: int, n_layers: int):
        """The tensor work of :meth:`forward` after the embedding: ``n_layers`` layers, final norm, LM head.

        Returns ``(logits, hidden)``. :func:`executor.compiled.compile_model` sets ``self.step`` to a compiled
        version of this method, which :meth:`forward` then calls instead. With ``rowwise_attention`` the mask
        becomes :func:`visible_slots` (one attention call per query row), eager only.
        """
        # visible_slots reads the mask's values, which a compiled graph cannot: compiled, several tokens attend
        # under the mask as a float model's do (equal to one-token passes up to round-off, not bit for bit).
        if self.rowwise_attention and isinstance(mask, torch.Tensor) and not torch.compiler.is_compiling():
            mask = visible_slots(mask)
        for layer in self.layers[:n_layers]:
            x = layer(x, cos, sin, cache_positions, mask, slots)
        return self.lm_head(self.norm(x)).float().contiguous(), x

    def lm_head(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits of final-normed hidden states ``(..., dim)``, in the activations' dtype.

        The int8 head of a quantised model (:func:`executor.quantize.quantize_model`), else the output weight
        (the tied embedding by default) through :func:`linear`.
        """
        if self.quantized_head is not None:
            return self.quantized_head(normed)
        if self.output is not None:
            return self.output(normed)
        return product(normed, self.tok_embeddings.weight)

    @staticmethod
    def _additive_mask(cache_positions, attention_mask, dtype) -> tuple[int, torch.Tensor | None]:
        """The number of key slots and the mask as SDPA's additive form (0 or -inf), built once per call.

        ``None`` when every query sees every slot (one new token under the default causal mask): SDPA then
        skips the mask, and the result is the same.
        """
        if attention_mask is None:
            slots = int(cache_positions.max()) + 1
            if cache_positions.numel() == 1:
                return slots, None
            attention_mask = torch.arange(slots, device=cache_positions.device) <= cache_positions[:, None]
        additive = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
        return attention_mask.shape[-1], additive.masked_fill_(~attention_mask, float("-inf"))

    def copy_cache_slots(self, source: torch.Tensor, destination: torch.Tensor) -> None:
        """Copy the K/V of every layer from cache slots ``source`` to slots ``destination`` (both shape (K,)).

        After tree verification, this moves the accepted path's entries into the contiguous slots that follow
        the committed prefix (Medusa's and EAGLE's gather-and-compact ``update_inference_inputs``).
        """
        if self.cache_slots == 0:
            raise ValueError("the KV cache is not allocated; call setup_cache(max_seq_len, batch_size) first")
        for name, index in (("source", source), ("destination", destination)):
            self._check_slots(index, name)
        if source.shape != destination.shape:
            raise ValueError(
                f"source and destination must have the same length, got {tuple(source.shape)} and "
                f"{tuple(destination.shape)}"
            )
        if torch.unique(destination).numel() != destination.numel():
            raise ValueError("destination must not repeat a slot")
        for layer in self.layers:
            layer.attention.kv_cache.copy_slots(source, destination)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos`` and ``sin`` of the RoPE angles at ``positions``, shape (T, head_dim), parameter dtype.

        Rows of the table built by :meth:`setup_cache` when it covers ``positions`` (the same numbers), else
        computed here.
        """
        table = self._rope_table
        weight = self.tok_embeddings.weight
        if (
            table is not None
            and table[0].dtype == weight.dtype
            and table[0].device == positions.device
            and int(positions.max()) < table[0].shape[0]
            and int(positions.min()) >= 0
        ):
            return table[0][positions], table[1][positions]
        return self._rope_angles(positions)

    def _rope_angles(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Angles in float32 (as Hugging Face computes them), then cast to the activations' dtype. The
        # frequencies are recomputed rather than stored, so a model built on the meta device needs no fix-up.
        head_dim = self.config.head_dim
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim
        inverse_frequencies = 1.0 / self.config.rope_theta**exponents
        angles = positions.to(torch.float32)[:, None] * inverse_frequencies[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        dtype = self.tok_embeddings.weight.dtype
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _check_slots(self, index: torch.Tensor, name: str) -> None:
        if not isinstance(index, torch.Tensor) or index.ndim != 1 or index.dtype != torch.long:
            raise ValueError(f"{name} must be a 1-D LongTensor of cache slots")
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.cache_slots):
            raise ValueError(f"{name} must lie in [0, {self.cache_slots}) (the cache size)")

    def _check_inputs(self, tokens, cache_positions, positions, attention_mask) -> None:
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2 or tokens.dtype != torch.long:
            raise ValueError("tokens must be a LongTensor of shape (batch, length)")
        batch, length = tokens.shape
        if length == 0:
            raise ValueError("tokens must contain at least one token")
        if batch != self.cache_batch_size:
            raise ValueError(
                f"tokens has batch size {batch} but the KV cache was set up for {self.cache_batch_size}"
            )
        self._check_slots(cache_positions, "cache_positions")
        if cache_positions.shape != (length,):
            raise ValueError(
                f"cache_positions must have shape ({length},), got {tuple(cache_positions.shape)}"
            )
        if positions is not None and (
            not isinstance(positions, torch.Tensor) or positions.shape != (length,)
        ):
            raise ValueError(f"positions must be a tensor of shape ({length},)")
        if attention_mask is not None:
            if (
                not isinstance(attention_mask, torch.Tensor)
                or attention_mask.dtype != torch.bool
                or attention_mask.ndim != 2
                or attention_mask.shape[0] != length
            ):
                raise ValueError(f"attention_mask must be a BoolTensor of shape ({length}, S)")
            if not 1 <= attention_mask.shape[1] <= self.cache_slots:
                raise ValueError(
                    f"attention_mask covers {attention_mask.shape[1]} slots; it must cover 1 to "
                    f"{self.cache_slots} (the cache size)"
                )
