"""``specbound bound --logs PATTERN``: alpha*, the overlap and every verifier's acceptance over log shards.

Shards (full ``(N, V)`` logs or top-k logs, ``docs/logformat.md``) are processed independently on a Dask
cluster (:mod:`experiments.sharded_bound`); the report gives, per draft law and ``n``, ``{"mean", "low",
"high"}`` (``low == high`` for full logs; for top-k logs the certified interval of the mean over every
completion, ``mean`` its midpoint), per-shard counts and the skipped shards. ``--out DIR`` writes
``report.json``, ``report.md``, ``bound_vs_n.png`` and per-shard results (an interrupted run resumes).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("log shards (--logs)")
    group.add_argument(
        "--logs",
        "--log",
        metavar="PATTERN",
        default=None,
        help="a .npz log, or a glob of .npz log shards (full or top-k)",
    )
    where = group.add_mutually_exclusive_group()
    where.add_argument(
        "--workers",
        type=int,
        default=None,
        help="LocalCluster worker processes (default 2; 0 = this process)",
    )
    where.add_argument("--scheduler", metavar="ADDRESS", default=None, help="an existing Dask scheduler")
    group.add_argument(
        "--out", metavar="DIR", default=None, help="write the report and resumable shard results"
    )
    group.add_argument(
        "--verifiers",
        nargs="*",
        default=None,
        help="verifiers to bound (default: all); none with an empty list",
    )
    group.add_argument(
        "--wor-low",
        choices=("dust", "iid"),
        default="dust",
        help="lower bound of alpha* wor on top-k logs: dust (tighter, ~1 ms/position at n = 8) or iid (fast)",
    )
    group.add_argument("--no-progress", action="store_true", help="no progress bar")


def log_options_given(args: argparse.Namespace) -> list[str]:
    """The options of :func:`add_log_arguments` other than ``--logs`` that ``args`` sets away from their
    defaults, read from the group itself so that a new option is covered too."""
    parser = argparse.ArgumentParser()
    add_log_arguments(parser)
    defaults = vars(parser.parse_args([]))
    defaults.pop("logs")
    return [
        "--" + dest.replace("_", "-") for dest, default in defaults.items() if getattr(args, dest) != default
    ]


def logged_draft_counts(pattern: str) -> list[int]:
    """The ``n`` scalars of the shards ``pattern`` matches (the drafts per step each log was taken with), so that
    without ``-n`` the report includes them; shards that cannot be opened are left to the run to report."""
    from experiments.logformat import LogError, LogShard
    from experiments.sharded_bound import find_shards

    counts = set()
    for path in find_shards(pattern):
        try:
            shard = LogShard.open(path)
        except (LogError, OSError, ValueError):
            continue
        if shard.n is not None and shard.n >= 1:
            counts.add(shard.n)
    return sorted(counts)


def run_logs(args: argparse.Namespace) -> int:
    from experiments.log_bounds import DRAFTS, VERIFIERS
    from experiments.log_report import plot, render_markdown
    from experiments.sharded_bound import run_sharded

    if args.example or args.p or args.q:
        raise ValueError("--logs reads log shards; do not combine it with --p/--q/--example")
    ns = args.n if args.n is not None else [2, 4, 8, *logged_draft_counts(args.logs)]
    if any(n < 1 for n in ns):
        raise ValueError(f"-n: drafts per step must be at least 1, got {ns}")
    ns = sorted(set(ns))
    drafts = [d for d in dict.fromkeys(args.draft) if d in DRAFTS]
    if not drafts:
        raise ValueError(f"--draft: with --logs choose among {', '.join(DRAFTS)}")
    verifiers = VERIFIERS if args.verifiers is None else list(dict.fromkeys(args.verifiers))
    unknown = [v for v in verifiers if v not in VERIFIERS]
    if unknown:
        raise ValueError(f"--verifiers: unknown {', '.join(unknown)}; choose from {', '.join(VERIFIERS)}")
    workers = 2 if args.workers is None else args.workers
    if workers < 0:
        raise ValueError(f"--workers must be >= 0, got {workers}")
    if args.out is not None:
        from experiments.commands import check_writable

        check_writable(args.out)
    report = run_sharded(
        args.logs,
        ns,
        drafts=drafts,
        verifiers=verifiers,
        workers=workers,
        scheduler=args.scheduler,
        out=args.out,
        wor_low=args.wor_low,
        progress=not args.no_progress,
    )
    shards = report["shards"]
    if shards["used"] == 0 and shards["skipped_count"] > 0:  # nothing to bound: say why, do not print n/a
        reasons = "; ".join(f"{s['shard']}: {s['error']}" for s in shards["skipped"][:3])
        more = f" (and {shards['skipped_count'] - 3} more)" if shards["skipped_count"] > 3 else ""
        raise ValueError(f"--logs: no usable log among {shards['total']}: {reasons}{more}")
    if args.out is not None:
        from executor.files import write_json, write_text

        out = Path(args.out)
        write_json(report, out / "report.json", indent=None)
        write_text(render_markdown(report), out / "report.md")
        if report["positions"] > 0:
            plot(report, out / "bound_vs_n.png")
    print(json.dumps(report, indent=2) if args.json else render_markdown(report))
    return 0
