"""Benchmark of ``bound --logs`` (docs/benchmarks/bound_logs.md).

Throughput (positions/s) on full V = 49 152 logs and on top-k logs (k = 20, 256) with 1 and 2 Dask workers
(interleaved: 1, 2, 1, 2, ... on the same shards, clusters started before timing), the scaling ratio, each
worker's peak resident memory, the scheduler's per-task overhead, and the extrapolated time for 10^6 top-20
positions (alpha* iid and wor, n = 2, 4, 8). With ``--widths LOG.npz`` (a full log, e.g. written by
``specbound generate --log-out``) it also tabulates the mean interval width against k.

    .venv/bin/python -m experiments.bench_bound_logs [--quick] [--widths runs/smollm_full.npz]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from experiments.logformat import top_k_arrays, write_full_log, write_topk_log

VOCAB = 49152
SEED = 20251123


def lm_rows(rng, rows, vocab=VOCAB):
    """LM-like pairs: softmax of Gaussian logits at per-row temperatures; the draft adds noise."""
    scale = rng.uniform(1.5, 4.0, size=(rows, 1))
    logits = rng.standard_normal((rows, vocab)) * scale
    p = np.exp(logits - logits.max(1, keepdims=True))
    noisy = logits + rng.standard_normal((rows, vocab)) * 0.8
    q = np.exp(noisy - noisy.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)


def make_shards(folder: Path, shards: int, rows: int, k: int | None, pool) -> None:
    """Shards of ``rows`` positions drawn (with replacement) from a pool of LM-like full rows."""
    folder.mkdir(parents=True, exist_ok=True)
    p_pool, q_pool, rng = pool
    for index in range(shards):
        pick = rng.integers(0, len(p_pool), size=rows)
        p, q = p_pool[pick], q_pool[pick]
        if k is None:
            write_full_log(
                folder / f"shard_{index:03d}.npz", p.astype(np.float32), q.astype(np.float32), temperature=1.0
            )
        else:
            write_topk_log(folder / f"shard_{index:03d}.npz", top_k_arrays(p, q, k), VOCAB, temperature=1.0)


def peak_memory(client) -> dict:
    """Each worker's resident-memory high-water mark (VmHWM; ru_maxrss would include the forking parent's)."""

    def rss() -> int:
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    return client.run(rss)


def timed_runs(folder: Path, ns, verifiers, rounds: int) -> dict:
    """Positions/s with 1 and 2 workers, interleaved; peak worker memory; scheduler per-task overhead."""
    from distributed import Client, LocalCluster

    from experiments.sharded_bound import run_sharded

    clusters = {w: LocalCluster(n_workers=w, threads_per_worker=1, dashboard_address=":0") for w in (1, 2)}
    times: dict[int, list[float]] = {1: [], 2: []}
    positions = 0
    try:
        for _ in range(rounds):
            for workers, cluster in clusters.items():
                start = time.perf_counter()
                report = run_sharded(
                    str(folder / "*.npz"),
                    ns,
                    verifiers=verifiers,
                    scheduler=cluster.scheduler_address,
                    progress=False,
                )
                times[workers].append(time.perf_counter() - start)
                positions = report["positions"]
        memory = {}
        for workers, cluster in clusters.items():
            with Client(cluster.scheduler_address) as client:
                memory[workers] = max(peak_memory(client).values())
        with Client(clusters[2].scheduler_address) as client:
            start = time.perf_counter()
            client.gather(client.map(lambda x: x, range(500), pure=False))
            overhead = (time.perf_counter() - start) / 500
    finally:
        for cluster in clusters.values():
            cluster.close()
    best = {w: min(t) for w, t in times.items()}
    return {
        "positions": positions,
        "seconds": times,
        "positions_per_s": {w: positions / t for w, t in best.items()},
        "scaling_2_over_1": best[1] / best[2],
        "peak_worker_rss_mb": {w: m / 2**20 for w, m in memory.items()},
        "scheduler_seconds_per_task": overhead,
    }


def cpu_rates(cases, pool, scratch: Path) -> dict:
    """Positions per CPU-second of one in-process shard per case (robust to other jobs sharing the cores)."""
    from experiments.log_bounds import VERIFIERS, bound_shard

    rates = {}
    for index, (label, k, _, rows, ns, verifiers) in enumerate(cases):
        folder = scratch / f"cpu_{index}"
        make_shards(folder, 1, rows, k, pool)
        path = str(folder / "shard_000.npz")
        bound_shard(path, ns, verifiers=VERIFIERS if verifiers is None else verifiers)  # warm-up
        start, wall = time.process_time(), time.perf_counter()
        bound_shard(path, ns, verifiers=VERIFIERS if verifiers is None else verifiers)
        cpu, wall = time.process_time() - start, time.perf_counter() - wall
        rates[label] = {
            "positions": rows,
            "cpu_seconds": cpu,
            "wall_seconds": wall,
            "positions_per_cpu_s": rows / cpu,
        }
        print(label, json.dumps(rates[label]), flush=True)
    return rates


def log_smollm(path: str, positions: int = 300) -> int:
    """Log at least ``positions`` drafted positions of SmolLM2 at T = 1 (chain, gamma 4, early-exit drafter)."""
    import torch

    from executor.device import set_threads
    from executor.generate import generate
    from executor.weights import load_model
    from experiments.logformat import write_generation_log
    from experiments.prompts import humaneval_prompts

    set_threads(1)
    model, tokenizer = load_model(device="cpu", dtype=torch.float32)
    results, rows = [], 0
    for seed, prompt in enumerate(humaneval_prompts(40)):
        result = generate(
            prompt,
            model=model,
            tokenizer=tokenizer,
            decoder="chain",
            gamma=4,
            temperature=1.0,
            max_new_tokens=48,
            seed=seed,
            log_distributions="full",
        )
        results.append(result)
        rows += sum(len(step.distributions.p) for step in result.steps if step.distributions is not None)
        if rows >= positions:
            break
    return write_generation_log(results, path, temperature=1.0)


def width_table(log: str, ks, ns) -> dict:
    """Mean certified width of each quantity against k, on a full log converted to top-k in memory."""
    from experiments.log_bounds import _topk_values, quantity_names
    from experiments.logformat import LogShard

    shard = LogShard.open(log)
    p = np.concatenate([c["p"] for _, c in shard.chunks()]).astype(np.float64)
    q = np.concatenate([c["q"] for _, c in shard.chunks()]).astype(np.float64)
    p /= p.sum(1, keepdims=True)
    q /= q.sum(1, keepdims=True)
    from theory import optimal_acceptance, verifier

    names = quantity_names(ns)
    truth = {("overlap", 1): np.minimum(p, q).sum(1)}
    for n in ns:
        for draft in ("iid", "wor"):
            truth[draft, n] = optimal_acceptance(p, q, n, draft=draft)
        for name in ("nss", "naive", "rrs", "kseq", "rrs_wor"):
            if verifier(name).max_exact_vocab(n) is None:  # rrs_wor's exact value only for n <= 2 at this V
                truth[name, n] = verifier(name).acceptance(p, q, n)
    table = {"positions": len(p), "vocab_size": int(p.shape[1]), "k": {}}
    for k in ks:
        values, _, _ = _topk_values(top_k_arrays(p, q, k), p.shape[1], names)
        row = {}
        for (name, n), interval in values.items():
            entry = {
                "low": float(interval.low.mean()),
                "high": float(interval.high.mean()),
                "width": float(interval.width.mean()),
            }
            if (name, n) in truth:
                entry["truth"] = float(truth[name, n].mean())
                entry["contained"] = bool(
                    np.all((interval.low <= truth[name, n] + 1e-6) & (truth[name, n] <= interval.high + 1e-6))
                )
            row[f"{name}@{n}"] = entry
        table["k"][k] = row
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shards, one round")
    parser.add_argument("--widths", default=None, help="a full log for the width-against-k table")
    parser.add_argument(
        "--log-smollm", default=None, metavar="PATH", help="first write a SmolLM2 T = 1 log there"
    )
    parser.add_argument("--out", default="runs/bench_bound_logs.json")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--cpu-only", action="store_true", help="only the in-process CPU-time rates")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(SEED)
    report: dict = {"machine": {"cores": len(os.sched_getaffinity(0))}, "quick": args.quick}
    rounds = 1 if args.quick else 2
    scale = 1 if args.quick else 4
    cases = [  # (label, k, shards, rows per shard, ns, verifiers)
        ("full V=49152, iid+wor n=2,4,8", None, 4, 2 * scale, (2, 4, 8), ()),
        ("top-20, iid+wor n=2,4,8", 20, 4, 400 * scale, (2, 4, 8), ()),
        ("top-256, iid+wor n=2,4,8", 256, 4, 60 * scale, (2, 4, 8), ()),
        ("top-20, iid+wor n=2,4,8 + all verifiers", 20, 4, 200 * scale, (2, 4, 8), None),
    ]
    pool = (*lm_rows(rng, 64 if args.quick else 256), rng)
    if args.cpu_only:
        with tempfile.TemporaryDirectory() as scratch:
            report["cpu"] = cpu_rates(cases, pool, Path(scratch))
        fast = report["cpu"]["top-20, iid+wor n=2,4,8"]["positions_per_cpu_s"]
        report["million_top20_cpu_seconds"] = 1e6 / fast
    elif not args.skip_throughput:
        from experiments.log_bounds import VERIFIERS

        with tempfile.TemporaryDirectory() as scratch:
            report["throughput"] = {}
            for label, k, shards, rows, ns, verifiers in cases:
                folder = Path(scratch) / f"case_{len(report['throughput'])}"
                make_shards(folder, shards, rows, k, pool)
                result = timed_runs(folder, ns, VERIFIERS if verifiers is None else verifiers, rounds)
                report["throughput"][label] = result
                print(
                    label,
                    json.dumps(
                        {
                            key: result[key]
                            for key in ("positions_per_s", "scaling_2_over_1", "peak_worker_rss_mb")
                        }
                    ),
                    flush=True,
                )
        fast = report["throughput"]["top-20, iid+wor n=2,4,8"]["positions_per_s"]
        report["million_top20_seconds"] = {w: 1e6 / rate for w, rate in fast.items()}
    if args.log_smollm:
        print(f"logged {log_smollm(args.log_smollm)} positions to {args.log_smollm}")
    if args.widths:
        report["widths"] = width_table(args.widths, (1, 5, 20, 64, 256, 1024), (2, 4, 8))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
