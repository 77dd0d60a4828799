"""executor.device: bfloat16 detection from injected CPU flags, the default dtype, dtype names, threads."""

from __future__ import annotations

import pytest
import torch

from executor.device import (
    DTYPE_NAMES,
    HardwareInfo,
    cpu_flags,
    cpu_has_native_bf16,
    default_dtype,
    detect_hardware,
    resolve_dtype,
    run_dtype_name,
    set_threads,
)

EPYC_ZEN2 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\n"
EPYC_ZEN4 = "processor\t: 0\nflags\t\t: fpu avx avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: avx2 avx512f amx_bf16 amx_tile amx_int8\n"


def hardware(cuda=False, bf16=False) -> HardwareInfo:
    return HardwareInfo(cuda=cuda, cpu_capability="AVX2", cpu_native_bf16=bf16, cpu_count=2)


@pytest.mark.parametrize(
    ("text", "native"),
    [(EPYC_ZEN2, False), (EPYC_ZEN4, True), (SAPPHIRE, True), ("processor\t: 0\n", False)],
)
def test_native_bf16_is_read_from_the_cpu_flags(tmp_path, text, native):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    assert cpu_has_native_bf16(cpu_flags(path), capability="AVX2") is native


def test_avx512_without_the_bf16_flag_is_not_native_but_amx_capability_is():
    assert not cpu_has_native_bf16({"avx512f", "avx512bw"}, capability="AVX512")
    assert cpu_has_native_bf16(set(), capability="AMX")


@pytest.mark.parametrize(
    ("text", "flags"),
    [
        # aarch64: Features inside each processor's block
        (
            "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd bf16\n\nprocessor\t: 1\nFeatures\t: fp\n",
            "fp asimd bf16",
        ),
        # 32-bit ARM kernels: Features after the processors' blocks
        (
            "Processor\t: ARMv7 rev 10\nprocessor\t: 0\nBogoMIPS\t: 790\n\nprocessor\t: 1\n\nFeatures\t: swp half neon\n",
            "swp half neon",
        ),
        # x86: the first processor's flags, not the second's
        (EPYC_ZEN2 + "flags\t\t: fpu\n", "fpu sse2 avx avx2 fma"),
    ],
)
def test_cpu_flags_are_the_first_processors_on_x86_and_arm(tmp_path, text, flags):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    assert cpu_flags(path) == frozenset(flags.split())


def test_missing_cpuinfo_gives_no_flags(tmp_path):
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_detect_hardware_uses_the_injected_sources():
    info = detect_hardware(cuda_available=lambda: True, flags={"avx512_bf16"}, capability="AVX512")
    assert info.cuda and info.cpu_native_bf16 and info.cpu_capability == "AVX512"
    info = detect_hardware(cuda_available=lambda: False, flags={"avx2"}, capability="AVX2")
    assert not info.cuda and not info.cpu_native_bf16


def test_default_dtype_is_bf16_on_cuda_and_native_cpus_else_float32():
    assert default_dtype("cuda", hardware(cuda=True)) == torch.bfloat16
    assert default_dtype("cpu", hardware(bf16=True)) == torch.bfloat16
    assert default_dtype("cpu", hardware(bf16=False)) == torch.float32
    assert default_dtype(None, hardware(cuda=True)) == torch.bfloat16  # default device: cuda
    assert default_dtype(None, hardware(cuda=False, bf16=False)) == torch.float32


def test_resolve_dtype_names_auto_and_torch_dtypes():
    assert resolve_dtype("float32") == torch.float32
    assert resolve_dtype("bfloat16") == torch.bfloat16
    assert resolve_dtype(torch.float64) == torch.float64
    assert resolve_dtype("auto", "cpu", hardware=hardware(bf16=True)) == torch.bfloat16
    assert resolve_dtype(None, "cpu", hardware=hardware(bf16=False)) == torch.float32


@pytest.mark.parametrize("bad", ["fp16", "float", "", 32, torch.int64])
def test_resolve_dtype_rejects_bad_values_naming_the_argument(bad):
    with pytest.raises(ValueError, match="--dtype"):
        resolve_dtype(bad, name="--dtype")


def test_a_run_records_the_dtype_that_ran_never_auto():
    from tests.tiny_models import build_tiny_model

    assert run_dtype_name("auto") == str(default_dtype()).removeprefix("torch.")
    assert run_dtype_name("bfloat16") == "bfloat16"
    # A given model decides, whatever was asked for.
    model = build_tiny_model(seed=0, vocab_size=11, n_layers=1, dim=8).to(torch.bfloat16)
    assert run_dtype_name("float32", model) == "bfloat16"
    with pytest.raises(ValueError, match="--dtype"):
        run_dtype_name("half", name="--dtype")


def test_cli_choices_match_the_executor_names():
    from experiments.commands import DTYPE_CHOICES

    assert DTYPE_CHOICES == DTYPE_NAMES


def test_set_threads_sets_torch_and_rejects_bad_counts():
    before = torch.get_num_threads()
    try:
        assert set_threads(1) == 1 and torch.get_num_threads() == 1
        assert set_threads(None) >= 1
    finally:
        torch.set_num_threads(before)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="--threads"):
            set_threads(bad, name="--threads")
