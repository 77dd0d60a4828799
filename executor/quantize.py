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
from torch import nn

__all__ = [
    "QUANTIZE_NAMES",
    "Int8Linear",
    "int8_linear",
    "int8_unsupported_reason",
    "quantize_int8",
    "quantize_model",
    "resolve_quantize",
]

#: The ``quantize=`` values (and ``--quantize`` choices): ``"none"`` keeps float weights.
QUANTIZE_NAMES = ("none", "int8")

_PROBED: dict[str, str | None] = {}


def resolve_quantize(quantize: str | None, *, name: str = "quantize") -> str | None:
    """``None`` or ``"none"`` -> ``None`` (float weights); ``"int8"`` -> ``"int8"``; ``ValueError`` otherwise."""
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


def quantize_model(model, quantize: str = "int8"):
    """Quantise ``model`` (an :class:`executor.model.Transformer`) in place; returns it.

    The layers' ``wqkv``, ``wo``, ``w13``, ``w2`` become :class:`Int8Linear`; ``model.quantized_head`` holds an
    int8 copy of the LM head (used by :meth:`~executor.model.Transformer.lm_head`); the embedding, norms and
    activations keep their dtype. ``model.quantization`` becomes ``"int8"``, and ``model.source_fingerprint``
    keeps :func:`executor.training.model_fingerprint` of the float weights, so trained drafters cached for the
    float model are found for its int8 version (same weights, quantised).

    Raises ``ValueError`` for an unknown ``quantize``, an already quantised model, or a device/torch without
    the int8 kernel (one line saying why).
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
    reason = int8_unsupported_reason(device)
    if reason is not None:
        raise ValueError(
            f"quantize='int8' is not supported on {device.type} with torch {torch.__version__}: {reason}"
        )
    fingerprint = model_fingerprint(model)
    with torch.no_grad():
        for layer in model.layers:
            attention, feed_forward = layer.attention, layer.feed_forward
            attention.wqkv = Int8Linear(attention.wqkv.weight)
            attention.wo = Int8Linear(attention.wo.weight)
            feed_forward.w13 = Int8Linear(feed_forward.w13.weight)
            feed_forward.w2 = Int8Linear(feed_forward.w2.weight)
        head = model.tok_embeddings.weight if model.output is None else model.output.weight
        model.quantized_head = Int8Linear(head)
    model.quantization = scheme
    model.source_fingerprint = fingerprint
    return model
