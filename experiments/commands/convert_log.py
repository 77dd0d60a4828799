"""``specbound convert-log --top-k K IN.npz OUT.npz``: a full ``(N, V)`` log to a top-k log.

What-if for users deciding what to log: convert a full log at several ``K`` and compare the widths of
``bound --logs`` on each (``docs/logformat.md``). Rows are streamed, so memory stays bounded.
"""

from __future__ import annotations

import argparse

HELP = "convert a full (N, V) distribution log into a top-k log (docs/logformat.md)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "input", metavar="IN.npz", help="full log: arrays p, q (N, V), optional n, temperature"
    )
    parser.add_argument("output", metavar="OUT", help="top-k log to write (.npz)")
    parser.add_argument(
        "--top-k", type=int, required=True, help="entries of p (and of q) to keep per position"
    )
    parser.add_argument(
        "--draft-top-k", type=int, default=None, help="entries of q to keep (default: --top-k)"
    )
    parser.add_argument("--no-rest", action="store_true", help="do not store the remaining mass")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from experiments.commands import check_writable_file
    from experiments.logformat import LogError, LogShard, top_k_arrays, write_topk_log

    check_writable_file(args.output, "OUT")
    if args.top_k < 1:
        raise ValueError(f"--top-k must be at least 1, got {args.top_k}")
    if args.draft_top_k is not None and args.draft_top_k < 1:
        raise ValueError(f"--draft-top-k must be at least 1, got {args.draft_top_k}")
    try:
        shard = LogShard.open(args.input)
    except LogError as error:
        raise ValueError(f"IN.npz: {args.input}: {error}") from None
    if shard.kind != "full":
        raise ValueError(f"IN.npz: {args.input} is already a top-k log")
    parts, temperatures = [], []
    for start, chunk in shard.chunks():
        p, q = chunk["p"].astype(np.float64), chunk["q"].astype(np.float64)
        if not (np.all(np.isfinite(p)) and np.all(np.isfinite(q))):
            raise ValueError(f"IN.npz: rows from {start} hold NaN or infinite entries")
        parts.append(top_k_arrays(p, q, args.top_k, args.draft_top_k))
        if "temperature" in chunk:
            temperatures.append(np.asarray(chunk["temperature"], dtype=np.float64))
    arrays = {key: np.concatenate([part[key] for part in parts]) for key in parts[0]} if parts else {}
    if not parts:
        raise ValueError(f"IN.npz: {args.input} has no rows")
    if args.no_rest:
        arrays.pop("p_rest")
        arrays.pop("q_rest")
    write_topk_log(
        args.output,
        arrays,
        shard.vocab_size,
        temperature=np.concatenate(temperatures) if temperatures else None,
    )
    widths = arrays["p_ids"].shape[1], arrays["q_ids"].shape[1]
    print(
        f"wrote {args.output}: {shard.rows} positions, top-{widths[0]} of p and top-{widths[1]} of q of V = {shard.vocab_size}"
    )
    return 0
