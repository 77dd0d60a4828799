"""The model's matrix products :math:`x W^T` on few rows of activations, chosen by measurement on the CPU.

:func:`linear` picks among MKL formulations (docs/benchmarks/model_forward.md); :func:`packed_linear` runs
float32 products on oneDNN's blocked weight layout: one weight read for a few rows of activations.

A decoding step multiplies 1-64 rows of activations by every weight of the model, and at these sizes the
product is bound by reading the weights. MKL's GEMM behind ``F.linear`` reads them at 15 GB/s for one row on
one core, and takes about twice as long for 2-8 rows as for one (a float32 forward over 4 tokens cost 1.55
one-token forwards). oneDNN's inner-product primitive on a weight reordered once into its blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``) runs on every core and shares the weight read across rows.
Measured on SmolLM2-135M's 121 products per forward (AMD EPYC Zen 3, 2 threads, ``experiments.bench_products``,
docs/benchmarks/model_forward.md): 1 row 24.3 ms against 37.3, 4 rows 31.6 against 71.7, 8 rows 36.8 against
63.9; the whole forward over 4 tokens now costs 1.14 one-token forwards. In bfloat16 on a CPU with
``avx512_bf16`` (AMD EPYC Zen 4, 2 threads): 1 row 15.3 ms against 21.7 for ``F.linear``, 8 rows 17.0 against
33.4, 64 rows 55.2 against 75.2.

Its results do not depend on how many rows share a call (each output row is bitwise the one-row product), so
an n-token verification pass projects exactly as n one-token passes do; they differ from ``F.linear`` by
summation order only (float round-off, ~1e-6 relative). (Where a native kernel runs, products of many rows go
to oneDNN if it measured faster for them, :func:`_onednn_from_rows`; those rows differ from one-row products by
round-off.)

The blocked copy of each weight lives in a weak table keyed on the weight tensor itself: made on first use (or
ahead of it by :func:`prepack`), made again when the weight changes in place (its ``Tensor._version``; an
inference tensor has none, :func:`tensor_version`) or its storage is replaced, freed with the weight; a
deep-copied model packs its own. It costs a second copy of each weight in memory. It is used only
where it is exact to do so and measured to pay: float32 activations and weights on the CPU, or bfloat16 ones
where the CPU multiplies bfloat16 natively (:data:`NATIVE_CPU_BF16`; emulated, oneDNN's bfloat16 product costs
about a matrix-vector product per row, and :func:`linear` upcasts blocks instead), weights of at least
:data:`MIN_PACKED_ELEMENTS` entries, no autograd, and where oneDNN has the primitive (x86 builds of torch);
anywhere else :func:`linear` runs. ``SPECBOUND_PACKED=0`` in the environment turns it off.

The product is the operator ``torch.ops.specbound.packed_linear`` (:func:`packed_linear`), so ``torch.compile``
keeps it as one opaque call in the compiled graph (:mod:`executor.compiled`) and fuses the element-wise work
around it; the operator looks the blocked copy up when it runs, so a compiled graph sees every change of the
weight too.

**Native products.** On CPUs with AVX-512 (float32) or AVX512-BF16 (bfloat16), the packed products run on two
small C++ kernels instead of oneDNN's (``executor/csrc/f32_linear.cpp`` and ``bf16_linear.cpp``,
:data:`NATIVE_KERNELS`): the weight is copied once into a layout of 16 output rows per 64-byte load (bfloat16 also
keeps pairs of inputs together, as VDPBF16PS reads them; :func:`_native_copy`), each thread streams its share of
it, and one FMA or VDPBF16PS adds to 16 float32 accumulators (bfloat16 outputs rounded once; how many blocks share
a pass, 4 or 6, is measured once per CPU and build: :func:`_native_group`). There is no fixed
cost of ~20-25 us a call and no horizontal sum: SmolLM2's 121 products a token took 7.4 ms in bfloat16 against
12.6 on oneDNN's packed weights for one row (11.4 against 13.8 for 8 rows), and 16.6 against 23.9 in float32
(AMD EPYC Zen 4, 2 threads, idle). Each output is one sum in a fixed order, so rows stay bitwise independent of
how many share a call. A kernel passes over the weights once per 8 rows, so from a row count measured once per
CPU (:func:`_onednn_from_rows`; 9 in bfloat16 and 32 in float32 on an Intel Xeon with AMX, whose tiles
multiply 9-64 rows in about the time of one) oneDNN's packed product runs instead. Each kernel is compiled
with ``torch.utils.cpp_extension`` on first use (10-30 s once per machine, cached by torch; needs a C++
compiler and ninja) and checked on a probe product; where either fails, one line says why and oneDNN runs.
``SPECBOUND_NATIVE=0`` turns them off.

**Per-call cost.** A forward makes 121 products, and the Python between two kernels costs more than its own time
(the kernels' OpenMP threads go idle in the gaps). The first product by a weight records a plan (its packed copy
and kernel) that later products reuse after checking only the weight's identity, data pointer, version and
layout, the activations' dtype and device and the grad mode: a bfloat16 forward of SmolLM2 takes 0.89-0.94 of
its former time, interleaved (docs/benchmarks/model_forward.md). The two environment variables are read once, at
import; :func:`switches` changes them in a running process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import statistics
import sys
import time
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from executor.files import write_json
from theory._native import cpuinfo as _cpuinfo  # the first processor's fields of /proc/cpuinfo

__all__ = [
    "NATIVE_CPU_BF16",
    "linear",
    "native_available",
    "packed_linear",
    "packing_applies",
    "packing_available",
    "prepack",
    "product",
]

#: The reorder's batch-size hint: measured best for 1-32 rows (1 row 24.3 ms with the hint 8, 26.7 with 1).
BATCH_HINT = 8
#: Smallest weight worth packing. A oneDNN call has a fixed cost of ~20 us here, so MKL's product wins on small
#: weights (one row, cache-resident: 128x64 3.4 against 25.8 us, 512x256 17 against 35 us; 1536x576 79 against
#: 76 us); every weight of SmolLM2 (the smallest is 576x576) is above it, a test model's are below.
MIN_PACKED_ELEMENTS = 1 << 18

_AVAILABLE: bool | None = None
_LINEAR_POINTWISE = getattr(getattr(torch.ops.mkldnn, "_linear_pointwise", None), "default", None)

# Whether the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX); without it, oneDNN's bfloat16 GEMM costs
# about one matrix-vector product per row of activations.
NATIVE_CPU_BF16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
_UPCAST_BLOCK_ROWS = 4096  # a float32 block of 4096 x 576 (9 MB) stays in the L3 cache

#: Whether the packed products and the native kernels may run: ``SPECBOUND_PACKED`` / ``SPECBOUND_NATIVE`` (``0``
#: turns one off), read at import so that no product reads the environment (two reads a product cost 3% of a
#: bfloat16 forward); :func:`switches` changes them.
_SWITCHES = {
    "packed": os.environ.get("SPECBOUND_PACKED", "1") != "0",
    "native": os.environ.get("SPECBOUND_NATIVE", "1") != "0",
}


@contextlib.contextmanager
def switches(*, packed: bool | None = None, native: bool | None = None):
    """Context in which the packed products (``packed``) and the native kernels (``native``) are on or off
    (``None``: as they are), for comparisons in one process; the previous state returns on exit."""
    before = dict(_SWITCHES)
    try:
        for name, value in (("packed", packed), ("native", native)):
            if value is not None:
                _SWITCHES[name] = bool(value)
        _PLANS.clear()
        yield
    finally:
        _SWITCHES.update(before)
        _PLANS.clear()


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
    """Whether this torch build reorders and multiplies float32 weights with oneDNN (tried once, then cached).

    While ``torch.compile`` traces, the probe cannot run (the oneDNN operators have no shape functions), so an
    untried build counts as unavailable there; :func:`executor.compiled.compile_model` tries it first.
    """
    global _AVAILABLE
    if not _SWITCHES["packed"]:
        return False
    if _AVAILABLE is None and not torch.compiler.is_compiling():
        try:
            probe = torch.ops.mkldnn._reorder_linear_weight(torch.ones(2, 2), BATCH_HINT)
            out = _LINEAR_POINTWISE(torch.ones(1, 2), probe, None, "none", [], "")
            _AVAILABLE = bool(torch.backends.mkldnn.is_available()) and out.tolist() == [[2.0, 2.0]]
        except (RuntimeError, AttributeError, NotImplementedError, TypeError):
            _AVAILABLE = False
    return bool(_AVAILABLE)


def packing_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x W^T`` should run on the packed copy of ``weight`` (see the module docstring)."""
    return (
        x.dtype == weight.dtype
        and (weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and NATIVE_CPU_BF16))
        and weight.numel() >= MIN_PACKED_ELEMENTS
        and x.device.type == "cpu"
        and weight.device.type == "cpu"
        and not torch.is_grad_enabled()
        and packing_available()
    )


