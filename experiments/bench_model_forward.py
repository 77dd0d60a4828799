"""Target-forward benchmark: the cost t(n) of one forward over n new tokens after a fixed context.

Variants, measured side by side in one process, interleaved call by call (round robin over the variants at
every repetition, so machine load hits all of them alike):

* ``baseline`` -- ``executor/model.py`` as of git revision ``--baseline-rev`` (the forward before the
  optimisation: repeat_interleave K/V, separate Q/K/V and gate/up projections, per-layer mask casts, RoPE
  recomputed per call, ``F.linear`` LM head), loaded from ``git show`` with the same weights;
* ``eager`` -- today's :class:`executor.model.Transformer` (float32 products on oneDNN's packed weights,
  :mod:`executor.products`);
* ``unpacked`` -- the same model with the packed path off (:func:`executor.products.switches`: MKL's products only);
* ``compiled`` -- the same model after :func:`executor.compiled.compile_model` (compile time reported apart).

For every dtype and n: median, 25th/75th percentiles and minimum of the wall time in ms, the ratio of medians
to the baseline, t(n)/t(1), and the largest absolute logit difference from the baseline (round-off only).
Run::

    python -m experiments.bench_model_forward [--n 1 2 4 8 16 32 64] [--dtypes float32 bfloat16] \
        [--variants baseline eager compiled] [--context 256] [--repeats 15] [--threads 2] \
        [--out runs/bench_model_forward.json] [--profile 1 8] [--clock wall|cpu]

``--profile N ...`` also prints (and stores) ``torch.profiler``'s self-CPU time per aten op at those n.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from executor import products
from executor.files import write_json
from executor.weights import load_model

VARIANTS = ("baseline", "eager", "unpacked", "compiled")
BASELINE_REV = "ff1fe9d"  # main before the forward was optimised (docs/benchmarks/model_forward.md)


def load_baseline_class(rev: str):
    """``Transformer`` from ``executor/model.py`` at git revision ``rev``, as a separate module."""
    root = Path(__file__).resolve().parent.parent
    try:
        source = subprocess.run(
            ["git", "show", f"{rev}:executor/model.py"], cwd=root, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise ValueError(f"baseline_rev {rev!r}: cannot read executor/model.py from git ({error})") from None
    spec = importlib.util.spec_from_loader("specbound_baseline_model", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up by name
    exec(compile(source, f"{rev}:executor/model.py", "exec"), module.__dict__)
    return module.Transformer


class Unpacked:
    """``model`` called with :mod:`executor.products`' packed path switched off (it shares the model's weights
    and cache; every call rewrites the same slots)."""

    def __init__(self, model) -> None:
        self.model, self.config = model, model.config

    def setup_cache(self, *args, **kwargs) -> None:
        self.model.setup_cache(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        with products.switches(packed=False):
            return self.model(*args, **kwargs)


def build_variants(names, dtype, baseline_rev: str, slots: int) -> tuple[dict, float | None]:
    model, _ = load_model(device="cpu", dtype=dtype)
    variants, compile_seconds = {}, None
    if "baseline" in names:
        with torch.device("meta"):
            baseline = load_baseline_class(baseline_rev)(model.config)
        baseline.load_state_dict(model.state_dict(), assign=True)
        variants["baseline"] = baseline.requires_grad_(False).eval()
    if "eager" in names:
        variants["eager"] = model
    if "unpacked" in names:
        variants["unpacked"] = Unpacked(model)
    if "compiled" in names:
        from executor.compiled import compile_model

        # A second Transformer sharing the weights, so that eager and compiled run side by side.
        with torch.device("meta"):
            twin = type(model)(model.config)
        twin.load_state_dict(model.state_dict(), assign=True)
        twin.requires_grad_(False).eval()
        variants["compiled"] = compile_model(twin)
    for variant in variants.values():
        variant.setup_cache(slots)
    if "compiled" in names:
        from executor.compiled import warm_up

        compile_seconds = warm_up(variants["compiled"], context=16)
    return variants, compile_seconds


def summarise(times: list[float]) -> dict:
    ms = sorted(1e3 * t for t in times)
    quartiles = statistics.quantiles(ms, n=4)
    return {
        "median_ms": statistics.median(ms),
        "p25_ms": quartiles[0],
        "p75_ms": quartiles[2],
        "min_ms": ms[0],
    }


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def measure(variants: dict, ns, context: int, repeats: int, seed: int, clock=time.perf_counter) -> dict:
    generator = torch.Generator().manual_seed(seed)
    any_model = next(iter(variants.values()))
    vocab = any_model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, context), generator=generator)
    results = {}
    with torch.no_grad():
        for model in variants.values():
            model(prompt, torch.arange(context))
        for n in tqdm(ns, desc="n", leave=False):
            tokens = torch.randint(0, vocab, (1, n), generator=generator)
            slots = torch.arange(context, context + n)
            logits = {name: model(tokens, slots) for name, model in variants.items()}  # warm-up, and outputs
            times = {name: [] for name in variants}
            for _ in range(repeats):
                for name, model in variants.items():
                    start = clock()
                    model(tokens, slots)
                    times[name].append(clock() - start)
            # The baseline, else the eager model, else the first variant (``--variants compiled`` alone).
            reference = next(logits[name] for name in ("baseline", "eager", *variants) if name in logits)
            results[n] = {
                name: {
                    **summarise(times[name]),
                    "max_abs_logit_diff": float((logits[name] - reference).abs().max()),
                    "top1_agrees": bool((logits[name].argmax(-1) == reference.argmax(-1)).all()),
                }
                for name in variants
            }
    return results


def profile_ops(variants: dict, n: int, context: int, repeats: int, rows: int = 12) -> dict:
    """``torch.profiler`` self-CPU time per aten op (ms per forward) over ``repeats`` forwards of n tokens."""
    from torch.profiler import ProfilerActivity, profile

    tables = {}
    with torch.no_grad():
        for name, model in variants.items():
            tokens = torch.zeros((1, n), dtype=torch.long)
            model(torch.zeros((1, context), dtype=torch.long), torch.arange(context))
            model(tokens, torch.arange(context, context + n))
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(repeats):
                    model(tokens, torch.arange(context, context + n))
            events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
            total = sum(e.self_cpu_time_total for e in events) / 1e3 / repeats
            tables[name] = {
                "total_ms": total,
                "ops": [
                    {"op": e.key, "ms": e.self_cpu_time_total / 1e3 / repeats, "calls": e.count // repeats}
                    for e in events[:rows]
                ],
            }
            print(f"\nprofile {name} n={n}: {total:.1f} ms of self CPU time per forward")
            for op in tables[name]["ops"]:
                print(f"  {op['op']:<55}{op['ms']:8.2f} ms {op['calls']:6d} calls")
    return tables


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall time, or the calling thread's CPU time (use with --threads 1 on a loaded machine)",
    )
    parser.add_argument("--baseline-rev", default=BASELINE_REV)
    parser.add_argument("--out", default="runs/bench_model_forward.json")
    parser.add_argument(
        "--profile", type=int, nargs="*", metavar="N", help="also print torch.profiler op tables at these n"
    )
    args = parser.parse_args(argv)
    for name in args.variants:
        if name not in VARIANTS:
            parser.error(f"--variants: unknown variant {name!r} (choose from {', '.join(VARIANTS)})")
    for name in args.dtypes:
        if not isinstance(getattr(torch, name, None), torch.dtype):
            parser.error(f"--dtypes: {name!r} is not a torch dtype")
    if min(args.n) < 1 or args.context < 1 or args.repeats < 3 or args.threads < 1:
        parser.error("--n and --context must be positive, --repeats at least 3, --threads positive")
    from executor.device import set_threads

    set_threads(args.threads)
    report = {
        "config": {
            **vars(args),
            "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "load_average_at_start": os.getloadavg(),
        },
        "results": {},
        "compile_seconds": {},
        "profiles": {},
    }
    for dtype_name in args.dtypes:
        variants, compile_seconds = build_variants(
            args.variants, getattr(torch, dtype_name), args.baseline_rev, args.context + max(args.n)
        )
        report["compile_seconds"][dtype_name] = compile_seconds
        report["results"][dtype_name] = measure(
            variants, args.n, args.context, args.repeats, args.seed, CLOCKS[args.clock]
        )
        report["profiles"][dtype_name] = {
            n: profile_ops(variants, n, args.context, args.repeats) for n in args.profile or []
        }
        del variants
    report["config"]["load_average_at_end"] = os.getloadavg()
    write_json(report, args.out)
    print_table(report)
    return report


def print_table(report: dict) -> None:
    for dtype_name, by_n in report["results"].items():
        names = list(next(iter(by_n.values())))
        print(f"\n{dtype_name} (compile {report['compile_seconds'][dtype_name]} s)")
        print(
            "n".rjust(4) + "".join(f"{name + ' ms':>22}" for name in names) + "  ratios to first  max|dlogit|"
        )
        for n, row in by_n.items():
            first = row[names[0]]["median_ms"]
            cells = "".join(
                f"{row[name]['median_ms']:9.1f} [{row[name]['p25_ms']:5.1f},{row[name]['p75_ms']:5.1f}]"
                for name in names
            )
            ratios = " ".join(f"{first / row[name]['median_ms']:.2f}x" for name in names[1:])
            diffs = " ".join(f"{row[name]['max_abs_logit_diff']:.1e}" for name in names[1:])
            print(f"{n:>4}{cells}  {ratios}  {diffs}")


if __name__ == "__main__":
    main()
