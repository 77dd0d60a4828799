"""Weight-only int8 quantisation of the target: every linear layer and the LM head, per output channel.

A decoding step on a CPU is bound by memory bandwidth: SmolLM2-135M reads ~540 MB of float32 weights per
forward (the 49152 x 576 LM head alone is 113 MB). Storing the weights in int8 reads a quarter of that, and
torch's ``_weight_int8pack_mm`` kernel multiplies bfloat16 activations by int8 rows without materialising a
float weight, so both one-token decoding and multi-token verification get cheaper (measured in
``docs/benchmarks/int8.md``). This is gpt-fast's ``WeightOnlyInt8QuantHandler`` (pytorch-labs/gpt-fast,
``quantize.py``) and LLM.int8's per-row absmax scaling without its outlier split (Dettmers et al.,
"LLM.int8()", NeurIPS 2022, arXiv 2208.07339).

Quantisation of a weight :math:`W \\in \\mathbb{R}^{m \\times k}`, row :math:`i`:

.. math::  s_i = \\mathrm{bf16}^{\\uparrow}\\big(\\max_j |W_{ij}| / 127\\big), \\qquad
           Q_{ij} = \\mathrm{clamp}\\big(\\mathrm{round}(W_{ij} / s_i), -127, 127\\big) \\in \\mathbb{Z}_8,

with :math:`\\mathrm{bf16}^{\\uparrow}` rounding up to the next bfloat16 (the kernel takes bfloat16 scales; rounding
up keeps every :math:`|W_{ij}| / s_i \\le 127`). The quantised layer computes
:math:`y = \\mathrm{bf16}(x)\\,(Q \\odot s)^T`, rounded to bfloat16, then cast to the activations' dtype.

What is exact: the int8 model *is* the target. Speculative decoding on it is lossless with respect to the
distribution the int8 model computes (its logits, in the dtype of its activations), not with respect to the
float32 model; plain decoding of the same int8 model is the baseline of every speedup. Its agreement with
float32 (top-1, total variation) is measured, not assumed: ``docs/executor.md``.

What is quantised: the fused ``wqkv``, ``wo``, ``w13`` and ``w2`` of every layer become :class:`Int8Linear`,
and an int8 copy of the LM head becomes ``model.quantized_head``. The token embedding stays in the model's
float dtype: a lookup reads only the rows it needs (no bandwidth to save), and drafters that reuse the
target's embedding or LM head rows (feature heads, early-exit calibration) keep reading float weights. The
activations, norms, RoPE, attention and KV cache stay in the model's dtype (``dtype=`` of
:func:`executor.weights.load_model`), so ``dtype`` and ``quantize`` are independent choices.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "QUANTIZE_NAMES",
    "Int8Linear",
    "Q41Linear",
    "int4_unsupported_reason",
    "int8_linear",
    "int8_unsupported_reason",
    "q4_1_blocks",
    "quantize_int8",
    "quantize_model",
    "resolve_quantize",
]

#: The ``quantize=`` values (and ``--quantize`` choices): ``"none"`` keeps float weights; ``"q4_1"`` keeps the
#: GGUF file's own Q4_1 blocks (:class:`Q41Linear`).
QUANTIZE_NAMES = ("none", "int8", "q4_1")

_PROBED: dict[str, str | None] = {}


def resolve_quantize(quantize: str | None, *, name: str = "quantize") -> str | None:
    """``None`` or ``"none"`` -> ``None`` (float weights); ``"int8"``/``"q4_1"`` as given; ``ValueError`` otherwise."""
    if quantize is None or quantize == "none":
        return None
    if isinstance(quantize, str) and quantize in QUANTIZE_NAMES:
        return quantize
    raise ValueError(f"{name} must be one of {', '.join(QUANTIZE_NAMES)}, got {quantize!r}")


def int8_unsupported_reason(device: str | torch.device = "cpu") -> str | None:
    """Why weight-only int8 cannot run on ``device`` with this torch, or ``None`` when it can.

    A probe, not a guess: one tiny ``_weight_int8pack_mm`` product on the device, checked against the float
    product (cached per device type).
    """
    device = torch.device(device)
    if device.type not in _PROBED:
        try:
            x = torch.ones(1, 32, dtype=torch.bfloat16, device=device)
            weight = torch.full((8, 32), 2, dtype=torch.int8, device=device)
            scales = torch.full((8,), 0.5, dtype=torch.bfloat16, device=device)
            out = torch.ops.aten._weight_int8pack_mm(x, weight, scales)
            ok = out.shape == (1, 8) and bool((out.float() == 32.0).all())
            _PROBED[device.type] = None if ok else "_weight_int8pack_mm gives wrong results"
        except (AttributeError, RuntimeError, NotImplementedError) as error:
            first = (str(error).splitlines() or [type(error).__name__])[0]
            _PROBED[device.type] = f"_weight_int8pack_mm is not available: {first}"
    return _PROBED[device.type]


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-row symmetric int8 of a float ``weight`` (out, in): ``(Q int8 (out, in), s bfloat16 (out,))``.

    :math:`s_i` is :math:`\\max_j |W_{ij}| / 127` rounded up to a bfloat16 (1 for an all-zero row) and
    :math:`Q_{ij} = \\mathrm{clamp}(\\mathrm{round}(W_{ij} / s_i), -127, 127)`, so
    :math:`|W_{ij} - s_i Q_{ij}| \\le s_i / 2`.
    """
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2 or not weight.is_floating_point():
        raise ValueError("weight must be a 2-D floating tensor (out_features, in_features)")
    w = weight.detach().float()
    exact = w.abs().amax(dim=1) / 127
    exact = torch.where(exact > 0, exact, torch.ones_like(exact))
    scales = exact.to(torch.bfloat16)
    below = scales.float() < exact
    scales = torch.where(below, torch.nextafter(scales, torch.full_like(scales, float("inf"))), scales)
    q = torch.round(w / scales.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scales


def int8_linear(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """:math:`\\mathrm{bf16}(x)\\,(Q \\odot s)^T` for ``x`` (..., in), int8 ``weight`` (out, in), ``scales`` (out,).

    Computed by ``torch.ops.aten._weight_int8pack_mm`` on bfloat16 activations (with float32 ones the CPU
    kernel is many times slower); the bfloat16 result is cast back to ``x.dtype``.
    """
    rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    out = torch.ops.aten._weight_int8pack_mm(rows, weight, scales.to(torch.bfloat16))
    return out.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


class Int8Linear(nn.Module):
    """A bias-free linear layer with int8 weights and per-row bfloat16 scales (:func:`quantize_int8`).

    Built from a float weight (out, in); buffers ``weight`` (int8) and ``scales`` (bfloat16). ``forward(x,
    rows)`` takes an optional ``slice`` of output rows, like :class:`executor.model.Linear`.
    """

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        q, scales = quantize_int8(weight)
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.register_buffer("weight", q.to(weight.device))
        self.register_buffer("scales", scales.to(weight.device))

    def forward(self, x: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
        if rows is None:
            return int8_linear(x, self.weight, self.scales)
        return int8_linear(x, self.weight[rows], self.scales[rows])

    def dequantized(self) -> torch.Tensor:
        """The float32 weight this layer multiplies by, :math:`Q \\odot s`."""
        return self.weight.float() * self.scales.float()[:, None]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per row"


Q4_1_GROUP = 32  # weights per Q4_1 block (ggml's QK4_1)
_Q4_1_BYTES = 20  # fp16 d, fp16 m, 16 bytes of 4-bit q
_INT4_ROWS = 16  # _convert_weight_to_int4pack_for_cpu packs rows in groups of 16
# ... and interleaves them within blocks of 4 float vectors (32 rows with AVX2, 64 with AVX-512): a row slice
# of the packed weight is a valid packed weight only from a multiple of 64 rows.
_INT4_BLOCK = 64


def q4_1_blocks(raw) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode GGUF Q4_1 data, uint8 (rows, in / 32 * 20): ``(q uint8 (rows, in), d, m float16 (rows, in / 32))``.

    A block is ggml's ``block_q4_1``: float16 ``d``, float16 ``m``, then 16 bytes whose low nibbles are weights
    0-15 and high nibbles weights 16-31; weight :math:`w = d\\,q + m` (ggml's ``dequantize_row_q4_1``).
    """
    import numpy as np

    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.ndim != 2 or raw.shape[1] % _Q4_1_BYTES:
        raise ValueError(f"raw must be uint8 Q4_1 rows of a multiple of {_Q4_1_BYTES} bytes, got {raw.shape}")
    rows, groups = raw.shape[0], raw.shape[1] // _Q4_1_BYTES
    blocks = raw.reshape(rows, groups, _Q4_1_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    packed = blocks[..., 4:]
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(rows, groups * Q4_1_GROUP)
    return torch.from_numpy(q), torch.from_numpy(d.copy()), torch.from_numpy(m.copy())


def int4_unsupported_reason(device: str | torch.device = "cpu") -> str | None:
    """Why the Q4_1 path (``_weight_int4pack_mm_for_cpu``) cannot run on ``device``, or ``None`` (probed once)."""
    device = torch.device(device)
    key = f"int4:{device.type}"
    if key not in _PROBED:
        if device.type != "cpu":
            _PROBED[key] = "_weight_int4pack_mm_for_cpu is a CPU kernel"
        else:
            try:
                q = torch.full((_INT4_ROWS, Q4_1_GROUP), 9, dtype=torch.int32)
                packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
                pairs = torch.tensor([0.5, 1.0]).expand(1, _INT4_ROWS, 2).contiguous()  # w = (9 - 8) 0.5 + 1
                out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                    torch.ones(1, Q4_1_GROUP), packed, Q4_1_GROUP, pairs
                )
                ok = out.shape == (1, _INT4_ROWS) and bool((out == 48.0).all())
                _PROBED[key] = None if ok else "_weight_int4pack_mm_for_cpu gives wrong results"
            except (AttributeError, RuntimeError, NotImplementedError) as error:
                first = (str(error).splitlines() or [type(error).__name__])[0]
                _PROBED[key] = f"_weight_int4pack_mm_for_cpu is not available: {first}"
    return _PROBED[key]


def unsupported_reason(scheme: str, device: str | torch.device) -> str | None:
    """The probe of ``scheme``'s kernel (:func:`int8_unsupported_reason`, :func:`int4_unsupported_reason`)."""
    return int4_unsupported_reason(device) if scheme == "q4_1" else int8_unsupported_reason(device)


class Q41Linear(nn.Module):
    """A bias-free linear layer on a GGUF file's own Q4_1 blocks, through ``_weight_int4pack_mm_for_cpu``.

    The kernel multiplies by :math:`(q - 8)\\,s + z` per group of 32 (gpt-fast's int4 format); a Q4_1 block
    :math:`w = d\\,q + m` is that with :math:`s = d` and :math:`z = m + 8d`. ``s`` and ``z`` are stored in the
    activations' ``dtype``. In float32 ``d`` is exact and, whenever :math:`m + 8d` is exact in float32 (every
    block of the embedded SmolLM2 file), the kernel's weight :math:`(q - 8)\\,d + (m + 8d)` is the one rounding
    of the same real number as ggml's :math:`d\\,q + m`: bitwise the weights ``gguf.quants.dequantize`` gives.
    In bfloat16, ``s`` and ``z`` are rounded to bfloat16.
    Rows are padded with zeros to a multiple of 16 (the kernel's packing).
    """

    def __init__(self, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, dtype=torch.float32) -> None:
        super().__init__()
        rows, columns = q.shape
        if columns % Q4_1_GROUP or d.shape != (rows, columns // Q4_1_GROUP) or m.shape != d.shape:
            raise ValueError(
                f"q, d, m must be (out, in), (out, in / 32) x 2, got {q.shape}, {d.shape}, {m.shape}"
            )
        pad = -rows % _INT4_ROWS
        q = F.pad(q.to(torch.int32), (0, 0, 0, pad))
        d, m = (F.pad(t.float(), (0, 0, 0, pad)) for t in (d, m))
        self.in_features, self.out_features = columns, rows
        self.register_buffer("weight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
        # (in / 32, out, 2): the kernel's scales_and_zeros layout.
        pairs = torch.stack([d, m + 8 * d], dim=-1).transpose(0, 1).contiguous()
        self.register_buffer("scales_and_zeros", pairs.to(dtype))

    def forward(self, x: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
        weight, pairs = self.weight, self.scales_and_zeros
        if rows is not None and rows.step is None and not (rows.start or 0) % _INT4_BLOCK:
            # Whole packing blocks only (rows are interleaved within a block); the extra rows are cut below.
            start, stop = rows.start or 0, min(rows.stop or self.out_features, self.out_features)
            end = min(stop + (-stop % _INT4_BLOCK), weight.shape[0])
            weight, pairs = weight[start:end], pairs[:, start:end].contiguous()
            rows = slice(0, max(stop - start, 0))
        flat = x.reshape(-1, x.shape[-1]).to(pairs.dtype).contiguous()
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, weight, Q4_1_GROUP, pairs)
        out = out[:, : self.out_features] if rows is None else out[:, : self.out_features][:, rows]
        return out.to(x.dtype).reshape(*x.shape[:-1], out.shape[-1])

    def dequantized(self) -> torch.Tensor:
        """The float32 weight (out, in) the kernel multiplies by (one product with the identity)."""
        eye = torch.eye(self.in_features, dtype=self.scales_and_zeros.dtype)
        return self(eye).float().T.contiguous()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, Q4_1 blocks of 32"


def _q4_1_layers(model, blocks: dict) -> int:
    """Swap every linear layer whose weights the file stores as Q4_1 for a :class:`Q41Linear`; returns the count."""
    dtype = model.tok_embeddings.weight.dtype

    def fused(names):
        if not all(name in blocks for name in names):
            return None
        q, d, m = (torch.cat([blocks[name][i] for name in names]) for i in range(3))
        return Q41Linear(q, d, m, dtype)

    swapped = 0
    for i, layer in enumerate(model.layers):
        prefix = f"layers.{i}."
        for owner, attribute, parts in (
            (layer.attention, "wqkv", ("wq", "wk", "wv")),
            (layer.attention, "wo", ("wo",)),
            (layer.feed_forward, "w13", ("w1", "w3")),
            (layer.feed_forward, "w2", ("w2",)),
        ):
            module = "attention." if owner is layer.attention else "feed_forward."
            made = fused([f"{prefix}{module}{part}.weight" for part in parts])
            if made is not None:
                setattr(owner, attribute, made)
                swapped += 1
    head = "tok_embeddings.weight" if model.output is None else "output.weight"
    if head in blocks:
        model.quantized_head = Q41Linear(*blocks[head], dtype)
        swapped += 1
    return swapped


def quantize_model(model, quantize: str = "int8", *, blocks: dict | None = None):
    """Quantise ``model`` (an :class:`executor.model.Transformer`) in place; returns it.

    ``"int8"``: the layers' ``wqkv``, ``wo``, ``w13``, ``w2`` become :class:`Int8Linear` and
    ``model.quantized_head`` an int8 copy of the LM head. ``"q4_1"``: every linear layer (and the LM head) whose
    weights ``blocks`` holds as Q4_1 (``{state-dict name: (q, d, m)}`` from :func:`q4_1_blocks`, as
    :func:`executor.weights.load_model` reads them from a GGUF file) becomes a :class:`Q41Linear`; the others
    stay as they are. The embedding, norms and activations keep their dtype. ``model.quantization`` becomes the
    scheme, and ``model.source_fingerprint`` keeps :func:`executor.training.model_fingerprint` of the float
    weights, so trained drafters cached for the float model are found for its quantised version.

    An int8 model attends one query row at a time (``model.rowwise_attention``): its bfloat16 roundings would
    otherwise turn the float32 round-off between a one-token and an n-token pass into different logits.

    Raises ``ValueError`` for an unknown ``quantize``, an already quantised model, ``"q4_1"`` without Q4_1
    ``blocks``, or a device/torch without the kernel (one line saying why).
    """
    from executor.model import Transformer
    from executor.training.checkpoint import model_fingerprint

    scheme = resolve_quantize(quantize)
    if not isinstance(model, Transformer):
        raise ValueError(f"model must be an executor.model.Transformer, got {type(model).__name__}")
    if scheme is None:
        return model
    if model.quantization is not None:
        raise ValueError(f"model is already quantised ({model.quantization})")
    device = model.tok_embeddings.weight.device
    reason = unsupported_reason(scheme, device)
    if reason is not None:
        raise ValueError(
            f"quantize={scheme!r} is not supported on {device.type} with torch {torch.__version__}: {reason}"
        )
    if scheme == "q4_1" and not blocks:
        raise ValueError(
            "blocks must hold the Q4_1 tensors of a GGUF file for quantize='q4_1' (it keeps the file's own "
            "4-bit blocks; load_model(source, quantize='q4_1') reads them)"
        )
    fingerprint = model_fingerprint(model)
    with torch.no_grad():
        if scheme == "q4_1":
            _q4_1_layers(model, blocks)
        else:
            for layer in model.layers:
                attention, feed_forward = layer.attention, layer.feed_forward
                attention.wqkv = Int8Linear(attention.wqkv.weight)
                attention.wo = Int8Linear(attention.wo.weight)
                feed_forward.w13 = Int8Linear(feed_forward.w13.weight)
                feed_forward.w2 = Int8Linear(feed_forward.w2.weight)
            head = model.tok_embeddings.weight if model.output is None else model.output.weight
            model.quantized_head = Int8Linear(head)
    # bfloat16 roundings (the int8 kernel's, or bfloat16 activations) need one attention call per query row.
    model.rowwise_attention = scheme == "int8" or model.tok_embeddings.weight.dtype != torch.float32
    model.quantization = scheme
    model.source_fingerprint = fingerprint
    return model