def product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """:math:`x W^T`: on the packed copy where :func:`packing_applies`, else by :func:`linear`.

    Where a plan of ``weight`` (:class:`_Plan`) is current, its few checks stand in for :func:`packing_applies`."""
    if not torch.compiler.is_compiling():  # a compiled graph calls the operator (packed_linear) instead
        plan = _PLANS.get(id(weight))
        if (
            plan is not None
            and plan.weight() is weight
            and plan.key == tensor_key(weight)
            and x.dtype is plan.dtype
            and x.is_cpu
            and not torch.is_grad_enabled()
        ):
            return _packed_linear_cpu(x, weight, plan)
    return packed_linear(x, weight) if packing_applies(x, weight) else linear(x, weight)


#: dtype -> (kernel source in ``csrc/``, the CPU flags it needs, the compiler flags, its operator's name).
NATIVE_KERNELS = {
    torch.bfloat16: (
        "bf16_linear.cpp",
        ("avx512f", "avx512bw", "avx512vl", "avx512_bf16"),
        ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16"),
        "specbound_native::bf16_linear",
    ),
    torch.float32: ("f32_linear.cpp", ("avx512f",), ("-mavx512f",), "specbound_native_f32::f32_linear"),
}
_NATIVE: dict = {}  # dtype -> its loaded operator, or None where it is not offered or failed (tried once)
#: Group sizes of the native kernels (blocks of 16 outputs that share each pass over the inputs). Which is faster
#: depends on the CPU and no output bit does (docs/bench.md: on an Intel Xeon with AMX G = 6 was 3.5-11% faster
#: than 4 at 1-8 rows in bfloat16 and 1.7-6% in float32; 4 was chosen on an AMD Zen 4), so it is measured on each CPU
#: (:func:`_native_group`).
NATIVE_GROUPS = (4, 6)


