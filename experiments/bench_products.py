"""The model's matrix products on their own: one forward's 121 products of SmolLM2-135M at n rows, per kernel.

Random weights of SmolLM2's shapes (30 x [960x576 qkv, 576x576 o, 3072x576 gate/up, 576x1536 down] plus the
49152x576 head: 537 MB in float32, so, as in the model, the weights come from memory, not from the cache).
Kernels, interleaved per repetition:

* ``mkl`` -- ``F.linear`` (MKL's GEMM; what the model ran before ``executor.products.packed_linear``);
* ``mkl-packed`` -- MKL's packed GEMM (``torch.ops.mkl._mkl_linear`` on ``_mkl_reorder_linear_weight``);
* ``onednn-1`` / ``onednn-8`` -- oneDNN's inner product on ``torch.ops.mkldnn._reorder_linear_weight(w, b)``
  with the batch hint b (what ``executor.products.packed_linear`` used for every dtype before the native kernel);
* ``native`` -- where :func:`executor.products.native_available`: the native AVX-512 kernel of the dtype on its
  packed copy (what ``executor.products.packed_linear`` now runs there).

``--dtype bfloat16`` casts the weights and activations (no ``mkl-packed`` row: MKL's packed GEMM is float32
only); oneDNN multiplies bfloat16 natively only on CPUs with avx512_bf16 or AMX.

Prints the median ms per forward's products and the weight bandwidth, and writes JSON::

    python -m experiments.bench_products [--rows 1 2 4 8 16] [--threads 2] [--repeats 9] \\
        [--dtype float32|bfloat16] [--out runs/bench_products.json]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from executor import products
from executor.files import write_json

LAYERS = 30
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
HEAD = (49152, 576)


def kernels(weights: list[torch.Tensor]) -> dict:
    """name -> function of the activations (n, 1536) running every product once (returns the products)."""
    float32 = weights[0].dtype == torch.float32
    mkl_packed = [(torch.ops.mkl._mkl_reorder_linear_weight(w, 8), w) for w in weights] if float32 else []
    onednn = {b: [torch.ops.mkldnn._reorder_linear_weight(w, b) for w in weights] for b in (1, 8)}

    def plain(x):
        return [F.linear(x[:, : w.shape[1]], w) for w in weights]

    def packed_mkl(x):
        n = x.shape[0]
        return [
            torch.ops.mkl._mkl_linear(x[:, : w.shape[1]].contiguous(), p, w, None, n) for p, w in mkl_packed
        ]

    def packed_onednn(hint):
        def run(x):
            return [
                torch.ops.mkldnn._linear_pointwise(x[:, : w.shape[1]].contiguous(), p, None, "none", [], "")
                for p, w in zip(onednn[hint], weights, strict=True)
            ]

        return run

    runs = {
        "mkl": plain,
        "mkl-packed": packed_mkl,
        "onednn-1": packed_onednn(1),
        "onednn-8": packed_onednn(8),
    }
    if not float32:
        del runs["mkl-packed"]

    operator = products._native_op(weights[0].dtype)
    if operator is not None:
        native = [(products._native_copy(w), w) for w in weights]

        def run_native(x):
            return [operator(x[:, : w.shape[1]].contiguous(), p, w.shape[0]) for p, w in native]

        runs["native"] = run_native
    return runs


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--out", default="runs/bench_products.json")
    args = parser.parse_args(argv)
    if min(args.rows) < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--rows, --repeats and --threads must be positive")
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    weights = [0.02 * torch.randn(*s, generator=generator).to(dtype) for _ in range(LAYERS) for s in SHAPES]
    weights.append(0.02 * torch.randn(*HEAD, generator=generator).to(dtype))
    gigabytes = sum(w.numel() * w.element_size() for w in weights) / 1e9
    runs = kernels(weights)
    results = {}
    with torch.no_grad():
        for n in args.rows:
            x = torch.randn(n, 1536, generator=generator).to(dtype)
            times = {name: [] for name in runs}
            for run in runs.values():
                run(x)  # warm-up
            for _ in range(args.repeats):
                for name, run in runs.items():
                    start = time.perf_counter()
                    run(x)
                    times[name].append(time.perf_counter() - start)
            results[n] = {name: 1e3 * statistics.median(t) for name, t in times.items()}
            row = "  ".join(
                f"{name} {ms:6.1f} ms ({gigabytes / ms * 1e3:4.1f} GB/s)" for name, ms in results[n].items()
            )
            print(f"n = {n:3d}  {row}", flush=True)
    report = {"config": vars(args), "weights_gb": gigabytes, "median_ms": results}
    write_json(report, args.out)
    return report


if __name__ == "__main__":
    main()
