"""Weight-only int8 and Q4_1 against float32 and bfloat16 on SmolLM2-135M: forward cost t(n), fidelity, decoding speed.

All configurations are loaded side by side in one process and measured interleaved (round-robin), so every
ratio compares two measurements taken under the same machine load. Configurations (``--configs``):

* ``float32``, ``bfloat16`` -- float weights and activations (``load_model(dtype=...)``);
* ``int8`` -- int8 weights, float32 activations (``load_model(dtype="float32", quantize="int8")``);
* ``int8-bf16`` -- int8 weights, bfloat16 activations;
* ``q4_1`` -- the GGUF file's own Q4_1 blocks, float32 activations (``quantize="q4_1"``); ``q4_1-bf16`` -- the
  same blocks with bfloat16 activations (torch's int4 CPU kernel vectorises only bfloat16 inputs on AVX2).

Sections of the JSON (and of the printed tables):

1. ``forward``: t(n), one target forward over ``n`` new tokens after a HumanEval context (as
   :mod:`experiments.profiling`), median over rounds, with t(n)/t(1) and t(n) relative to float32.
2. ``head``: the LM head product alone on ``n`` rows, float32 ``F.linear`` (what the feature drafter used) and
   ``linear`` against the int8 head: what a drafter reusing the target's LM head pays.
3. ``fidelity``: teacher-forced next-token distributions on HumanEval prompts (``--fidelity-prompts`` x up to
   ``--positions`` positions): top-1 agreement with float32 and mean total variation distance
   :math:`\\tfrac12 \\sum_x |p(x) - p_{32}(x)|` at T = 1.
4. ``decoding``: greedy tokens/s of plain decoding, chain decoding with prompt lookup (``ngram``, gamma 2) and,
   when one is cached, with the trained feature drafter (gamma 3), per configuration, on HumanEval prompts,
   interleaved by :func:`experiments.bench.run_bench`; ratios to plain decoding of the same configuration.

Run::

    python -m experiments.bench_int8 [--configs float32,bfloat16,int8,int8-bf16] [--sizes 1,2,4,8,16]
        [--repeats 9] [--clock wall|cpu] [--prompts 4] [--max-new-tokens 64] [--threads 2]
        [--out docs/benchmarks/int8.json]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

from executor.device import detect_hardware, set_threads
from executor.files import write_json
from executor.products import linear
from executor.weights import load_model
from experiments.profiling import context_ids, summarise_times

CONFIGS = {
    "float32": {"dtype": "float32"},
    "bfloat16": {"dtype": "bfloat16"},
    "int8": {"dtype": "float32", "quantize": "int8"},
    "int8-bf16": {"dtype": "bfloat16", "quantize": "int8"},
    "q4_1": {"dtype": "float32", "quantize": "q4_1"},
    "q4_1-bf16": {"dtype": "bfloat16", "quantize": "q4_1"},
}
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def measure_forward(models: dict, context: list[int], sizes: list[int], repeats: int, clock) -> dict:
    """t(n) per configuration: every round times each size of each model once, in turn."""
    committed = len(context) - 1
    samples = {(name, n): [] for name in models for n in sizes}
    with torch.no_grad():
        for model in models.values():
            model.setup_cache(committed + sizes[-1])
            model(torch.tensor([context[:-1]]), torch.arange(committed))
        for round_index in tqdm(range(repeats + 1), desc="forward", unit="round"):
            for name, model in models.items():
                for n in sizes:
                    tokens = torch.tensor([[context[-1], *[context[i % committed] for i in range(n - 1)]]])
                    start = clock()
                    model(tokens, torch.arange(committed, committed + n))
                    if round_index > 0:  # the first round warms up
                        samples[(name, n)].append(clock() - start)
    out = {}
    for name in models:
        stats = {n: summarise_times(samples[(name, n)]) for n in sizes}
        out[name] = {
            "sizes": sizes,
            "median_ms": [stats[n]["median"] * 1e3 for n in sizes],
            "iqr_ms": [stats[n]["iqr"] * 1e3 for n in sizes],
            "relative_to_t1": [stats[n]["median"] / stats[1]["median"] for n in sizes],
        }
    if "float32" in out:
        for name in out:
            out[name]["vs_float32"] = [
                a / b for a, b in zip(out[name]["median_ms"], out["float32"]["median_ms"], strict=True)
            ]
    return out


def measure_head(models: dict, sizes: list[int], repeats: int, clock) -> dict | None:
    """The LM head product on ``n`` rows: float32 ``F.linear`` and ``linear`` against the int8 head."""
    if "float32" not in models or "int8" not in models:
        return None
    weight = models["float32"].tok_embeddings.weight
    head = models["int8"].quantized_head
    calls = {
        "float32 F.linear": lambda x: F.linear(x, weight),
        "float32 linear": lambda x: linear(x, weight),
        "int8": lambda x: head(x),
    }
    generator = torch.Generator().manual_seed(0)
    inputs = {n: torch.randn(1, n, weight.shape[1], generator=generator) for n in sizes}
    samples = {(name, n): [] for name in calls for n in sizes}
    with torch.no_grad():
        for round_index in range(repeats + 1):
            for name, call in calls.items():
                for n in sizes:
                    start = clock()
                    call(inputs[n])
                    if round_index > 0:
                        samples[(name, n)].append(clock() - start)
    return {
        name: {
            "sizes": sizes,
            "median_ms": [summarise_times(samples[(name, n)])["median"] * 1e3 for n in sizes],
        }
        for name in calls
    }


def measure_fidelity(models: dict, tokenizer, prompts: int, positions: int) -> dict | None:
    """Top-1 agreement and mean TV of each configuration's next-token law against float32 (teacher-forced)."""
    from experiments.prompts import humaneval_prompts

    if "float32" not in models:
        return None
    texts = humaneval_prompts(prompts)
    agree = {name: 0 for name in models}
    tv = {name: 0.0 for name in models}
    tv_max = {name: 0.0 for name in models}
    counted = 0
    with torch.no_grad():
        for text in tqdm(texts, desc="fidelity", unit="prompt"):
            tokens = tokenizer.encode(text)[: positions + 1]
            length = len(tokens) - 1
            probs = {}
            for name, model in models.items():
                model.setup_cache(length)
                probs[name] = model(torch.tensor([tokens[:-1]]), torch.arange(length))[0].double().softmax(-1)
            reference = probs["float32"]
            for name, p in probs.items():
                distance = 0.5 * (p - reference).abs().sum(-1)
                agree[name] += int((p.argmax(-1) == reference.argmax(-1)).sum())
                tv[name] += float(distance.sum())
                tv_max[name] = max(tv_max[name], float(distance.max()))
            counted += length
    return {
        "prompts": prompts,
        "positions": counted,
        "top1_agreement": {name: agree[name] / counted for name in models},
        "mean_tv": {name: tv[name] / counted for name in models},
        "max_tv": tv_max,
    }