def native_available(dtype: torch.dtype) -> bool:
    """Whether the native kernel for ``dtype`` runs here: the CPU has its instructions and it built (tried once).

    While ``torch.compile`` traces nothing is built; :func:`executor.compiled.compile_model` tries it first.
    """
    return _native_op(dtype) is not None


def _native_op(dtype: torch.dtype):
    """The native operator for ``dtype`` (built and probed on the first call), or ``None``."""
    if not _SWITCHES["native"] or dtype not in NATIVE_KERNELS:
        return None
    if dtype not in _NATIVE and not torch.compiler.is_compiling():
        _NATIVE[dtype] = _load_native(dtype) if _cpu_has(NATIVE_KERNELS[dtype][1]) else None
    return _NATIVE.get(dtype)


def _cpu_has(flags) -> bool:
    # Not Linux: no flags, and the kernels are not offered.
    return set(flags) <= set(_cpuinfo().get("flags", "").split())


def _load_native(dtype: torch.dtype):
    """Build (or load from torch's cache) the kernel for ``dtype`` and probe it: its operator, or ``None``."""
    from torch.utils import cpp_extension

    source, _, flags, operator_name = NATIVE_KERNELS[dtype]
    path = Path(__file__).with_name("csrc") / source
    label = f"native {str(dtype).removeprefix('torch.')} product"
    # torch looks for ninja on PATH; the ninja wheel puts it next to this interpreter.
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    try:
        # The build is cached under a name that changes with the kernel's source and the headers it includes.
        parts = [path, *sorted(path.parent.glob("*.h"))]
        digest = hashlib.sha256(b"".join(part.read_bytes() for part in parts)).hexdigest()[:12]
        name = f"specbound_{path.stem}_{digest}"
        build = Path(cpp_extension._get_build_directory(name, verbose=False))
        if not (build / f"{name}.so").is_file():
            print(f"specbound: building the {label} (once per machine, ~30 s)", file=sys.stderr)
        cpp_extension.load(
            name=name,
            sources=[str(path)],
            # OpenMP: ATen's parallel_for is inline, and serial in code compiled without it.
            extra_cflags=["-O3", *flags, "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            verbose=False,
        )
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(3, 70, generator=generator).to(dtype)
        weight = torch.randn(21, 70, generator=generator).to(dtype)
        expected = (x.double() @ weight.double().T).to(dtype)
        namespace, name = operator_name.split("::")
        operator = getattr(getattr(torch.ops, namespace), name)
        if not torch.allclose(
            operator(x, _native_copy(weight), weight.shape[0]), expected, rtol=1e-2, atol=1e-2
        ):
            raise RuntimeError("its probe product disagrees with float64")
        group = _native_group(operator, dtype, cache=build / "group.json")
        onednn_rows = _onednn_from_rows(operator, dtype, group, cache=build / "rows.json")
        raw = operator

        def operator(x, packed, out_features):
            return raw(x, packed, out_features, group)

        operator.group = group
        operator.onednn_rows = onednn_rows
    except Exception as error:  # no source, compiler or ninja, a failed probe: oneDNN's product instead
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"specbound: the {label} is unavailable ({reason}); using oneDNN", file=sys.stderr)
        return None
    return operator


