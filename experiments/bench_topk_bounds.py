"""In-process CPU rates of the top-k bounds, this tree's ``theory`` against an older commit's, interleaved.

The older ``theory/`` is extracted from git (``git archive``) into a temporary package ``oldtheory`` (its
``theory`` imports renamed) and loaded next to the current one; both bound the same top-k chunks of the LM-like
pairs of :mod:`experiments.bench_bound_logs` (overlap, alpha* iid and wor at n = 2, 4, 8: the default work of
``bound --logs`` per position), in blocks of ``TOPK_BLOCK_ROWS`` rows as ``bound --logs`` reads them, rounds
alternating old / new, each timed with the thread's CPU clock (``time.thread_time``). Also checks that the two
agree where they should (every i.i.d. quantity bit for bit) and how the without-replacement lows moved.

    nice -n 19 .venv/bin/python -m experiments.bench_topk_bounds --old acf5faa --out runs/bench_topk_bounds.json
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from experiments.bench_bound_logs import SEED, lm_rows
from experiments.log_bounds import TOPK_BLOCK_ROWS
from experiments.logformat import top_k_arrays

NS = (2, 4, 8)


def load_old_theory(ref: str, folder: Path):
    """``theory/`` of git ``ref`` as the package ``oldtheory`` (imports renamed), imported from ``folder``."""
    root = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "archive", ref, "theory"], cwd=root, capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    (folder / "theory").rename(folder / "oldtheory")
    for path in (folder / "oldtheory").glob("*.py"):
        text = re.sub(r"\b(from|import) theory\b", r"\1 oldtheory", path.read_text())
        path.write_text(re.sub(r"\btheory\.", "oldtheory.", text))
    sys.path.insert(0, str(folder))
    return importlib.import_module("oldtheory.truncated")


def bound_positions(truncated, blocks, vocab: int, wor_low: str) -> dict:
    """Every interval ``bound --logs`` computes by default, per block; returns ``{(name, n): (low, high)}``."""
    out: dict = {}
    for block in blocks:
        positions = truncated.top_k_positions(*block[:4], vocab, p_rest=block[4], q_rest=block[5])
        results = {("overlap", 1): truncated.overlap_interval(positions)}
        for n in NS:
            results["iid", n] = truncated.optimal_acceptance_interval(positions, n, draft="iid")
            results["wor", n] = truncated.optimal_acceptance_interval(
                positions, n, draft="wor", wor_low=wor_low
            )
        for key, interval in results.items():
            low, high = out.setdefault(key, ([], []))
            low.append(interval.low)
            high.append(interval.high)
    return {key: (np.concatenate(low), np.concatenate(high)) for key, (low, high) in out.items()}


def make_blocks(k: int, rows: int, rng, pool, every: bool = False) -> list:
    """``rows`` top-``k`` positions drawn from the pool (or, with ``every``, each pool row once), as
    (ids, values) arrays plus the logged rest masses, in blocks."""
    p_pool, q_pool = pool
    top = top_k_arrays(p_pool, q_pool, k)
    pick = np.arange(len(p_pool)) if every else rng.integers(0, len(p_pool), size=rows)
    arrays = [
        top["p_ids"][pick].astype(np.int64),
        np.exp(top["p_logprobs"][pick].astype(np.float64)),
        top["q_ids"][pick].astype(np.int64),
        np.exp(top["q_logprobs"][pick].astype(np.float64)),
        top["p_rest"][pick],
        top["q_rest"][pick],
    ]
    return [[a[s : s + TOPK_BLOCK_ROWS] for a in arrays] for s in range(0, len(pick), TOPK_BLOCK_ROWS)]


def read_full_log(path: str):
    """(p, q) float64 rows of a full log, renormalised (as ``bound --logs`` reads them)."""
    from experiments.logformat import LogShard

    shard = LogShard.open(path)
    p = np.concatenate([chunk["p"] for _, chunk in shard.chunks()]).astype(np.float64)
    q = np.concatenate([chunk["q"] for _, chunk in shard.chunks()]).astype(np.float64)
    return p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)


def compare(old: dict, new: dict) -> dict:
    """Bitwise agreement of the i.i.d. quantities; the largest moves of the without-replacement ones."""
    report = {}
    for key in old:
        (old_low, old_high), (new_low, new_high) = old[key], new[key]
        name = f"{key[0]}@{key[1]}"
        report[name] = {
            "identical": bool(np.array_equal(old_low, new_low) and np.array_equal(old_high, new_high)),
            "low_change_min": float(np.min(new_low - old_low)),
            "low_change_max": float(np.max(new_low - old_low)),
            "high_change_max_abs": float(np.max(np.abs(new_high - old_high))),
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="acf5faa", help="git ref of the theory/ to compare against")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved old / new rounds per case")
    parser.add_argument(
        "--rows",
        type=int,
        nargs=2,
        default=(4096, 1024),
        metavar=("TOP20", "TOP256"),
        help="ignored with --full-log",
    )
    parser.add_argument(
        "--full-log",
        default=None,
        metavar="NPZ",
        help="instead of the LM-like pairs: every row of this full (N, V) log, converted to top-k in memory",
    )
    parser.add_argument(
        "--top-k", type=int, nargs="+", choices=(20, 256), default=(20, 256), help="which top-k cases to run"
    )
    parser.add_argument(
        "--wor-low", nargs="+", choices=("iid", "dust"), default=("iid", "dust"), help="which wor lows to run"
    )
    parser.add_argument("--out", default="runs/bench_topk_bounds.json")
    args = parser.parse_args(argv)
    if args.rounds < 1 or min(args.rows) < 1:
        parser.error("--rounds and --rows must be positive")
    import theory.truncated as new_truncated

    rng = np.random.default_rng(SEED)
    pool = lm_rows(rng, 256) if args.full_log is None else read_full_log(args.full_log)
    vocab = pool[0].shape[1]
    report: dict = {"machine": {"load_1min_start": os.getloadavg()[0]}, "arguments": vars(args), "cases": {}}
    with tempfile.TemporaryDirectory() as scratch:
        old_truncated = load_old_theory(args.old, Path(scratch))
        implementations = {"old": old_truncated, "new": new_truncated}
        for k, rows in zip((20, 256), args.rows, strict=True):
            blocks = make_blocks(k, rows, rng, pool, every=args.full_log is not None)
            if k not in args.top_k:  # (its rows drawn all the same: the other case's rows do not change)
                continue
            rows = sum(len(block[0]) for block in blocks)
            for wor_low in ("iid", "dust"):
                if wor_low not in args.wor_low:
                    continue
                label = f"top-{k}, wor_low={wor_low}"
                seconds: dict = {name: [] for name in implementations}
                values = {}
                for name, module in implementations.items():  # warm-up, and the values compared
                    values[name] = bound_positions(module, blocks[:1], vocab, wor_low)
                for _ in range(args.rounds):
                    for name, module in implementations.items():
                        start = time.thread_time()
                        values[name] = bound_positions(module, blocks, vocab, wor_low)
                        seconds[name].append(time.thread_time() - start)
                rates = {name: rows / float(np.median(s)) for name, s in seconds.items()}
                report["cases"][label] = {
                    "positions": rows,
                    "cpu_seconds": seconds,
                    "positions_per_cpu_s": rates,
                    "speedup": rates["new"] / rates["old"],
                    "million_cpu_seconds": {name: 1e6 / rate for name, rate in rates.items()},
                    "agreement": compare(values["old"], values["new"]),
                }
                print(
                    label,
                    json.dumps({k: report["cases"][label][k] for k in ("positions_per_cpu_s", "speedup")}),
                )
    report["machine"]["load_1min_end"] = os.getloadavg()[0]
    from executor.files import write_json

    write_json(report, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
