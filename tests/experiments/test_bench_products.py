"""experiments/bench_products.py: every kernel multiplies the same products; the report holds each (rows, kernel)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from executor import products
from experiments import bench_products

needs_onednn = pytest.mark.skipif(not products.packing_available(), reason="this torch build has no oneDNN")


def with_native(names: set, dtype: torch.dtype) -> set:
    """The kernel names, plus ``native`` where the native kernel of ``dtype`` runs on this CPU."""
    return names | ({"native"} if products.native_available(dtype) else set())


@needs_onednn
def test_every_kernel_forms_the_products_of_f_linear():
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(48, 16, generator=generator), torch.randn(16, 40, generator=generator)]
    x = torch.randn(3, 1536, generator=generator)
    expected = [F.linear(x[:, : w.shape[1]], w) for w in weights]
    runs = bench_products.kernels(weights)
    assert set(runs) == with_native({"mkl", "mkl-packed", "onednn-1", "onednn-8"}, torch.float32)
    for run in runs.values():
        for got, want in zip(run(x), expected, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@needs_onednn
def test_the_report_has_a_median_per_rows_and_kernel(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_products, "LAYERS", 1)
    monkeypatch.setattr(bench_products, "HEAD", (64, 576))
    out = tmp_path / "products.json"
    report = bench_products.main(["--rows", "1", "3", "--repeats", "2", "--threads", "1", "--out", str(out)])
    assert set(report["median_ms"]) == {1, 3}
    assert all(
        set(row) == with_native({"mkl", "mkl-packed", "onednn-1", "onednn-8"}, torch.float32)
        for row in report["median_ms"].values()
    )
    assert json.loads(out.read_text())["config"]["rows"] == [1, 3]
    with pytest.raises(SystemExit):
        bench_products.main(["--rows", "0"])


@pytest.mark.skipif(
    not (products.packing_available() and products.NATIVE_CPU_BF16),
    reason="oneDNN's bfloat16 product runs only on CPUs with avx512_bf16 or AMX",
)
def test_the_bfloat16_kernels_form_the_products_of_f_linear():
    generator = torch.Generator().manual_seed(1)
    weights = [
        torch.randn(48, 16, generator=generator).bfloat16(),
        torch.randn(16, 40, generator=generator).bfloat16(),
    ]
    x = torch.randn(3, 1536, generator=generator).bfloat16()
    runs = bench_products.kernels(weights)
    # MKL's packed GEMM is float32 only
    assert set(runs) == with_native({"mkl", "onednn-1", "onednn-8"}, torch.bfloat16)
    for run in runs.values():
        for got, weight in zip(run(x), weights, strict=True):
            exact = x[:, : weight.shape[1]].double() @ weight.double().T
            assert (
                got.dtype == torch.bfloat16
                and ((got.double() - exact).abs() <= 2**-8 * exact.abs() + 1e-5).all()
            )
