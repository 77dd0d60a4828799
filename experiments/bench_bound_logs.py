"""Benchmark of ``bound --logs`` (docs/benchmarks/bound_logs.md).

Throughput (positions/s) on full V = 49 152 logs and on top-k logs (k = 20, 256) with 1 and 2 Dask workers
(interleaved: 1, 2, 1, 2, ... on the same shards, clusters started before timing), the scaling ratio, each
worker's peak resident memory, the scheduler's per-task overhead, and the extrapolated time for 10^6 top-20
positions (alpha* iid and wor, n = 2, 4, 8). With ``--widths LOG.npz`` (a full log, e.g. written by
``specbound generate --log-out``) it also tabulates the mean interval width against k.

    .venv/bin/python -m experiments.bench_bound_logs [--scale 0.1] [--widths runs/smollm_full.npz]
    .venv/bin/python -m experiments.bench_bound_logs --million 1000000 --shards 16 --workers 2
    .venv/bin/python -m experiments.bench_bound_logs --allocator 5000 --pool-log runs/smollm_full.npz
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from experiments.logformat import CHUNK_BYTES, top_k_arrays, write_full_log, write_topk_log

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


def pool_rows(path: str) -> tuple[np.ndarray, np.ndarray]:
    """The ``p`` and ``q`` rows of a full log (docs/logformat.md), float64, each row renormalised."""
    with np.load(path) as log:
        # Each log[name] reads (and inflates) the member again: read each once.
        p, q = (log[name].astype(np.float64) if name in log.files else None for name in ("p", "q"))
    if p is None or q is None or p.ndim != 2 or p.shape != q.shape:
        raise ValueError(f"--pool-log: {path} must hold full (N, V) arrays 'p' and 'q' of one shape")
    return p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)


def make_shards(folder: Path, shards: int, rows: int, k: int | None, pool) -> None:
    """Shards of ``rows`` positions drawn (with replacement) from a pool of full rows (LM-like or a log's)."""
    folder.mkdir(parents=True, exist_ok=True)
    p_pool, q_pool, rng = pool
    top = top_k_arrays(p_pool, q_pool, k) if k is not None else None  # the pool's top-k rows, picked below
    for index in range(shards):
        pick = rng.integers(0, len(p_pool), size=rows)
        if k is None:
            p, q = p_pool[pick], q_pool[pick]
            write_full_log(
                folder / f"shard_{index:03d}.npz", p.astype(np.float32), q.astype(np.float32), temperature=1.0
            )
        else:
            arrays = {name: values[pick] for name, values in top.items()}
            write_topk_log(folder / f"shard_{index:03d}.npz", arrays, p_pool.shape[1], temperature=1.0)


def peak_memory(client) -> dict:
    """Each worker's resident-memory high-water mark (VmHWM; ru_maxrss would include the forking parent's)."""

    def rss() -> int:
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    return client.run(rss)


def timed_shard(path, *arguments) -> dict:
    """:func:`experiments.log_bounds.safe_bound_shard` plus its CPU and wall seconds and the worker's pid."""
    from experiments.log_bounds import safe_bound_shard

    cpu, wall = time.process_time(), time.perf_counter()
    result = safe_bound_shard(path, *arguments)
    result["timing"] = {
        "cpu_seconds": time.process_time() - cpu,
        "wall_seconds": time.perf_counter() - wall,
        "pid": os.getpid(),
    }
    return result


def _warm_up() -> None:
    import experiments.log_bounds  # noqa: F401
    import theory.truncated_verifiers  # noqa: F401


def _warm_clusters(worker_counts):
    """LocalClusters started and their workers' imports done (numpy, scipy, theory: ~1 CPU-s each) before timing."""
    from distributed import Client, LocalCluster

    clusters = {
        w: LocalCluster(n_workers=w, threads_per_worker=1, dashboard_address=":0") for w in worker_counts
    }
    for cluster in clusters.values():
        with Client(cluster.scheduler_address) as client:
            client.run(_warm_up)
    return clusters


def _task_overhead(address: str, tasks: int = 500) -> float:
    """Seconds per trivial task (submit, run, gather) on a warm cluster: the scheduler's own cost."""
    from distributed import Client

    with Client(address) as client:
        client.gather(client.map(_identity, range(20), pure=False))  # connection and first-task warm-up
        start = time.perf_counter()
        client.gather(client.map(_identity, range(tasks), pure=False))
        return (time.perf_counter() - start) / tasks


def _identity(x):
    return x


def cluster_runs(folder: Path, ns, verifiers, rounds: int, wor_low: str, worker_counts=(1, 2)) -> dict:
    """1 vs 2 warm workers, interleaved (1, 2, 1, 2, ...), with per-task CPU time.

    Per run: wall seconds of ``run_sharded``; the summed task CPU seconds (the work: it must not grow with
    workers); the CPU share a busy worker got (task CPU / task wall: 1 on an idle core); the driver's overhead
    (run wall minus the busiest worker's busy time: connecting, scheduling, gathering, aggregating); the
    1-minute load average before the run. Also each worker's peak resident memory (VmHWM over all runs) and
    the scheduler's per-task overhead on the warm 2-worker cluster, both measured after the timed runs.
    """
    from distributed import Client

    from experiments.sharded_bound import run_sharded

    clusters = _warm_clusters(worker_counts)
    runs: list[dict] = []
    try:
        for round_index in range(rounds):
            for workers, cluster in clusters.items():
                load = float(Path("/proc/loadavg").read_text().split()[0])
                out = folder.parent / f"{folder.name}_out_{wor_low}_{round_index}_{workers}"
                start = time.perf_counter()
                report = run_sharded(
                    str(folder / "*.npz"),
                    ns,
                    verifiers=verifiers,
                    scheduler=cluster.scheduler_address,
                    out=out,
                    progress=False,
                    wor_low=wor_low,
                    shard_function=timed_shard,
                )
                wall = time.perf_counter() - start
                timings = [json.loads(p.read_text())["timing"] for p in (out / "shards").glob("*.json")]
                busy: dict[int, float] = {}
                for timing in timings:
                    busy[timing["pid"]] = busy.get(timing["pid"], 0.0) + timing["wall_seconds"]
                cpu = sum(t["cpu_seconds"] for t in timings)
                runs.append(
                    {
                        "workers": workers,
                        "positions": report["positions"],
                        "wall_seconds": wall,
                        "positions_per_s": report["positions"] / wall,
                        "task_cpu_seconds": cpu,
                        "positions_per_cpu_s": report["positions"] / cpu,
                        "busiest_worker_seconds": max(busy.values()),
                        "cpu_share_while_busy": cpu / sum(t["wall_seconds"] for t in timings),
                        "driver_overhead_seconds": wall - max(busy.values()),
                        "load_1min_before": load,
                    }
                )
                print(json.dumps(runs[-1]), flush=True)
        memory = {}
        for workers, cluster in clusters.items():
            with Client(cluster.scheduler_address) as client:
                memory[workers] = max(peak_memory(client).values()) / 2**20
        overhead = _task_overhead(clusters[max(clusters)].scheduler_address)
    finally:
        for cluster in clusters.values():
            cluster.close()
    median = {
        workers: {
            key: float(np.median([r[key] for r in runs if r["workers"] == workers]))
            for key in ("wall_seconds", "positions_per_s", "positions_per_cpu_s", "cpu_share_while_busy",
                        "driver_overhead_seconds")
        }
        for workers in clusters
    }  # fmt: skip
    result = {
        "runs": runs,
        "median": median,
        "peak_worker_rss_mb": memory,
        "scheduler_seconds_per_task": overhead,
    }
    if len(worker_counts) == 2:
        result["scaling_2_over_1_per_round"] = [
            a["wall_seconds"] / b["wall_seconds"] for a, b in zip(runs[::2], runs[1::2], strict=True)
        ]
        result["scaling_2_over_1"] = float(np.median(result["scaling_2_over_1_per_round"]))
    return result


def million_run(scratch: Path, positions: int, shards: int, workers: int, pool, wor_lows) -> dict:
    """``positions`` top-20 positions in ``shards`` shards, alpha* iid and wor at n = 2, 4, 8, on warm workers.

    Reports the wall time per ``wor_low`` and the extrapolation to 10^6 positions from the measured wall rate
    and from the task CPU rate on ``workers`` idle cores (plus the measured driver overhead).
    """
    folder = scratch / "million"
    make_shards(folder, shards, positions // shards, 20, pool)
    result = {"positions": positions, "shards": shards, "workers": workers}
    for wor_low in wor_lows:
        measured = cluster_runs(folder, (2, 4, 8), (), 1, wor_low, worker_counts=(workers,))
        run = measured["runs"][0]
        ideal = 1e6 / (run["positions_per_cpu_s"] * workers) + run["driver_overhead_seconds"]
        result[wor_low] = {
            **run,
            "peak_worker_rss_mb": measured["peak_worker_rss_mb"][workers],
            "million_seconds_at_measured_wall_rate": 1e6 / run["positions_per_s"],
            "million_seconds_on_idle_cores_from_cpu_rate": ideal,
        }
        print(wor_low, json.dumps(result[wor_low]), flush=True)
    return result


def cpu_rates(cases, pool, scratch: Path) -> dict:
    """Positions per CPU-second of one in-process shard per case (robust to other jobs sharing the cores)."""
    from experiments.log_bounds import VERIFIERS, bound_shard

    rates = {}
    for index, (label, k, rows, ns, verifiers, wor_low) in enumerate(cases):
        folder = scratch / f"cpu_{index}"
        make_shards(folder, 1, rows, k, pool)
        path = str(folder / "shard_000.npz")
        verifiers = VERIFIERS if verifiers is None else verifiers
        bound_shard(path, ns, verifiers=verifiers, wor_low=wor_low)  # warm-up
        start, wall = time.process_time(), time.perf_counter()
        bound_shard(path, ns, verifiers=verifiers, wor_low=wor_low)
        cpu, wall = time.process_time() - start, time.perf_counter() - wall
        rates[label] = {
            "positions": rows,
            "cpu_seconds": cpu,
            "wall_seconds": wall,
            "positions_per_cpu_s": rows / cpu,
        }
        print(label, json.dumps(rates[label]), flush=True)
    return rates


def allocator_rates(path: str, wor_lows, rounds: int) -> dict:
    """Positions per CPU-second of one shard with and without :func:`experiments.allocator.retained_heap`.

    Each run starts from a Dask worker's allocator state (``MALLOC_TRIM_THRESHOLD_=65536``, which freezes the
    mmap threshold at 128 KiB; set here with ``mallopt``) and runs in a thread, as a Dask task does. "plain"
    is the shard path without the block (main's before it), "retained" is :func:`bound_shard`; alternating,
    ``rounds`` rounds after a warm-up of each, medians of ``time.process_time``; the two summaries must be
    identical. On a C library other than glibc both are the plain path.
    """
    import threading

    from experiments import allocator
    from experiments.log_bounds import _bound_shard, bound_shard

    def dask_state() -> None:
        if allocator._LIBC is not None:
            allocator._LIBC.mallopt(allocator.M_MMAP_THRESHOLD, allocator.GLIBC_DEFAULT_THRESHOLD)
            allocator._LIBC.mallopt(allocator.M_TRIM_THRESHOLD, 65536)

    def plain(wor_low):
        return _bound_shard(path, (2, 4, 8), ("iid", "wor"), (), CHUNK_BYTES, wor_low)

    def retained(wor_low):
        return bound_shard(path, (2, 4, 8), verifiers=(), wor_low=wor_low)

    def timed(function, wor_low) -> tuple[float, dict]:
        out = {}

        def task():
            dask_state()
            start = time.process_time()
            out["result"] = function(wor_low)
            out["cpu"] = time.process_time() - start

        thread = threading.Thread(target=task)
        thread.start()
        thread.join()
        return out["cpu"], out["result"]

    rates = {}
    for wor_low in wor_lows:
        seconds: dict[str, list[float]] = {"plain": [], "retained": []}
        results = {}
        for round_index in range(rounds + 1):  # round 0 warms both up
            for label, function in (("plain", plain), ("retained", retained)):
                cpu, results[label] = timed(function, wor_low)
                if round_index:
                    seconds[label].append(cpu)
        positions = results["plain"]["positions"]
        entry = {"positions": positions, "identical": results["plain"] == results["retained"]}
        for label, values in seconds.items():
            entry[label] = {
                "cpu_seconds": values,
                "positions_per_cpu_s": positions / float(np.median(values)),
            }
        entry["retained_over_plain"] = (
            entry["retained"]["positions_per_cpu_s"] / entry["plain"]["positions_per_cpu_s"]
        )
        rates[wor_low] = entry
        print(wor_low, json.dumps(entry), flush=True)
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


def width_table(log: str, ks, ns, verifiers=None) -> dict:
    """Mean certified width of each quantity against k, on a full log converted to top-k in memory.

    ``verifiers`` (a list) restricts the table to the overlap, alpha* and those verifiers, and skips the exact
    alpha* over the full rows and the dust bound (alpha* wor's low then is the i.i.d. one; its high, which
    rrs_wor uses, does not change): the fast way to tabulate the verifiers' intervals.
    """
    from experiments.log_bounds import _topk_values, quantity_names
    from experiments.logformat import LogShard

    shard = LogShard.open(log)
    p = np.concatenate([c["p"] for _, c in shard.chunks()]).astype(np.float64)
    q = np.concatenate([c["q"] for _, c in shard.chunks()]).astype(np.float64)
    p /= p.sum(1, keepdims=True)
    q /= q.sum(1, keepdims=True)
    from theory import optimal_acceptance, verifier

    names = quantity_names(ns) if verifiers is None else quantity_names(ns, verifiers=verifiers)
    truth = {("overlap", 1): np.minimum(p, q).sum(1)}
    for n in ns:
        for draft in ("iid", "wor") if verifiers is None else ():
            truth[draft, n] = optimal_acceptance(p, q, n, draft=draft)
        for name in ("nss", "naive", "rrs", "kseq", "rrs_wor"):
            if verifiers is not None and name not in verifiers:
                continue
            if verifier(name).max_exact_vocab(n) is None:  # rrs_wor's exact value only for n <= 2 at this V
                truth[name, n] = verifier(name).acceptance(p, q, n)
    table = {"positions": len(p), "vocab_size": int(p.shape[1]), "k": {}}
    for k in ks:
        wor_low = "dust" if verifiers is None else "iid"
        values, _, _ = _topk_values(top_k_arrays(p, q, k), p.shape[1], names, wor_low)
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


#: (label, k, rows per shard with --wor-low iid, with dust); full logs do not use the wor low.
CASES = (("full V=49152", None, 8, 8), ("top-20", 20, 20_000, 1_500), ("top-256", 256, 2_000, 300))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every case's rows per shard")
    parser.add_argument("--shards", type=int, default=8, help="shards per case (and for --million)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved 1-worker / 2-worker rounds")
    parser.add_argument("--wor-low", nargs="+", choices=("dust", "iid"), default=["iid", "dust"])
    parser.add_argument("--cases", nargs="+", default=[c[0] for c in CASES], choices=[c[0] for c in CASES])
    parser.add_argument(
        "--million",
        type=int,
        default=None,
        metavar="POSITIONS",
        help="instead: POSITIONS top-20 positions (10^6 for the issue's target) on --workers warm workers",
    )
    parser.add_argument("--workers", type=int, default=2, help="for --million")
    parser.add_argument(
        "--pool-log",
        default=None,
        metavar="PATH",
        help="draw the positions from this full (N, V) .npz log's rows (e.g. a SmolLM2 log) instead of the "
        "256 LM-like pairs",
    )
    parser.add_argument("--widths", default=None, help="a full log for the width-against-k table")
    parser.add_argument(
        "--log-smollm", default=None, metavar="PATH", help="first write a SmolLM2 T = 1 log there"
    )
    parser.add_argument(
        "--width-verifiers",
        nargs="+",
        default=None,
        metavar="NAME",
        help="with --widths: only these verifiers (and alpha*'s intervals), no exact alpha* nor dust bound",
    )
    parser.add_argument("--out", default="runs/bench_bound_logs.json")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--cpu-only", action="store_true", help="only the in-process CPU-time rates")
    parser.add_argument(
        "--allocator",
        type=int,
        default=None,
        metavar="POSITIONS",
        help="instead: one top-20 shard of POSITIONS positions bounded with and without the retained heap, "
        "from a Dask worker's allocator state, --rounds alternating rounds",
    )
    args = parser.parse_args(argv)
    if args.scale <= 0 or args.shards < 1 or args.rounds < 1 or args.workers < 1 or args.allocator == 0:
        parser.error("--scale, --shards, --rounds, --workers and --allocator must be positive")
    rng = np.random.default_rng(SEED)
    report: dict = {
        "machine": {"cores": len(os.sched_getaffinity(0)), "load_1min": os.getloadavg()[0]},
        "arguments": vars(args),
    }
    pool = (*(pool_rows(args.pool_log) if args.pool_log else lm_rows(rng, 256)), rng)
    if args.million:
        with tempfile.TemporaryDirectory() as scratch:
            report["million"] = million_run(
                Path(scratch), args.million, args.shards, args.workers, pool, args.wor_low
            )
    elif args.allocator:
        with tempfile.TemporaryDirectory() as scratch:
            make_shards(Path(scratch), 1, args.allocator, 20, pool)
            report["allocator"] = allocator_rates(
                str(Path(scratch) / "shard_000.npz"), args.wor_low, args.rounds
            )
    elif args.cpu_only:
        cases = [
            (f"{label}, wor_low={wor}", k, max(1, int(rows[wor == "dust"] * args.scale)), (2, 4, 8), (), wor)
            for label, k, *rows in CASES
            if label in args.cases
            for wor in args.wor_low
        ]
        with tempfile.TemporaryDirectory() as scratch:
            report["cpu"] = cpu_rates(cases, pool, Path(scratch))
    elif not args.skip_throughput:
        report["throughput"] = {}
        with tempfile.TemporaryDirectory() as scratch:
            for index, (label, k, *rows) in enumerate(CASES):
                if label not in args.cases:
                    continue
                report["throughput"][label] = {}
                for wor_low in args.wor_low if k is not None else ["n/a"]:
                    folder = Path(scratch) / f"case_{index}_{wor_low}"
                    per_shard = max(1, int(rows[wor_low == "dust"] * args.scale))
                    make_shards(folder, args.shards, per_shard, k, pool)
                    result = cluster_runs(folder, (2, 4, 8), (), args.rounds, wor_low)
                    report["throughput"][label][wor_low] = result
                    summary = {key: result[key] for key in result if key != "runs"}
                    print(label, wor_low, json.dumps(summary), flush=True)
    if args.log_smollm:
        print(f"logged {log_smollm(args.log_smollm)} positions to {args.log_smollm}")
    if args.widths:
        report["widths"] = width_table(
            args.widths, (1, 5, 20, 64, 256, 1024), (2, 4, 8), args.width_verifiers
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