#: What :func:`_native_group` times: 8 of SmolLM2-135M's layers (fused q/k/v, output, fused gate/up, down) and its
#: LM head, 112 MB in bfloat16: larger than a CPU's caches, as a forward's weights are.
TUNING_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 8 + [(49152, 576)]


def _native_group(operator, dtype: torch.dtype, repeats: int = 5, cache: Path | None = None) -> int:
    """The ``dtype`` kernel's group size: ``SPECBOUND_NATIVE_GROUP`` when set, else the faster of
    :data:`NATIVE_GROUPS` on the products of :data:`TUNING_SHAPES` at 1 and 3 rows, interleaved, medians of
    ``repeats`` after one warm-up round; a larger group only when it is 2% faster. The measurement (about 0.5 s in
    bfloat16, 0.6 s in float32) is kept in ``cache`` (next to the built kernel) for this CPU, named by its model and
    flags, so it runs once per machine and kernel build, as the build does."""
    forced = os.environ.get("SPECBOUND_NATIVE_GROUP")
    if forced is not None:
        if forced not in {str(g) for g in NATIVE_GROUPS}:
            raise ValueError(f"SPECBOUND_NATIVE_GROUP must be one of {NATIVE_GROUPS}, got {forced!r}")
        return int(forced)
    return _measured_for_this_cpu(
        cache, "group", lambda: _measure_group(operator, dtype, repeats), lambda value: value in NATIVE_GROUPS
    )


def _measured_for_this_cpu(cache: Path | None, key: str, measure, valid):
    """``measure()``'s ``(value, seconds)``'s value, kept in the JSON ``cache`` under ``key`` for this CPU (named by
    its model and flags): a cache of another CPU, an invalid value or an unreadable file is measured again."""
    cpu = _cpuinfo()
    identity = hashlib.sha256(f"{cpu.get('model name')}|{cpu.get('flags')}".encode()).hexdigest()[:16]
    if cache is not None:
        try:
            saved = json.loads(cache.read_text())
            if saved.get("cpu") == identity and key in saved and valid(saved[key]):
                return saved[key]
        except (OSError, ValueError, AttributeError):  # none yet, or unreadable: measure again
            pass
    value, seconds = measure()
    if cache is not None:
        try:
            write_json({"cpu": identity, key: value, "seconds": seconds}, cache)
        except OSError:  # a read-only build directory: the next process measures again
            pass
    return value


