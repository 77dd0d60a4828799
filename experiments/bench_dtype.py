"""float32 against bfloat16: the target's forward time over ``n`` new tokens, both dtypes in one process.

``specbound profile`` measures one dtype per run; comparing two runs compares two moments of the machine's load.
Here both models are loaded side by side and every round times each size in each dtype, in turn (round-robin),
so the ratio bfloat16 / float32 at each ``n`` is measured under the same conditions. Context: HumanEval prompts
prefilled, as in :mod:`experiments.profiling`. Run::

    python -m experiments.bench_dtype [--sizes 1,2,8,64] [--repeats 9] [--threads N] [--out runs/bench_dtype.json]
"""

from __future__ import annotations

import argparse
import time

import torch
from tqdm import tqdm

from executor.device import detect_hardware, set_threads
from executor.files import write_json
from executor.weights import load_model
from experiments.profiling import context_ids, summarise_times

DTYPES = ("float32", "bfloat16")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,2,8,64", help="comma-separated numbers of new tokens")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None, help="default: the cores available")
    parser.add_argument("--out", default="runs/bench_dtype.json")
    args = parser.parse_args(argv)
    try:
        sizes = sorted({int(n) for n in args.sizes.split(",")})
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if sizes[0] < 1 or args.repeats < 1:
        parser.error("--sizes must be >= 1 and --repeats >= 1")
    threads = set_threads(args.threads, name="--threads")

    models = {}
    for name in DTYPES:
        models[name], tokenizer = load_model(device="cpu", dtype=name)
    context = context_ids(tokenizer, args.context)
    committed = len(context) - 1
    with torch.no_grad():
        for model in models.values():
            model.setup_cache(committed + sizes[-1])
            model(torch.tensor([context[:-1]]), torch.arange(committed))
        samples = {(name, n): [] for name in DTYPES for n in sizes}
        for round_index in tqdm(range(args.repeats + 1), desc="bench_dtype", unit="round"):
            for name, model in models.items():
                for n in sizes:
                    tokens = torch.tensor([[context[i % len(context)] for i in range(n)]])
                    start = time.perf_counter()
                    model(tokens, torch.arange(committed, committed + n))
                    elapsed = time.perf_counter() - start
                    if round_index > 0:  # the first round warms up
                        samples[(name, n)].append(elapsed)
    rows = []
    print(f"{'n':>4} {'float32 ms':>11} {'bfloat16 ms':>12} {'bf16/fp32':>10}")
    for n in sizes:
        stats = {name: summarise_times(samples[(name, n)]) for name in DTYPES}
        ratio = stats["bfloat16"]["median"] / stats["float32"]["median"]
        rows.append({"n": n, **stats, "bfloat16_over_float32": ratio})
        print(
            f"{n:>4} {stats['float32']['median'] * 1e3:>11.1f} {stats['bfloat16']['median'] * 1e3:>12.1f} "
            f"{ratio:>10.2f}"
        )
    write_json(
        {
            "settings": {**vars(args), "threads": threads, "torch": torch.__version__},
            "hardware": detect_hardware().summary(),
            "rows": rows,
        },
        args.out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