def measure_decoding(models: dict, tokenizer, prompts: int, max_new_tokens: int) -> dict:
    """Greedy tokens/s of plain decoding, chain-ngram and chain-feature per configuration, interleaved."""
    from executor.decoders import AutoregressiveDecoder, ChainDecoder
    from executor.drafters import PromptLookupDrafter, parse_drafter
    from executor.drafters.parse import feature_checkpoint
    from experiments.bench import run_bench
    from experiments.bench_rows import our_runner
    from experiments.prompts import humaneval_prompts

    runners = {}
    checkpoint = None
    for name, model in models.items():
        runners[f"ar@{name}"] = our_runner(AutoregressiveDecoder(model))
        runners[f"chain-ngram@{name}"] = our_runner(ChainDecoder(model, PromptLookupDrafter(), gamma=2))
        found = feature_checkpoint(model, train_if_missing=False)
        if found is not None:
            checkpoint = str(found)
            drafter = parse_drafter(f"feature:{found}", model)
            runners[f"chain-feature@{name}"] = our_runner(ChainDecoder(model, drafter, gamma=3))
    prompt_ids = [tokenizer.encode(text) for text in humaneval_prompts(prompts)]
    rounds = run_bench(
        runners,
        prompt_ids,
        max_new_tokens,
        progress=lambda items: tqdm(items, desc="decoding", unit="prompt"),
    )
    totals = {
        runner: {
            "tokens": sum(done[runner].tokens for done in rounds),
            "seconds": sum(done[runner].seconds for done in rounds),
        }
        for runner in runners
    }
    rows = []
    for runner, total in totals.items():
        decoder, _, name = runner.partition("@")
        speed = total["tokens"] / total["seconds"]
        ar = totals[f"ar@{name}"]
        rows.append(
            {
                "decoder": decoder,
                "config": name,
                "tokens_per_s": speed,
                "vs_ar_same_config": speed / (ar["tokens"] / ar["seconds"]),
                "vs_ar_float32": speed / (totals["ar@float32"]["tokens"] / totals["ar@float32"]["seconds"])
                if "ar@float32" in totals
                else None,
            }
        )
    return {
        "prompts": prompts,
        "max_new_tokens": max_new_tokens,
        "feature_checkpoint": checkpoint,
        "rows": rows,
    }