def _measure_group(operator, dtype: torch.dtype, repeats: int):
    generator = torch.Generator().manual_seed(0)
    packed = [
        (_native_copy(torch.randn(shape, generator=generator).to(dtype)), shape) for shape in TUNING_SHAPES
    ]
    inputs = {
        k: torch.randn(3, k, generator=generator).to(dtype)
        for k in sorted({shape[1] for shape in TUNING_SHAPES})
    }
    times = {group: [] for group in NATIVE_GROUPS}
    with torch.no_grad():
        for _ in range(repeats + 1):
            for group in NATIVE_GROUPS:
                start = time.perf_counter()
                for rows in (1, 3):
                    for weight, (out_features, in_features) in packed:
                        operator(inputs[in_features][:rows], weight, out_features, group)
                times[group].append(time.perf_counter() - start)
    medians = {group: statistics.median(values[1:]) for group, values in times.items()}
    best = NATIVE_GROUPS[0]
    for group in NATIVE_GROUPS[1:]:
        if medians[group] < 0.98 * medians[best]:
            best = group
    return best, medians


#: Row counts at which :func:`_onednn_from_rows` times the native kernel against oneDNN's packed product.
ROW_CANDIDATES = (9, 16, 32, 64)


def _onednn_from_rows(operator, dtype: torch.dtype, group: int, repeats: int = 3, cache: Path | None = None):
    """From how many rows of activations oneDNN's packed product is faster than the ``dtype`` kernel: the
    smallest of :data:`ROW_CANDIDATES` from which oneDNN is 2% faster at every larger candidate too, or ``None``
    (the native kernel always). ``SPECBOUND_ONEDNN_ROWS`` (an integer >= 2, or ``never``) sets it instead.

    The native kernel passes over the weights once per 8 rows, oneDNN once; where oneDNN multiplies on AMX tiles
    it runs 9-64 rows in about the time of one (Intel Xeon with AMX, bfloat16, the 121 products of SmolLM2:
    64 rows 28.6 ms against 101 native, 9 rows 20.1 against 23.5; 8 rows 20.9 against 19.9), so prefills and
    trees of more than 8 tokens run there. Timed on :data:`TUNING_SHAPES`, interleaved, medians of ``repeats``
    after one warm-up round; kept in ``cache`` for this CPU like the group size (about 1 s once).
    """
    forced = os.environ.get("SPECBOUND_ONEDNN_ROWS")
    if forced is not None:
        if forced == "never":
            return None
        if not forced.isdigit() or int(forced) < 2:
            raise ValueError(f"SPECBOUND_ONEDNN_ROWS must be an integer >= 2 or 'never', got {forced!r}")
        return int(forced)
    if not packing_available():
        return None
    return _measured_for_this_cpu(
        cache,
        "onednn_rows",
        lambda: _measure_onednn_rows(operator, dtype, group, repeats),
        lambda value: value is None or (isinstance(value, int) and value >= 2),
    )


