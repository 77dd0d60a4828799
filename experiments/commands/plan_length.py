"""``specbound plan-length``: the optimal draft-length policy for an acceptance model, and the rules in use.

The acceptance file is JSON, one of::

    0.8                                    constant acceptance (or {"alpha": 0.8})
    [0.9, 0.8, 0.7]                        per-position acceptance (or {"per_position": [...]})
    {"buckets": {"confidence": [...], "acceptance": [...], "probability": [...], "entropy": [...]}}

(``entropy`` is optional, in nats). Prints the optimal policy of the SpecDec++ MDP, its threshold, tokens per
step, cost per token and speedup, then the practical rules ranked by cost per token; ``--json`` prints the
same as JSON.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from theory.length import (
    AcceptanceModel,
    ConfidenceBuckets,
    IIDAcceptance,
    LengthCosts,
    PositionalAcceptance,
    entropy_stop,
    fixed_length_rule,
    heuristic_schedule,
    kangaroo_confidence_stop,
    optimal_length_policy,
    rank_rules,
    specdecpp_threshold,
)

HELP = "Plan the draft length: optimal stop/continue policy (SpecDec++ MDP) and ranked practical rules."

#: Practical rules' parameters compared by default (papers' defaults and a small sweep around them).
SPECDECPP_THRESHOLDS = (0.3, 0.5, 0.7, 0.9)
KANGAROO_THRESHOLDS = (0.4, 0.6, 0.8)
MAX_FIXED_LENGTH = 16


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--acceptance", required=True, type=Path, help="JSON acceptance model (see above)")
    parser.add_argument(
        "--draft-time", required=True, type=float, help="time of one draft forward (unit: --target-time)"
    )
    parser.add_argument("--target-time", type=float, default=1.0, help="time of one target call (default 1)")
    parser.add_argument(
        "--discard-cost", type=float, default=0.0, help="extra cost per discarded draft token (default 0)"
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=32,
        help="cap on drafted tokens for i.i.d./bucket models (default 32)",
    )
    parser.add_argument("--top", type=int, default=10, help="alternatives to print (default 10)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def load_acceptance_model(path: Path, max_length: int) -> AcceptanceModel:
    """Read an acceptance model from a JSON file (formats in the module docstring)."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise ValueError(f"acceptance: cannot read {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"acceptance: {path} is not valid JSON: {error}") from None
    if isinstance(data, dict) and "alpha" in data:
        data = data["alpha"]
    if isinstance(data, dict) and "per_position" in data:
        data = data["per_position"]
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return IIDAcceptance(float(data), max_length=max_length)
    if isinstance(data, list):
        return PositionalAcceptance(data)
    if isinstance(data, dict) and isinstance(data.get("buckets"), dict):
        buckets = data["buckets"]
        missing = {"confidence", "acceptance", "probability"} - set(buckets)
        if missing:
            raise ValueError(f"acceptance: buckets need the keys {sorted(missing)}")
        return ConfidenceBuckets(
            buckets["confidence"],
            buckets["acceptance"],
            buckets["probability"],
            entropies=buckets.get("entropy"),
            max_length=max_length,
        )
    raise ValueError(
        "acceptance must be a number, a list of per-position rates, or an object with 'alpha', "
        "'per_position' or 'buckets'"
    )


def practical_rules(model: AcceptanceModel) -> list:
    """The rules compared against the optimum: fixed K, the HF schedule, SpecDec++, Kangaroo, entropy
    stops."""
    rules = [fixed_length_rule(k) for k in range(1, min(model.horizon, MAX_FIXED_LENGTH) + 1)]
    rules.append(heuristic_schedule())
    rules += [specdecpp_threshold(h) for h in SPECDECPP_THRESHOLDS]
    rules += [kangaroo_confidence_stop(eta) for eta in KANGAROO_THRESHOLDS]
    if model.law(1).entropy is not None:
        rules.append(entropy_stop(0.7, coefficient=0.15))  # SVIP's default
        rules.append(entropy_stop(0.5, coefficient=0.2))  # AdaEDL's bound with a mid-range lambda
    return rules


def plan(args: argparse.Namespace) -> dict:
    if args.top < 1:
        raise ValueError(f"top must be at least 1, got {args.top}")
    model = load_acceptance_model(args.acceptance, args.max_length)
    costs = LengthCosts(args.draft_time, args.target_time, args.discard_cost)
    policy = optimal_length_policy(model, costs)
    ranked = rank_rules([*practical_rules(model), policy], model, costs)
    return {
        "model": repr(model),
        "costs": asdict(costs),
        "optimal": {
            **asdict(policy.evaluation),
            "threshold": policy.threshold,
            "rejection_threshold": policy.rejection_threshold,
            "is_threshold_rule": policy.is_threshold_rule,
            "iterations": policy.iterations,
            "table": [asdict(row) for row in policy.table],
        },
        "alternatives": [asdict(evaluation) for evaluation in ranked[: args.top]],
    }


def _summary_lines(table: list[dict]) -> list[str]:
    """Per drafted length: how many states continue, and the smallest prob_all_accepted that continues."""
    lines = []
    for drafted in sorted({row["drafted"] for row in table}):
        rows = [row for row in table if row["drafted"] == drafted]
        go = [row["prob_all_accepted"] for row in rows if row["continue_drafting"]]
        if not go:
            lines.append(f"  after {drafted:2d} drafted: stop")
            break
        lines.append(
            f"  after {drafted:2d} drafted: continue in {len(go)}/{len(rows)} states"
            f" (those with P(all accepted) >= {min(go):.4f})"
        )
    return lines


def format_report(result: dict) -> str:
    optimal = result["optimal"]
    costs = result["costs"]
    lines = [
        f"acceptance model: {result['model']}",
        f"costs: draft {costs['draft_time']:g}, target {costs['target_time']:g}, "
        f"discarded token {costs['discard_cost']:g}",
        "",
        "optimal policy (SpecDec++ MDP, solved exactly by Dinkelbach + backward induction):",
        f"  threshold rule: {'yes' if optimal['is_threshold_rule'] else 'no'}; continue while "
        f"P(some token rejected, counting the next) < h* = {optimal['threshold']:.4f}",
    ]
    if optimal["rejection_threshold"] is not None:
        lines.append(
            f"  as a SpecDec++ threshold on the drafted tokens: h = {optimal['rejection_threshold']:.4f}"
        )
    lines += _summary_lines(optimal["table"])
    lines += [
        f"  expected tokens per step {optimal['tokens_per_step']:.4f}, drafted per step "
        f"{optimal['drafted_per_step']:.4f}",
        f"  cost per token {optimal['cost_per_token']:.5f}, speedup {optimal['speedup']:.4f}x",
        "",
        "ranked rules (cheapest cost per token first):",
        f"  {'rank':>4}  {'rule':<24} {'tokens/step':>11} {'drafted':>8} {'cost/token':>10} {'speedup':>8}",
    ]
    for rank, row in enumerate(result["alternatives"], start=1):
        lines.append(
            f"  {rank:>4}  {row['name']:<24} {row['tokens_per_step']:>11.4f} {row['drafted_per_step']:>8.3f}"
            f" {row['cost_per_token']:>10.5f} {row['speedup']:>7.4f}x"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    result = plan(args)
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0