def print_report(report: dict) -> None:
    forward = report["forward"]
    print(f"\nt(n), median ms ({report['settings']['clock']} clock), t(n)/t(1), t(n)/t_float32(n)")
    for name, row in forward.items():
        cells = "  ".join(
            f"n={n}: {ms:.1f} ({rel:.2f}, {vs:.2f})"
            for n, ms, rel, vs in zip(
                row["sizes"],
                row["median_ms"],
                row["relative_to_t1"],
                row.get("vs_float32", row["sizes"]),
                strict=True,
            )
        )
        print(f"{name:>10}  {cells}")
    if report.get("head"):
        print("\nLM head product, median ms")
        for name, row in report["head"].items():
            print(
                f"{name:>18}  "
                + "  ".join(f"n={n}: {ms:.2f}" for n, ms in zip(row["sizes"], row["median_ms"], strict=True))
            )
    if report.get("fidelity"):
        fidelity = report["fidelity"]
        print(f"\nagreement with float32 over {fidelity['positions']} positions")
        for name in fidelity["top1_agreement"]:
            print(
                f"{name:>10}  top-1 {fidelity['top1_agreement'][name]:.4f}  mean TV {fidelity['mean_tv'][name]:.4f}"
                f"  max TV {fidelity['max_tv'][name]:.4f}"
            )
    if report.get("decoding"):
        print("\ngreedy decoding, tokens/s (vs plain decoding of the same config, vs float32 plain decoding)")
        for row in report["decoding"]["rows"]:
            versus = "" if row["vs_ar_float32"] is None else f"  {row['vs_ar_float32']:.2f}"
            print(
                f"{row['decoder']:>14} {row['config']:>10}  {row['tokens_per_s']:.2f}  {row['vs_ar_same_config']:.2f}{versus}"
            )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="float32,bfloat16,int8,int8-bf16")
    parser.add_argument("--sizes", default="1,2,4,8,16", help="comma-separated numbers of new tokens")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall")
    parser.add_argument("--fidelity-prompts", type=int, default=8)
    parser.add_argument("--positions", type=int, default=64)
    parser.add_argument(
        "--prompts", type=int, default=4, help="HumanEval prompts of the decoding section (0: skip)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="default: the cores available")
    parser.add_argument("--out", default="runs/bench_int8.json")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.configs.split(",") if name.strip()]
    unknown = [name for name in names if name not in CONFIGS]
    if not names or unknown:
        parser.error(
            f"--configs: unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join(CONFIGS)}"
        )
    try:
        sizes = sorted({int(n) for n in args.sizes.split(",")})
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if sizes[0] != 1 or args.repeats < 1:
        parser.error("--sizes must start at 1 and --repeats be >= 1")
    threads = set_threads(args.threads, name="--threads")
    models = {}
    for name in names:
        models[name], tokenizer = load_model(device="cpu", **CONFIGS[name])
    clock = CLOCKS[args.clock]
    report = {
        "settings": {**vars(args), "threads": threads, "torch": torch.__version__},
        "hardware": detect_hardware().summary(),
        "forward": measure_forward(models, context_ids(tokenizer, args.context), sizes, args.repeats, clock),
        "head": measure_head(models, [n for n in sizes if n <= 8], args.repeats, clock),
    }
    write_json(report, args.out)
    report["fidelity"] = measure_fidelity(models, tokenizer, args.fidelity_prompts, args.positions)
    write_json(report, args.out)
    if args.prompts > 0:
        report["decoding"] = measure_decoding(models, tokenizer, args.prompts, args.max_new_tokens)
    write_json(report, args.out)
    print_report(report)
    return report


if __name__ == "__main__":
    main()
