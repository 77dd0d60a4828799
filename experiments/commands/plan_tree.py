"""``specbound plan-tree``: the token tree to verify, for an acceptance vector and (optionally) the hardware.

Without ``--latency`` it prints Sequoia's optimal tree for the budget and, as alternatives, the optimal trees
of smaller depths; the speedup then assumes verification time flat in the tree size (memory-bound target)
and ``--draft-time`` in units of one target pass. With ``--latency`` it runs the hardware-aware planner; the
latency file may be the JSON written by ``specbound profile`` (docs/profile.md), whose target times are
interpolated to every size up to the largest measured and whose drafter's level time is the default
``--draft-time``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from experiments.commands import read_json_argument
from theory.tree_planning import TREE_COST_CONVENTIONS, TreePlan, plan_tree

HELP = "plan a speculative token tree: Sequoia's optimal tree for an acceptance vector and a latency table"
#: theory.plan_tree's parameters named otherwise than their options, for error messages (experiments.cli).
PARAMETER_OPTIONS = {"acc": "--acceptance", "max_budget": "--budget"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--acceptance",
        required=True,
        help="JSON file or inline JSON: a list p_1..p_W (p_k = probability the k-th child is accepted, "
        "sum <= 1), a list of such lists (one per depth), or an object with an 'acceptance' key",
    )
    parser.add_argument("--budget", required=True, type=int, help="largest tree size, root included")
    parser.add_argument(
        "--latency",
        type=Path,
        help='JSON file: the output of `specbound profile`, or {"n": seconds to verify n tokens, ...} or '
        '{"sizes": [...], "times": [...]} (must include n = 1). Without it the verification time is taken as '
        "flat (1 per step).",
    )
    parser.add_argument(
        "--draft-time",
        type=float,
        default=None,
        help="seconds per draft forward pass (one per drafted level); without --latency, in units of one "
        "target pass. Default: the profile's drafter level time with a `specbound profile` --latency file, "
        "else 0",
    )
    parser.add_argument(
        "--step-overhead",
        type=float,
        default=0.0,
        help="seconds a drafting step spends beyond its forward passes (masks, probabilities, verification; "
        "`specbound bench` measures it), in the units of --draft-time (default 0, Sequoia's formula)",
    )
    parser.add_argument(
        "--plain-overhead",
        type=float,
        default=0.0,
        help="the same for a plain decoding step, added to the baseline (default 0)",
    )
    parser.add_argument("--max-depth", type=int, default=16, help="most drafted levels (default 16)")
    parser.add_argument("--max-width", type=int, default=None, help="most children per node (default: W)")
    parser.add_argument(
        "--convention",
        choices=TREE_COST_CONVENTIONS,
        default="drafted-levels",
        help="draft passes charged per tree: its drafted levels (default) or levels with the root, as the "
        "Sequoia repository's tree_search.py",
    )
    parser.add_argument("--top", type=int, default=5, help="alternatives to list (default 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def read_acceptance(path: str) -> np.ndarray:
    data = read_json_argument(path, "--acceptance")
    if isinstance(data, dict):
        if "acceptance" not in data:
            raise ValueError(f"--acceptance: {path} is an object without an 'acceptance' key")
        data = data["acceptance"]
    try:
        return np.asarray(data, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(
            f"--acceptance: {path} must hold a list of numbers or a list of equal-length lists"
        ) from None


def read_latency_file(path: Path) -> tuple[dict[int, float], float | None]:
    """The verification-time table of a ``--latency`` file and, for a profile with a drafter, its level time.

    A ``specbound profile`` file gives its median target times interpolated to every size up to the largest
    measured (:func:`experiments.profiling.profile_target_times`) and the drafter's ``level_time``; the older
    formats give their table as is and no draft time.
    """
    from experiments.profiling import is_profile, profile_target_times

    data = read_json_argument(path, "--latency")
    if is_profile(data):
        drafter = data.get("drafter")
        return profile_target_times(data, "--latency"), (drafter["level_time"] if drafter else None)
    return _latency_table(data), None


def read_latency(path: Path) -> dict[int, float]:
    """The verification-time table ``{n: seconds}`` of a ``--latency`` file (any supported format)."""
    return read_latency_file(path)[0]


def _latency_table(data) -> dict[int, float]:
    if isinstance(data, dict) and set(data) == {"sizes", "times"}:
        if (
            not isinstance(data["sizes"], list)
            or not isinstance(data["times"], list)
            or len(data["sizes"]) != len(data["times"])
        ):
            raise ValueError("--latency: 'sizes' and 'times' must be lists of the same length")
        pairs = zip(data["sizes"], data["times"], strict=True)
    elif isinstance(data, dict):
        pairs = data.items()
    else:
        raise ValueError("--latency: expected an object {n: seconds} or {'sizes': [...], 'times': [...]}")
    table = {}
    for size, seconds in pairs:
        try:
            size_int = int(size)
        except (TypeError, ValueError):
            raise ValueError(f"--latency: size {size!r} is not an integer") from None
        if str(size_int) != str(size).strip():
            raise ValueError(f"--latency: size {size!r} is not an integer")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ValueError(f"--latency: time for {size} tokens must be a number, got {seconds!r}")
        table[size_int] = seconds
    return table


def make_plan(args: argparse.Namespace) -> TreePlan:
    acc = read_acceptance(args.acceptance)
    profiled_draft_time = None
    if args.latency is None:
        target_time = lambda n: 1.0  # noqa: E731 - flat verification: the memory-bound regime
    else:
        target_time, profiled_draft_time = read_latency_file(args.latency)
    if args.draft_time is None:
        args.draft_time = profiled_draft_time if profiled_draft_time is not None else 0.0
    return plan_tree(
        acc,
        target_time,
        args.draft_time,
        max_budget=args.budget,
        max_depth=args.max_depth,
        max_width=args.max_width,
        convention=args.convention,
        step_overhead=args.step_overhead,
        plain_overhead=args.plain_overhead,
    )


def _alternatives(plan: TreePlan, top: int, flat: bool):
    # With flat verification every smaller tree is dominated; list the other depths at the chosen size.
    return [c for c in plan.alternatives[1:] if not flat or c.size == plan.size][:top]


def run(args: argparse.Namespace) -> int:
    if args.top < 0:
        raise ValueError(f"--top must be non-negative, got {args.top}")
    plan = make_plan(args)
    alternatives = _alternatives(plan, args.top, flat=args.latency is None)
    report = {
        "tree": json.loads(plan.tree.to_json()),
        "size": plan.size,
        "depth": plan.depth,
        "level_sizes": plan.tree.level_sizes().tolist(),
        "expected_tokens": plan.expected_tokens,
        "step_time": plan.step_time,
        "speedup": plan.speedup,
        "draft_time": args.draft_time,
        "step_overhead": args.step_overhead,
        "plain_overhead": args.plain_overhead,
        "convention": plan.convention,
        "latency": "flat (1 per step)" if args.latency is None else str(args.latency),
        "alternatives": [
            {
                "size": c.size,
                "depth": c.depth,
                "expected_tokens": c.expected_tokens,
                "step_time": c.step_time,
                "speedup": c.speedup,
            }
            for c in alternatives
        ],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"Chosen tree: {plan.size} nodes, depth {plan.depth}, levels {report['level_sizes']}")
    print(f"Expected tokens per step: {plan.expected_tokens:.4f}")
    print(
        f"Predicted speedup: {plan.speedup:.3f}x "
        f"(step time {plan.step_time:.4g}, latency {report['latency']},"
    )
    print(
        f"  draft time {args.draft_time:g} per level, overheads {args.step_overhead:g} per step and "
        f"{args.plain_overhead:g} per plain step, convention {plan.convention})"
    )
    print()
    print(plan.tree.ascii())
    print()
    print(f"JSON: {plan.tree.to_json()}")
    if alternatives:
        print()
        print("Top alternatives:")
        print(f"{'size':>6} {'depth':>6} {'tokens/step':>12} {'step time':>10} {'speedup':>8}")
        for c in alternatives:
            print(
                f"{c.size:>6} {c.depth:>6} {c.expected_tokens:>12.4f} {c.step_time:>10.4g} {c.speedup:>7.3f}x"
            )
    return 0
