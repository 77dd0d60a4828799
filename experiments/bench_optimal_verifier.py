"""Benchmark: the run-time optimal verifier on real SmolLM2 pairs (V = 49152) and synthetic pairs (V = 151936).

Run ``python -m experiments.bench_optimal_verifier [--quick] [--pairs-dir DIR] [--out PATH] [--numpy-only]
[--end-to-end N [--end-to-end-runs R]]``. For every pair and
``n`` in 2, 4, 8 it builds :func:`theory.optimal_verifier` and records the build time, the shortfall to
:math:`\\alpha^*` and, on the same pair, the exact acceptance of RRS, K-SEQ and (``n = 2``) SpecHub (its own
hub draft law) and RRS without replacement (a tree node with two children). Each build is timed next to ``numpy.argsort`` of the same ``p/q`` row (the floor of any method
that sorts by ratio), interleaved, so that the ratio survives a loaded machine. Real pairs are logged by the
executor (:func:`experiments.real_pairs.log_pairs`: multi-draft decoder, T = 0.7 and 1) for each drafter of
``--drafters`` (default: the untrained early exit at layer 15 and the trained feature head, ``feature``: the
cached one, trained first when there is none) and cached under ``--pairs-dir`` (default
``$XDG_CACHE_HOME/specbound/bench_pairs``, one file per drafter and temperature, named after the drafter and,
for a trained head, its checkpoint). Prints a table and writes JSON atomically; the recorded results are in
``docs/benchmarks/optimal_verifier.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import platform
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from executor.training.checkpoint import cache_root
from executor.weights import load_model
from theory import _native, optimal_verifier, optimal_verifier_wor, verifier

DRAFTS = (2, 4, 8)
SYNTHETIC_VOCAB = 151936
SEED = 20251123


#: Scale of the Gaussian noise added to the target's logits to make the synthetic draft's.
SYNTHETIC_NOISE = 1.5


def synthetic_pairs(
    rng: np.random.Generator, count: int, vocab: int, temperature: float, noise: float = SYNTHETIC_NOISE
):
    """Gaussian logits (scale 3) at ``temperature``; the draft's logits are the target's plus Gaussian noise of
    scale ``noise`` (1.5: a weak drafter; 0.05-0.3: a close, full-vocabulary one, alpha* near 1)."""
    for _ in range(count):
        logits = 3.0 * rng.standard_normal(vocab)
        draft = logits + noise * rng.standard_normal(vocab)
        p = np.exp((logits - logits.max()) / temperature)
        q = np.exp((draft - draft.max()) / temperature)
        yield p / p.sum(), q / q.sum()


DRAFTERS = ("early-exit:15", "feature")


def drafter_slug(spec: str) -> str:
    """A file-name and label form of a drafter spec: ``early-exit:15`` -> ``early-exit-15``,
    ``feature:/cache/feature-6e9008efa296-9c096909f3`` -> ``feature-9c096909f3`` (the checkpoint's key)."""
    kind, _, argument = spec.partition(":")
    if "/" in argument:
        argument = Path(argument.rstrip("/")).name.rsplit("-", 1)[-1]
    return f"{kind}-{argument}" if argument else kind


def resolve_drafter(spec: str, load_target) -> str:
    """``feature`` / ``falcon`` without a path -> the cached checkpoint's spec (trained first, with a message,
    when there is none), so the pair cache names the head it came from; other specs unchanged."""
    if spec not in ("feature", "falcon"):
        return spec
    from executor.drafters.parse import kind_checkpoint

    return f"{spec}:{kind_checkpoint(load_target()[0], spec)}"


def real_pairs(directory: Path, temperature: float, steps: int, drafter: str = DRAFTERS[0], load_target=None):
    """Logged (p, q) at every drafted position with ``drafter``, cached in ``directory`` (written atomically).

    ``load_target()`` returns ``(model, tokenizer)`` (default: the embedded SmolLM2, loaded by the logger)."""
    path = directory / f"smollm2_{drafter_slug(drafter)}_T{temperature}_steps{steps}.npz"
    if not path.exists():
        from experiments.real_pairs import log_pairs, save_pairs

        model, tokenizer = load_target() if load_target is not None else (None, None)
        save_pairs(
            *log_pairs(temperature, drafter=drafter, steps=steps, model=model, tokenizer=tokenizer), path
        )
    data = np.load(path)
    return list(zip(data["p"], data["q"], strict=True))


def _timed(function):
    """(result, wall seconds, CPU seconds of this thread): the CPU time leaves out the waits of a shared
    machine, which inflate the wall time of anything that runs for more than a scheduler slice."""
    wall, cpu = time.perf_counter(), time.thread_time()
    result = function()
    return result, time.perf_counter() - wall, time.thread_time() - cpu


def measure(p: np.ndarray, q: np.ndarray, n: int, numpy_only: bool = False) -> dict:
    """Build time and argsort time (interleaved), shortfall, alpha* and the baselines' acceptance; with
    ``numpy_only``, also the build's time with the theory's native code off (the race fit and the buckets in
    numpy), next to it."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = p / q
    _, sort_seconds, sort_cpu = _timed(lambda: np.argsort(ratio))
    built, build_seconds, build_cpu = _timed(lambda: optimal_verifier(p, q, n))
    extra = {}
    if numpy_only:
        with _native.enabled(False):
            _, numpy_seconds, numpy_cpu = _timed(lambda: optimal_verifier(p, q, n))
        extra = {"numpy_only_build_ms": 1e3 * numpy_seconds, "numpy_only_build_cpu_ms": 1e3 * numpy_cpu}
    row = {
        "n": n,
        "build_ms": 1e3 * build_seconds,
        "build_cpu_ms": 1e3 * build_cpu,
        "argsort_ms": 1e3 * sort_seconds,
        "argsort_cpu_ms": 1e3 * sort_cpu,
        "alpha_star": built.alpha_star,
        "acceptance": built.acceptance,
        "shortfall": built.shortfall,
        "rrs": float(verifier("rrs").acceptance(p, q, n)),
        "kseq": float(verifier("kseq").acceptance(p, q, n)),
        **extra,
    }
    if n == 2:
        row["spechub"] = float(verifier("spechub").acceptance(p, q, 2))
        # A tree node with two children: i.i.d. children + the optimal verifier against RRS without replacement.
        row["rrs_wor"] = float(verifier("rrs_wor").acceptance(p, q, 2))
    return row


def lumped(p: np.ndarray, q: np.ndarray, keep: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``keep`` tokens of largest ``p + q`` and one token holding the rest of both (a proper pair)."""
    top = np.argsort(-(p + q))[:keep]
    rest = np.ones(p.shape[0], dtype=bool)
    rest[top] = False
    return np.r_[p[top], p[rest].sum()], np.r_[q[top], q[rest].sum()]


def measure_wor(p: np.ndarray, q: np.ndarray, n: int) -> dict:
    """Drafts without replacement (:func:`theory.optimal_verifier_wor`, enumerated: small pairs only): build
    CPU time, shortfall to alpha*_wor, and RRS without replacement and the i.i.d. optimum on the same pair."""
    built, _, cpu = _timed(lambda: optimal_verifier_wor(p, q, n))
    return {
        "n": n,
        "build_cpu_ms": 1e3 * cpu,
        "alpha_star": built.alpha_star,
        "acceptance": built.acceptance,
        "shortfall": built.shortfall,
        "alpha_star_iid": float(optimal_verifier(p, q, n).alpha_star),
        "rrs_wor": float(verifier("rrs_wor").acceptance(p, q, n)),
    }


def summarise(rows: list[dict]) -> dict:
    build = np.array([r["build_ms"] for r in rows])
    cpu = np.array([r["build_cpu_ms"] for r in rows])
    ratio = cpu / np.maximum(np.array([r["argsort_cpu_ms"] for r in rows]), 1e-6)
    shortfall = np.array([r["shortfall"] for r in rows])
    alpha = np.array([r["alpha_star"] for r in rows])
    out = {
        "pairs": len(rows),
        "build_ms_median": float(np.median(build)),
        "build_ms_p99": float(np.percentile(build, 99)),
        "build_cpu_ms_median": float(np.median(cpu)),
        "build_cpu_ms_p99": float(np.percentile(cpu, 99)),
        "build_over_argsort_median": float(np.median(ratio)),
        "build_over_argsort_p99": float(np.percentile(ratio, 99)),
        "shortfall_max": float(shortfall.max()),
        "shortfall_median": float(np.median(shortfall)),
        "alpha_star_mean": float(alpha.mean()),
    }
    if "numpy_only_build_cpu_ms" in rows[0]:
        numpy_cpu = np.array([r["numpy_only_build_cpu_ms"] for r in rows])
        out["numpy_only_build_cpu_ms_median"] = float(np.median(numpy_cpu))
        out["numpy_only_build_cpu_ms_p99"] = float(np.percentile(numpy_cpu, 99))
        out["over_numpy_only_median"] = float(np.median(cpu / np.maximum(numpy_cpu, 1e-6)))
    for name in ("rrs", "kseq", "spechub", "rrs_wor"):
        if name in rows[0]:
            gap = alpha - np.array([r[name] for r in rows])
            out[f"{name}_gap_mean"] = float(gap.mean())
            out[f"{name}_gap_max"] = float(gap.max())
    return out


@contextlib.contextmanager
def timed_verifiers(names=("rrs", "optimal")):
    """Within the context, the CPU seconds of this thread spent in each named verification kernel of
    ``executor.verification`` (the optimal one includes its build), and its call count: ``{name: [seconds,
    calls]}``. A step's cost differs between two verifiers only there, so this is the difference the end-to-end
    per-step ratio measures, without the noise of the forwards around it."""
    from executor import verification

    spent = {name: [0.0, 0] for name in names}
    originals = {name: verification._KERNELS[name] for name in names}

    def timing(name, kernel):
        def timed(*args, **kwargs):
            start = time.thread_time()
            try:
                return kernel(*args, **kwargs)
            finally:
                spent[name][0] += time.thread_time() - start
                spent[name][1] += 1

        return timed

    verification._KERNELS.update({name: timing(name, kernel) for name, kernel in originals.items()})
    try:
        yield spent
    finally:
        verification._KERNELS.update(originals)


def end_to_end(prompts, new_tokens: int, seed: int = 0, model=None, tokenizer=None) -> list[dict]:
    """SmolLM2 decoding with ``verifier="rrs"`` and ``"optimal"`` side by side (both draw i.i.d. drafts), for the
    multi-draft decoder (n = 4) and a tree (4 levels, 2 i.i.d. children per node): tokens per step, wall and CPU
    time per step (one torch thread, so the CPU time is the step's cost without the waits of a shared machine)
    and the CPU time per step in the verification kernel (:func:`timed_verifiers`), runs interleaved prompt by
    prompt, the first verifier alternating."""

    from executor.device import set_threads
    from executor.generate import generate

    set_threads(1)
    if model is None:
        from executor.weights import load_model

        model, tokenizer = load_model()
    totals = {}
    for index, prompt in enumerate(prompts):
        for decoder, n, gamma in (("multidraft", 4, 1), ("tree", 2, 4)):
            # The order alternates by prompt (ABBA over prompt pairs): a machine whose speed drifts within a
            # run then charges both verifiers alike.
            for name in ("rrs", "optimal") if index % 2 == 0 else ("optimal", "rrs"):
                with timed_verifiers((name,)) as spent:
                    start, cpu = time.perf_counter(), time.thread_time()
                    result = generate(
                        prompt,
                        model=model,
                        tokenizer=tokenizer,
                        decoder=decoder,
                        verifier=name,
                        n=n,
                        gamma=gamma,
                        temperature=1.0,
                        max_new_tokens=new_tokens,
                        seed=seed + index,
                        stop_at_eos=False,
                    )
                    seconds, cpu = time.perf_counter() - start, time.thread_time() - cpu
                entry = totals.setdefault(
                    (decoder, name),
                    {"tokens": 0, "steps": 0, "seconds": 0.0, "cpu": 0.0, "verify": 0.0, "verify_calls": 0},
                )
                entry["tokens"] += len(result.token_ids)
                entry["steps"] += len(result.steps)
                entry["seconds"] += seconds
                entry["cpu"] += cpu
                entry["verify"] += spent[name][0]
                entry["verify_calls"] += spent[name][1]
    return [
        {
            "decoder": decoder,
            "verifier": name,
            "tau": e["tokens"] / e["steps"],
            "ms_per_step": 1e3 * e["seconds"] / e["steps"],
            "ms_per_token": 1e3 * e["seconds"] / e["tokens"],
            "cpu_ms_per_step": 1e3 * e["cpu"] / e["steps"],
            "cpu_ms_per_token": 1e3 * e["cpu"] / e["tokens"],
            "verify_cpu_ms_per_step": 1e3 * e["verify"] / e["steps"],
            "verify_calls_per_step": e["verify_calls"] / e["steps"],
        }
        for (decoder, name), e in totals.items()
    ]


def step_cost_ratios(rows: list[dict]) -> dict[str, dict]:
    """Per decoder, the optimal verifier's cost per step and per token over RRS's, from :func:`end_to_end`'s
    rows (one run): ``{"per_step": ..., "per_token": ...}`` (1.05 = 5% slower), and ``verify_extra_share``, the
    verification kernels' extra CPU time per step over RRS's CPU time per step (0.05 = 5%: the part of the
    per-step ratio the verifier itself adds, measured without the forwards' noise)."""
    by = {(row["decoder"], row["verifier"]): row for row in rows}
    ratios = {}
    for decoder, name in by:
        if name != "rrs" or (decoder, "optimal") not in by:
            continue
        rrs, optimal = by[decoder, "rrs"], by[decoder, "optimal"]
        ratios[decoder] = {
            f"per_{unit}": optimal[f"ms_per_{unit}"] / rrs[f"ms_per_{unit}"] for unit in ("step", "token")
        }
        if "verify_cpu_ms_per_step" in rrs:
            extra = optimal["verify_cpu_ms_per_step"] - rrs["verify_cpu_ms_per_step"]
            ratios[decoder]["verify_extra_share"] = extra / rrs["cpu_ms_per_step"]
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few pairs per case")
    parser.add_argument(
        "--pairs-dir",
        type=Path,
        default=cache_root() / "bench_pairs",
        help="cache of logged pairs (default: $XDG_CACHE_HOME/specbound/bench_pairs; ~170 MB)",
    )
    parser.add_argument("--steps", type=int, default=32, help="new tokens per prompt when logging real pairs")
    parser.add_argument(
        "--drafters",
        default=",".join(DRAFTERS),
        help="comma-separated drafters whose real pairs are logged (any `specbound generate --drafter` spec; "
        "default: %(default)s, the untrained early exit and the cached trained feature head)",
    )
    parser.add_argument("--synthetic", type=int, default=20, help="synthetic pairs per temperature")
    parser.add_argument(
        "--synthetic-vocab", type=int, default=SYNTHETIC_VOCAB, help="V of the synthetic pairs"
    )
    parser.add_argument(
        "--synthetic-noise",
        type=float,
        default=SYNTHETIC_NOISE,
        help="scale of the noise on the synthetic draft's logits (default %(default)s; 0.05-0.3: close drafts)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench_optimal_verifier.json"))
    parser.add_argument(
        "--end-to-end", type=int, default=0, help="also decode N tokens per prompt with SmolLM2"
    )
    parser.add_argument(
        "--end-to-end-runs",
        type=int,
        default=1,
        help="with --end-to-end: runs in a row in this process, each reported (the first pays warm-up; a "
        "single run moves by +-5%% on a shared machine)",
    )
    parser.add_argument(
        "--wor-tokens",
        type=int,
        default=0,
        help="also build the without-replacement verifier on the real pairs cut to their top K tokens + rest",
    )
    parser.add_argument("--only-wor", action="store_true", help="skip the i.i.d. cases (with --wor-tokens)")
    parser.add_argument(
        "--numpy-only",
        action="store_true",
        help="also time each build with the theory's native code off (fit and buckets in numpy), next to it",
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.synthetic < 1 or args.synthetic_vocab < 2:
        parser.error("--steps and --synthetic must be at least 1 and --synthetic-vocab at least 2")
    if not args.synthetic_noise >= 0:
        parser.error(f"--synthetic-noise must be a scale >= 0, got {args.synthetic_noise}")
    if args.end_to_end_runs < 1:
        parser.error(f"--end-to-end-runs must be at least 1, got {args.end_to_end_runs}")
    if args.wor_tokens < 0 or (args.only_wor and args.wor_tokens < 4):
        parser.error("--wor-tokens must be >= 0 (and >= 4 with --only-wor)")
    drafters = [spec.strip() for spec in args.drafters.split(",") if spec.strip()]
    if not drafters:
        parser.error("--drafters must name at least one drafter")
    rng = np.random.default_rng(SEED)
    load_target = functools.cache(load_model)
    cases = {}
    for spec in drafters:
        spec = resolve_drafter(spec, load_target)
        for temperature in (0.7, 1.0):
            pairs = real_pairs(args.pairs_dir, temperature, args.steps, spec, load_target)
            cases[f"SmolLM2 {drafter_slug(spec)}, T = {temperature}"] = pairs[:4] if args.quick else pairs
    for temperature in (0.7, 1.0):
        count = 2 if args.quick else args.synthetic
        noise = "" if args.synthetic_noise == SYNTHETIC_NOISE else f", noise {args.synthetic_noise:g}"
        cases[f"synthetic V = {args.synthetic_vocab}{noise}, T = {temperature}"] = list(
            synthetic_pairs(rng, count, args.synthetic_vocab, temperature, args.synthetic_noise)
        )
    results = {
        "machine": platform.platform(),
        "numpy": np.__version__,
        "native_fit": _native.available(),
        "cases": {},
        "wor": {},
    }
    if args.wor_tokens:
        for label, pairs in list(cases.items())[: 2 * len(drafters)]:
            for n in (2, 3, 4):
                rows = [measure_wor(*lumped(p, q, args.wor_tokens), n) for p, q in tqdm(pairs, leave=False)]
                shortfall = np.array([r["shortfall"] for r in rows])
                alpha = np.array([r["alpha_star"] for r in rows])
                summary = {
                    "pairs": len(rows),
                    "build_cpu_ms_median": float(np.median([r["build_cpu_ms"] for r in rows])),
                    "shortfall_max": float(shortfall.max()),
                    "alpha_star_wor_mean": float(alpha.mean()),
                    "alpha_star_iid_mean": float(np.mean([r["alpha_star_iid"] for r in rows])),
                    "rrs_wor_gap_mean": float(np.mean(alpha - [r["rrs_wor"] for r in rows])),
                    "rrs_wor_gap_max": float(np.max(alpha - [r["rrs_wor"] for r in rows])),
                }
                key = f"{label}, top {args.wor_tokens} + rest, wor n = {n}"
                results["wor"][key] = {"summary": summary, "rows": rows}
                print(key, {k: round(v, 6) if isinstance(v, float) else v for k, v in summary.items()})
        if args.only_wor:
            cases = {}
    for label, pairs in cases.items():
        for n in DRAFTS:
            rows = [
                measure(p, q, n, args.numpy_only)
                for p, q in tqdm(pairs, desc=f"{label}, n = {n}", leave=False)
            ]
            results["cases"][f"{label}, n = {n}"] = {"summary": summarise(rows), "rows": rows}
    header = (
        f"{'case':<44} {'build ms med/p99':>17} {'CPU ms med/p99':>15} {'x argsort':>10} {'shortfall max/med':>19} "
        f"{'alpha*':>7} {'RRS gap':>8} {'K-SEQ gap':>9} {'SpecHub':>8} {'RRS-wor':>8}"
    )
    print(header)
    for label, entry in results["cases"].items():
        s = entry["summary"]
        spechub = f"{s['spechub_gap_mean']:.4f}" if "spechub_gap_mean" in s else ""
        wor = f"{s['rrs_wor_gap_mean']:.4f}" if "rrs_wor_gap_mean" in s else ""
        print(
            f"{label:<44} {s['build_ms_median']:>8.1f}/{s['build_ms_p99']:<8.1f} "
            f"{s['build_cpu_ms_median']:>7.2f}/{s['build_cpu_ms_p99']:<7.2f} "
            f"{s['build_over_argsort_median']:>10.1f} {s['shortfall_max']:>9.1e}/{s['shortfall_median']:<9.1e} "
            f"{s['alpha_star_mean']:>7.4f} {s['rrs_gap_mean']:>8.4f} {s['kseq_gap_mean']:>9.4f} {spechub:>8} {wor:>8}"
        )
    if args.numpy_only:
        print(f"\n{'case':<44} {'CPU ms, native':>19} {'CPU ms, numpy only':>18} {'native / numpy':>15}")
        for label, entry in results["cases"].items():
            s = entry["summary"]
            print(
                f"{label:<44} {s['build_cpu_ms_median']:>19.2f} {s['numpy_only_build_cpu_ms_median']:>18.2f} "
                f"{s['over_numpy_only_median']:>15.3f}"
            )
    if args.end_to_end:
        from experiments.real_pairs import PROMPTS

        results["end_to_end"], results["end_to_end_ratios"] = [], []
        model, tokenizer = load_target()
        for run in range(1, args.end_to_end_runs + 1):
            rows = end_to_end(PROMPTS, args.end_to_end, model=model, tokenizer=tokenizer)
            results["end_to_end"] += [{"run": run, **row} for row in rows]
            ratios = step_cost_ratios(rows)
            results["end_to_end_ratios"].append({"run": run, **ratios})
            for row in rows:
                print(
                    f"run {run} {row['decoder']:<10} {row['verifier']:<8} tau {row['tau']:.3f}  "
                    f"{row['ms_per_step']:.1f} ms/step ({row['cpu_ms_per_step']:.1f} CPU)  "
                    f"{row['ms_per_token']:.1f} ms/token"
                )
            for decoder, ratio in ratios.items():
                print(
                    f"run {run} {decoder}: optimal / RRS {ratio['per_step']:.3f} per step, "
                    f"{ratio['per_token']:.3f} per token; the verifier adds {100 * ratio['verify_extra_share']:.1f}% "
                    "of a step"
                )
        medians = {
            decoder: {
                unit: float(np.median([entry[decoder][unit] for entry in results["end_to_end_ratios"]]))
                for unit in ("per_step", "per_token", "verify_extra_share")
            }
            for decoder in ratios
        }
        results["end_to_end_ratio_medians"] = medians
        for decoder, ratio in medians.items():
            print(
                f"median of {args.end_to_end_runs} runs, {decoder}: optimal / RRS {ratio['per_step']:.3f} per "
                f"step, {ratio['per_token']:.3f} per token; the verifier adds "
                f"{100 * ratio['verify_extra_share']:.1f}% of a step"
            )
    from executor.files import write_json

    write_json(results, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
