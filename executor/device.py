"""The hardware a model runs on: device, native bfloat16 support, the default dtype and torch's CPU threads.

Precision is a speed choice, not an accuracy one, for speculative decoding: verification is lossless with
respect to the target distribution the verification pass computes, in whatever precision; plain decoding in the
same precision is the baseline of every speedup. bfloat16 halves the weight traffic, which is what a
memory-bound decoding step pays for, but only where matrix products in bfloat16 are native:

* CUDA GPUs (tensor cores; bfloat16 is the serving default);
* x86 CPUs with the ``avx512_bf16`` instructions (``VDPBF16PS``; Intel Cooper Lake and later, AMD Zen 4 and
  later) or Intel AMX (``amx_bf16`` tiles, Sapphire Rapids and later). oneDNN, which runs torch's CPU
  matrix products, uses them for bfloat16 operands.

Elsewhere (an AVX2-only CPU, say) torch emulates bfloat16 by converting to float32 around every product, which
is slower than float32 itself, so the default there is float32. Detection reads the CPU's flags (Linux
``/proc/cpuinfo``) and torch's dispatch level (``torch.backends.cpu.get_cpu_capability()``: ``"AMX"`` implies
native bfloat16); nothing is guessed from the CPU's model name. Both sources are arguments of
:func:`cpu_has_native_bf16`, so tests can inject any machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from theory._native import cpuinfo as read_cpuinfo

__all__ = [
    "DTYPE_NAMES",
    "HardwareInfo",
    "cpu_flags",
    "cpu_has_native_bf16",
    "default_device",
    "default_dtype",
    "detect_hardware",
    "resolve_dtype",
    "set_threads",
]

#: The dtype names accepted on the command line and by ``dtype=`` arguments ("auto" = :func:`default_dtype`).
DTYPE_NAMES = ("auto", "float32", "bfloat16")

#: CPU flags (as spelled in /proc/cpuinfo) that mean bfloat16 matrix products run natively.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cpu_flags(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> frozenset[str]:
    """The feature flags of the first CPU listed in ``cpuinfo`` (``flags`` on x86 Linux, ``Features`` on ARM).

    Returns an empty set when the file does not exist or lists no flags (macOS, Windows).
    """
    fields = read_cpuinfo(cpuinfo)
    return frozenset(fields.get("flags", fields.get("Features", "")).split())


def cpu_has_native_bf16(flags: Iterable[str] | None = None, capability: str | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (``avx512_bf16`` or AMX).

    Parameters
    ----------
    flags : iterable of str, optional
        CPU feature flags; default :func:`cpu_flags` of ``/proc/cpuinfo``.
    capability : str, optional
        torch's CPU dispatch level (``"DEFAULT"``, ``"AVX2"``, ``"AVX512"``, ``"AMX"``, ...); default
        ``torch.backends.cpu.get_cpu_capability()``. ``"AMX"`` means AMX tiles, which include bfloat16.
        ``"AVX512"`` alone does not imply ``avx512_bf16``, so the flags decide then.
    """
    flags = cpu_flags() if flags is None else frozenset(flags)
    if capability is None:
        capability = torch.backends.cpu.get_cpu_capability()
    return bool(flags & NATIVE_BF16_FLAGS) or capability.upper().startswith("AMX")


@dataclass(frozen=True)
class HardwareInfo:
    """What :func:`detect_hardware` found: CUDA, the CPU's dispatch level and native bfloat16."""

    cuda: bool
    cpu_capability: str
    cpu_native_bf16: bool
    cpu_count: int

    def summary(self) -> dict:
        return {
            "cuda": self.cuda,
            "cpu_capability": self.cpu_capability,
            "cpu_native_bf16": self.cpu_native_bf16,
            "cpu_count": self.cpu_count,
        }


def detect_hardware(
    *,
    cuda_available: Callable[[], bool] = torch.cuda.is_available,
    flags: Iterable[str] | None = None,
    capability: str | None = None,
) -> HardwareInfo:
    """Detect CUDA, torch's CPU dispatch level and native bfloat16 (each source injectable for tests)."""
    if capability is None:
        capability = torch.backends.cpu.get_cpu_capability()
    return HardwareInfo(
        cuda=bool(cuda_available()),
        cpu_capability=capability,
        cpu_native_bf16=cpu_has_native_bf16(flags, capability),
        cpu_count=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
    )


def default_device(hardware: HardwareInfo | None = None) -> torch.device:
    """``cuda`` when present, else ``cpu``."""
    hardware = detect_hardware() if hardware is None else hardware
    return torch.device("cuda" if hardware.cuda else "cpu")


def default_dtype(
    device: str | torch.device | None = None, hardware: HardwareInfo | None = None
) -> torch.dtype:
    """bfloat16 on CUDA and on CPUs with native bfloat16 (:func:`cpu_has_native_bf16`), float32 otherwise.

    ``device`` defaults to :func:`default_device`; ``hardware`` to :func:`detect_hardware`.
    """
    hardware = detect_hardware() if hardware is None else hardware
    device = default_device(hardware) if device is None else torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16
    if device.type == "cpu":
        return torch.bfloat16 if hardware.cpu_native_bf16 else torch.float32
    return torch.float32


def resolve_dtype(
    dtype: str | torch.dtype | None,
    device: str | torch.device | None = None,
    *,
    name: str = "dtype",
    hardware: HardwareInfo | None = None,
) -> torch.dtype:
    """``"float32"``, ``"bfloat16"``, a floating ``torch.dtype``, or ``"auto"``/``None`` (:func:`default_dtype`).

    Raises ``ValueError`` naming ``name`` for anything else.
    """
    if dtype is None or (isinstance(dtype, str) and dtype == "auto"):
        return default_dtype(device, hardware)
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating dtype, got {dtype}")
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ValueError(
        f"{name} must be one of {', '.join(DTYPE_NAMES)} or a floating torch.dtype, got {dtype!r}"
    )


def run_dtype_name(dtype: str | torch.dtype | None, model=None, *, name: str = "dtype") -> str:
    """The dtype a run uses, by name (``"float32"``, ``"bfloat16"``): a given ``model``'s own, else ``dtype``
    resolved by :func:`resolve_dtype` (``"auto"`` becomes this machine's default). Run directories record
    this name, so their fingerprint says what ran rather than ``"auto"``."""
    resolved = model.tok_embeddings.weight.dtype if model is not None else resolve_dtype(dtype, name=name)
    return str(resolved).removeprefix("torch.")


def set_threads(requested: int | None = None, *, name: str = "threads") -> int:
    """Set torch's CPU threads to ``requested``, or to the cores this process may run on; returns the count.

    Every command that runs a model calls this once, so thread use is a deliberate, uniform choice (torch's
    own default counts physical cores of the whole machine, not the cores this process is allowed to use).
    """
    if requested is None:
        requested = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {requested!r}")
    torch.set_num_threads(requested)
    return requested
