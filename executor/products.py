"""The model's matrix products :math:`x W^T` on few rows of activations, chosen by measurement on the CPU.

:func:`linear` picks among MKL formulations (docs/benchmarks/model_forward.md); :class:`PackedWeight` runs
float32 products on oneDNN's blocked weight layout: one weight read for a few rows of activations.

A decoding step multiplies 1-64 rows of activations by every weight of the model, and at these sizes the
product is bound by reading the weights. MKL's GEMM behind ``F.linear`` reads them at 15 GB/s for one row on
one core, and takes about twice as long for 2-8 rows as for one (a float32 forward over 4 tokens cost 1.55
one-token forwards). oneDNN's inner-product primitive on a weight reordered once into its blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``) runs on every core and shares the weight read across rows.
Measured on SmolLM2-135M's 121 products per forward (AMD EPYC Zen 3, 2 threads, ``experiments.bench_products``,
docs/benchmarks/model_forward.md): 1 row 24.3 ms against 37.3, 4 rows 31.6 against 71.7, 8 rows 36.8 against
63.9; the whole forward over 4 tokens now costs 1.14 one-token forwards.

Its results do not depend on how many rows share a call (each output row is bitwise the one-row product), so
an n-token verification pass projects exactly as n one-token passes do; they differ from ``F.linear`` by
summation order only (float round-off, ~1e-6 relative).

:class:`PackedWeight` keeps the blocked copy next to the module that owns the weight: made on first use and
made again when the weight changes in place (its ``Tensor._version``) or its storage is replaced, never copied by
``copy.deepcopy`` (an opaque oneDNN tensor has no storage; the copy packs its own on first use). It costs a
second copy of each float32 weight in memory. It is used only where it is exact to do so and measured to pay:
float32 activations on the CPU, weights of at least :data:`MIN_PACKED_ELEMENTS` entries, no autograd, not while
``torch.compile`` traces, and where oneDNN has the primitive (x86 builds of torch); anywhere else the caller's
plain product runs. ``SPECBOUND_PACKED=0`` turns it off (for comparisons).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

__all__ = ["NATIVE_CPU_BF16", "PackedWeight", "linear", "packing_available"]

#: The reorder's batch-size hint: measured best for 1-32 rows (1 row 24.3 ms with the hint 8, 26.7 with 1).
BATCH_HINT = 8
#: Smallest weight worth packing. A oneDNN call has a fixed cost of ~20 us here, so MKL's product wins on small
#: weights (one row, cache-resident: 128x64 3.4 against 25.8 us, 512x256 17 against 35 us; 1536x576 79 against
#: 76 us); every weight of SmolLM2 (the smallest is 576x576) is above it, a test model's are below.
MIN_PACKED_ELEMENTS = 1 << 18

_AVAILABLE: bool | None = None

# Whether the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX); without it, oneDNN's bfloat16 GEMM costs
# about one matrix-vector product per row of activations.
NATIVE_CPU_BF16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
_UPCAST_BLOCK_ROWS = 4096  # a float32 block of 4096 x 576 (9 MB) stays in the L3 cache


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """:math:`x W^T` for activations ``x`` of shape ``(..., in)`` and a row-major weight ``W`` (out, in).

    The formulation is chosen by measurement on the CPU (``docs/benchmarks/model_forward.md``); every one
    forms the same products and differs from ``F.linear`` only in summation order (float round-off):

    * one row of activations, or not on the CPU: ``F.linear``;
    * a tall weight (the LM head, ``out >= 8 in``): :math:`(W x^T)^T`, so that MKL sees the 49152 rows as
      the long side of the GEMM (``x @ W.T`` with 2 rows costs twice one row there);
    * bfloat16 with 8 or more rows and no native bfloat16 unit: blocks of ``W`` upcast to float32 and
      multiplied in float32 (bfloat16 products are exact in float32; the sums are float32 either way), then
      rounded to bfloat16 as oneDNN rounds its float32 accumulator.
    """
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] == 1 or x.device.type != "cpu":
        return F.linear(x, weight)
    shape = (*x.shape[:-1], weight.shape[0])
    if weight.dtype == torch.bfloat16 and rows.shape[0] >= 8 and not NATIVE_CPU_BF16:
        columns = rows.float().T
        blocks = [block.float() @ columns for block in weight.split(_UPCAST_BLOCK_ROWS)]
        return torch.cat(blocks).T.to(weight.dtype).reshape(shape)
    if weight.shape[0] >= 8 * weight.shape[1]:
        return (weight @ rows.T).T.reshape(shape)
    return F.linear(x, weight)


def packing_available() -> bool:
    """Whether this torch build reorders and multiplies float32 weights with oneDNN (tried once, then cached)."""
    global _AVAILABLE
    if os.environ.get("SPECBOUND_PACKED", "1") == "0":
        return False
    if _AVAILABLE is None:
        try:
            probe = torch.ops.mkldnn._reorder_linear_weight(torch.ones(2, 2), BATCH_HINT)
            out = torch.ops.mkldnn._linear_pointwise(torch.ones(1, 2), probe, None, "none", [], "")
            _AVAILABLE = bool(torch.backends.mkldnn.is_available()) and out.tolist() == [[2.0, 2.0]]
        except (RuntimeError, AttributeError, NotImplementedError):
            _AVAILABLE = False
    return _AVAILABLE


class PackedWeight:
    """The oneDNN-blocked copy of one weight, kept in step with it (see the module docstring)."""

    def __init__(self) -> None:
        self._packed: torch.Tensor | None = None
        self._key: tuple | None = None

    def __deepcopy__(self, memo) -> PackedWeight:
        return PackedWeight()

    def applies(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether ``x W^T`` should run on the packed copy."""
        return (
            x.dtype == torch.float32
            and weight.dtype == torch.float32
            and weight.numel() >= MIN_PACKED_ELEMENTS
            and x.device.type == "cpu"
            and weight.device.type == "cpu"
            and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
            and packing_available()
        )

    def product(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """:math:`x W^T`: on the packed copy where it :meth:`applies`, else by :func:`linear`."""
        return self.linear(x, weight) if self.applies(x, weight) else linear(x, weight)

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """:math:`x W^T` for ``x`` ``(..., in)`` on the blocked copy of ``weight`` ``(out, in)``."""
        # Replaced (``.data =`` keeps the Parameter but moves the storage) or changed in place: pack again.
        key = (weight.data_ptr(), weight._version, tuple(weight.shape))
        if self._packed is None or self._key != key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), BATCH_HINT)
            self._key = key
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.ops.mkldnn._linear_pointwise(rows, self._packed, None, "none", [], "")
        return out.reshape(*x.shape[:-1], weight.shape[0])