def _measure_onednn_rows(operator, dtype: torch.dtype, group: int, repeats: int):
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(shape, generator=generator).to(dtype) for shape in TUNING_SHAPES]
    native = [_native_copy(w) for w in weights]
    blocked = [torch.ops.mkldnn._reorder_linear_weight(w, BATCH_HINT) for w in weights]
    widths = {w.shape[1] for w in weights}
    inputs = {k: torch.randn(max(ROW_CANDIDATES), k, generator=generator).to(dtype) for k in widths}
    times = {(rows, kind): [] for rows in ROW_CANDIDATES for kind in ("native", "onednn")}
    with torch.no_grad():
        for _ in range(repeats + 1):
            for rows in ROW_CANDIDATES:
                start = time.perf_counter()
                for weight, packed in zip(weights, native, strict=True):
                    operator(inputs[weight.shape[1]][:rows], packed, weight.shape[0], group)
                times[rows, "native"].append(time.perf_counter() - start)
                start = time.perf_counter()
                for weight, reordered in zip(weights, blocked, strict=True):
                    _LINEAR_POINTWISE(inputs[weight.shape[1]][:rows], reordered, None, "none", [], "")
                times[rows, "onednn"].append(time.perf_counter() - start)
    medians = {f"{rows} {kind}": statistics.median(values[1:]) for (rows, kind), values in times.items()}
    faster = [medians[f"{rows} onednn"] < 0.98 * medians[f"{rows} native"] for rows in ROW_CANDIDATES]
    start = len(faster)
    while start > 0 and faster[start - 1]:
        start -= 1
    return (ROW_CANDIDATES[start] if start < len(faster) else None), medians


def packed_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """:math:`x W^T` for ``x`` ``(..., in)`` on the blocked copy of the CPU ``weight`` ``(out, in)`` (float32 or
    bfloat16, ``x`` of the same dtype).

    Under ``torch.compile`` it is the operator ``torch.ops.specbound.packed_linear``, one opaque call in the
    compiled graph; eager code calls its kernel directly (the dispatcher's round trip costs ~12 us a call).
    """
    if torch.compiler.is_compiling():
        return torch.ops.specbound.packed_linear(x, weight)
    return _packed_linear_cpu(x, weight)


# weight -> ((data pointer, version, shape, stride), its storage, blocked copy). Keyed weakly on the tensor object
# itself (a compiled graph passes the module's own Parameter to the operator), so a freed model frees its copies
# and a deep copy packs its own. Holding the storage keeps its address from being reused by a replacement
# (``.data =``), so an equal data pointer means the same memory.
_PACKED = WeakIdKeyDictionary()
_PACKED_NATIVE = WeakIdKeyDictionary()


def tensor_version(tensor: torch.Tensor) -> int | None:
    """The tensor's in-place version counter, or ``None`` for an inference tensor (made under
    ``torch.inference_mode``), which has none: such a weight cannot be changed in place outside inference mode,
    and a change inside it is not seen by the copies made from it."""
    return None if tensor.is_inference() else tensor._version


def tensor_key(tensor: torch.Tensor) -> tuple:
    """What changes when a tensor is changed in place (its version) or its storage replaced (``.data =``): the
    key of the packed copies and plans here, and of :func:`executor.training.model_fingerprint`'s cache."""
    return (tensor.data_ptr(), tensor_version(tensor), tensor.shape, tensor.stride())


def _cached_copy(table: WeakIdKeyDictionary, weight: torch.Tensor, pack) -> torch.Tensor:
    entry = table.get(weight)
    key = tensor_key(weight)
    if entry is None or entry[0] != key:
        entry = (key, weight.untyped_storage(), pack(weight.detach().contiguous()))
        table[weight] = entry
    return entry[2]


def _blocked_copy(weight: torch.Tensor) -> torch.Tensor:
    return _cached_copy(_PACKED, weight, lambda w: torch.ops.mkldnn._reorder_linear_weight(w, BATCH_HINT))


