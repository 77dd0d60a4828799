"""``specbound bound``: the optimal multi-draft acceptance and every verifier's exact acceptance for logged
target/draft distributions (``--logs PATTERN``: over full or top-k log shards on a Dask cluster, see
:mod:`experiments.commands.bound_logs`).

For each draft law it prints the optimal acceptance alpha* (Hu et al., ICLR 2025, arXiv 2502.18779), and for
each verifier of :mod:`theory.verifiers` its draft law, its exact acceptance alpha and its efficiency
alpha / alpha* against the optimum of its own draft law. A ``(B, V)`` batch of pairs reports means
(efficiency = mean alpha / mean alpha*); ``--json`` adds the per-row values.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.commands import read_json_argument

HELP = "optimal multi-draft acceptance and each verifier's exact acceptance for a target/draft pair"

#: The pair analysed by ``--example`` (see experiments/data/make_example.py).
EXAMPLE = Path(__file__).resolve().parents[1] / "data" / "example_pair.npz"
DRAFT_CHOICES = ("iid", "wor", "greedy", "spechub")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--p",
        metavar="P",
        help="target distribution(s): a .npy, .npz, JSON or whitespace-text file, or inline JSON ('[0.5, 0.3, 0.2]')",
    )
    parser.add_argument("--q", metavar="Q", help="draft distribution(s), same forms and vocabulary as --p")
    parser.add_argument("--example", action="store_true", help="analyse the shipped example pair (V = 1000)")
    parser.add_argument(
        "-n",
        type=int,
        nargs="+",
        default=None,
        help="drafts per step (default 4; several values give one table each, or a JSON list; "
        "with --logs, default 2 4 8 and each log's own n)",
    )
    parser.add_argument(
        "--draft",
        nargs="+",
        choices=DRAFT_CHOICES,
        default=list(DRAFT_CHOICES),
        help="draft laws to tabulate alpha* for (default: all)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (with per-row values) instead")
    from experiments.commands.bound_logs import add_log_arguments

    add_log_arguments(parser)


def load_vector(path: str, argument: str, key: str):
    """Read probabilities from .npy, .npz (array ``key``, or its only array), JSON or whitespace text, or from
    ``path`` itself as inline JSON where no such file exists."""
    import numpy as np

    file = Path(path)
    if not file.exists():
        return _as_array(read_json_argument(path, argument), argument, path)
    if not file.is_file():
        raise ValueError(f"{argument}: {path!r} is not a file")
    try:
        if file.suffix == ".npy":
            return np.load(file, allow_pickle=False)
        if file.suffix == ".npz":
            with np.load(file, allow_pickle=False) as archive:
                if key in archive.files:
                    return archive[key]
                if len(archive.files) == 1:
                    return archive[archive.files[0]]
                raise ValueError(
                    f"{argument}: {path!r} holds {archive.files}; expected an array named {key!r}"
                )
        text = file.read_text()
        if file.suffix == ".json" or text.lstrip().startswith("["):
            return _as_array(json.loads(text), argument, path)
        return np.loadtxt(file, dtype=np.float64, ndmin=1)
    except ValueError as error:
        if str(error).startswith(argument):
            raise
        raise ValueError(f"{argument}: cannot read {path!r}: {error}") from None
    except OSError as error:
        raise ValueError(f"{argument}: cannot read {path!r}: {error}") from None


def _as_array(data, argument: str, path: str):
    """Parsed JSON as a float64 array; ``ValueError`` naming ``argument`` for anything but numbers in a
    (nested, rectangular) list."""
    import numpy as np

    try:
        return np.asarray(data, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{argument}: {path!r} is not a list of numbers (or a list of such lists)") from None


def analyse(p, q, n: int, drafts) -> dict:
    """Every number the command prints, as a JSON-ready dict (means plus per-row lists)."""
    import numpy as np

    from theory import optimal_acceptance, verifier
    from theory.checks import as_count, as_distribution_pair
    from theory.verifier_table import draft_count_problem
    from theory.verifiers import VERIFIERS

    p, q = as_distribution_pair(p, q)
    n = as_count(n, "n")

    def summary(values) -> dict:
        values = np.atleast_1d(np.asarray(values, dtype=np.float64))
        return {"mean": float(values.mean()), "per_row": values.tolist()}

    optima: dict[str, dict] = {}
    support = int(np.count_nonzero(q > 0, axis=-1).min())

    def unavailable(draft: str) -> str | None:
        """Why the draft law cannot draw ``n`` drafts here (the cell's note), or ``None``."""
        if draft == "spechub" and n != 2:
            return "n/a (SpecHub needs n = 2)"
        if draft_count_problem(draft, n, support) is not None:  # distinct drafts from too few tokens
            return f"n/a (n distinct drafts; {'a row of ' if q.ndim > 1 else ''}q has {support} tokens > 0)"
        return None

    def optimum(draft: str) -> dict:
        if draft not in optima:
            note = unavailable(draft)
            optima[draft] = {"note": note} if note else summary(optimal_acceptance(p, q, n, draft=draft))
        return optima[draft]

    table = {draft: optimum(draft) for draft in drafts}
    verifiers = {}
    for name in VERIFIERS:
        v = verifier(name)
        entry: dict = {"draft": v.draft}
        limit = v.max_exact_vocab(n)
        if unavailable(v.draft):
            entry["note"] = unavailable(v.draft)
        elif limit is not None and p.shape[-1] > limit:
            entry["note"] = f"n/a (exact method needs V <= {limit} for n = {n})"
        else:
            entry["acceptance"] = summary(v.acceptance(p, q, n))
            best = optimum(v.draft)
            entry["efficiency"] = entry["acceptance"]["mean"] / best["mean"] if best["mean"] > 0 else 1.0
            entry["efficiency_per_row"] = [
                a / b if b > 0 else 1.0
                for a, b in zip(entry["acceptance"]["per_row"], best["per_row"], strict=True)
            ]
        verifiers[name] = entry
    return {
        "vocab_size": int(p.shape[-1]),
        "rows": int(np.prod(p.shape[:-1], dtype=np.int64)),
        "n": n,
        "single_draft_acceptance": summary(np.minimum(p, q).sum(axis=-1)),
        "optimal": table,
        "verifiers": verifiers,
    }


def format_table(result: dict, source: str) -> str:
    def cell(entry: dict, key: str = "mean") -> str:
        return entry["note"] if "note" in entry else f"{entry[key]:.6f}"

    rows = result["rows"]
    lines = [
        f"{source}: V = {result['vocab_size']}, n = {result['n']}, {rows} pair{'s' if rows > 1 else ''}"
        + (" (means over rows)" if rows > 1 else ""),
        f"single-draft acceptance sum(min(p, q)) = {result['single_draft_acceptance']['mean']:.6f}",
        "",
        f"{'draft law':<10} {'optimal acceptance alpha*':<28}",
    ]
    lines += [f"{draft:<10} {cell(entry):<28}" for draft, entry in result["optimal"].items()]
    lines += ["", f"{'verifier':<10} {'draft':<8} {'acceptance':<44} {'alpha / alpha*(draft)':<10}"]
    for name, entry in result["verifiers"].items():
        if "note" in entry:
            lines.append(f"{name:<10} {entry['draft']:<8} {entry['note']:<44} {'-':<10}")
        else:
            acceptance = f"{entry['acceptance']['mean']:.6f}"
            lines.append(f"{name:<10} {entry['draft']:<8} {acceptance:<44} {entry['efficiency']:.4f}")
    return "\n".join(line.rstrip() for line in lines)


def run(args: argparse.Namespace) -> int:
    if args.logs is not None:
        from experiments.commands.bound_logs import run_logs

        return run_logs(args)
    from experiments.commands.bound_logs import log_options_given

    given = log_options_given(args)
    if given:
        raise ValueError(f"{', '.join(given)} apply to --logs only; a single pair prints its table")
    counts = list(dict.fromkeys(args.n or [4]))
    if args.example and (args.p or args.q):
        raise ValueError("--example analyses the shipped pair; do not combine it with --p/--q")
    if args.example:
        p, q = load_vector(str(EXAMPLE), "--example", "p"), load_vector(str(EXAMPLE), "--example", "q")
        source = f"example pair ({EXAMPLE.name})"
    elif args.p and args.q:
        p, q = load_vector(args.p, "--p", "p"), load_vector(args.q, "--q", "q")
        source = f"{args.p} vs {args.q}"
    else:
        raise ValueError("give both --p and --q (or --example)")
    results = [analyse(p, q, n, list(dict.fromkeys(args.draft))) for n in counts]
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    else:
        print("\n\n".join(format_table(result, source) for result in results))
    return 0