def _native_copy(weight: torch.Tensor) -> torch.Tensor:
    """The native kernels' layouts, rows padded to a multiple of 16: bfloat16 ``packed[b, p, j, t] =
    W[16 b + j, 2 p + t]`` (pairs of inputs, as VDPBF16PS reads them), float32 ``packed[b, k, j] = W[16 b + j, k]``."""

    def pack(w: torch.Tensor) -> torch.Tensor:
        rows = -(-w.shape[0] // 16) * 16
        padded = F.pad(w, (0, 0, 0, rows - w.shape[0])).view(rows // 16, 16, w.shape[1])
        if w.dtype == torch.bfloat16:
            return padded.view(rows // 16, 16, w.shape[1] // 2, 2).permute(0, 2, 1, 3).contiguous()
        return padded.permute(0, 2, 1).contiguous()

    return _cached_copy(_PACKED_NATIVE, weight, pack)


def _native_op_for(weight: torch.Tensor):
    """The native operator that multiplies by ``weight`` (bfloat16 needs an even width), or ``None``."""
    operator = _native_op(weight.dtype)
    return operator if weight.dtype != torch.bfloat16 or weight.shape[1] % 2 == 0 else None


def prepack(*weights: torch.Tensor) -> None:
    """Make each weight's packed copy now where inference products by it run packed (:func:`packing_applies`,
    whatever the grad mode), so that the first product does not pay for the copy: a drafter built for one
    generation packs its head when it is built, not in the generation's first step."""
    for weight in weights:
        with torch.no_grad():
            if not packing_applies(weight[:1], weight):
                continue
        operator = _native_op_for(weight)
        if operator is not None:
            _native_copy(weight)
        if operator is None or operator.onednn_rows is not None:
            _blocked_copy(weight)


class _Plan:
    """How products by one weight run while it is unchanged (:func:`product`): the key it was made for, its
    dtype, the native operator (or ``None``) and its copy, the element count of activations from which oneDNN
    runs instead, and oneDNN's copy."""

    __slots__ = ("weight", "key", "dtype", "operator", "native", "native_below", "blocked")

    def __init__(self, weight: torch.Tensor) -> None:
        identity = id(weight)

        def forget(reference, identity=identity) -> None:  # the weight is freed: its id may be reused
            if getattr(_PLANS.get(identity), "weight", None) is reference:
                del _PLANS[identity]

        self.weight = weakref.ref(weight, forget)
        self.key = tensor_key(weight)
        self.dtype = weight.dtype
        self.operator = _native_op_for(weight)
        self.native = None  # its copy, made by the first product that runs natively
        self.blocked = None  # oneDNN's copy, made by the first product that runs there
        rows = None if self.operator is None else self.operator.onednn_rows
        self.native_below = float("inf") if rows is None else rows * weight.shape[1]


#: id(weight) -> its current :class:`_Plan`; an entry leaves with its weight, and :func:`switches` clears all.
_PLANS: dict[int, _Plan] = {}


def _packed_linear_cpu(x: torch.Tensor, weight: torch.Tensor, plan: _Plan | None = None) -> torch.Tensor:
    if plan is None:
        # From the checked path or a compiled graph: the weight's plan, made where it is not current.
        plan = _PLANS.get(id(weight))
        if plan is None or plan.weight() is not weight or plan.key != tensor_key(weight):
            plan = _PLANS[id(weight)] = _Plan(weight)
    if plan.operator is not None and x.numel() < plan.native_below:
        if plan.native is None:
            plan.native = _native_copy(weight)
        return plan.operator(x, plan.native, weight.shape[0])
    # oneDNN's own fixed cost is ~25 us a call; this wrapper adds a few (the overload resolved once, no reshape
    # of 2-D activations), which matters over a forward's 121 calls.
    rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    if plan.blocked is None:
        plan.blocked = _blocked_copy(weight)
    out = _LINEAR_POINTWISE(rows.contiguous(), plan.blocked, None, "none", [], "")
    return out if x.dim() == 2 else out.view(*x.shape[:-1], weight.shape[0])


def _packed_linear_shape(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


# A plain ``Library`` operator rather than ``torch.library.custom_op``: the latter's Python wrapper cost ~30 us a
# call here, 3.6 ms over a forward's 121 products. "Meta" gives torch.compile the output's shape.
_LIBRARY = torch.library.Library("specbound", "DEF")
_LIBRARY.define("packed_linear(Tensor x, Tensor weight) -> Tensor")
_LIBRARY.impl("packed_linear", _packed_linear_cpu, "CPU")
_LIBRARY.impl("packed_linear", _packed_linear_shape, "Meta")
