"""``specbound plan-length``: the optimal draft-length policy for an acceptance model, and the rules in use.

The acceptance file is JSON, one of::

    0.8                                    constant acceptance (or {"alpha": 0.8})
    [0.9, 0.8, 0.7]                        per-position acceptance (or {"per_position": [...]})
    {"buckets": {"confidence": [...], "acceptance": [...], "probability": [...], "entropy": [...]}}

(``entropy`` is optional, in nats). Prints the optimal policy of the SpecDec++ MDP, its threshold, tokens per
step, cost per token and speedup, then the practical rules ranked by cost per token; ``--json`` prints the
same as JSON.

With ``--latency PROFILE.json`` (written by ``specbound profile``, docs/profile.md) the costs are this
machine's: a drafted token costs the profile's ``drafter.draft_time`` (or ``--draft-time`` seconds) and a step
that drafts at most ``K`` tokens is charged the measured time to verify ``K + 1`` tokens, ``t(K + 1)``. The
verification time grows with ``K`` while the MDP charges one constant per step, so the plan is solved for
every cap ``K`` (``1 <= K <= min(--max-length, horizon, largest measured size - 1)``) and each rule keeps the
cap that serves it best; ``t(K + 1)`` is exact for a step that drafts ``K`` tokens and an upper bound for one
that stops earlier. Speedups are then against plain decoding at the measured ``t(1)`` per token.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from experiments.commands import read_json_argument
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

HELP = "plan the draft length: the optimal stop/continue policy (SpecDec++ MDP) and ranked practical rules"
#: theory.length's parameters named otherwise than their options, for error messages (experiments.cli).
PARAMETER_OPTIONS = {"alpha": "--acceptance", "alphas": "--acceptance"}

#: Practical rules' parameters compared by default (papers' defaults and a small sweep around them).
SPECDECPP_THRESHOLDS = (0.3, 0.5, 0.7, 0.9)
KANGAROO_THRESHOLDS = (0.4, 0.6, 0.8)
MAX_FIXED_LENGTH = 16


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--acceptance", required=True, help="JSON acceptance model, a file or inline (see above)"
    )
    parser.add_argument(
        "--draft-time",
        type=float,
        default=None,
        help="time of one draft forward (unit: --target-time; seconds with --latency, default there: the "
        "profile's drafter); required without --latency",
    )
    parser.add_argument(
        "--target-time",
        type=float,
        default=None,
        help="time of one target call (default 1; not with --latency)",
    )
    parser.add_argument(
        "--latency",
        type=Path,
        default=None,
        help="a `specbound profile` JSON: measured target and drafter times replace --target-time",
    )
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
    """Read an acceptance model from a JSON file or inline JSON (formats in the module docstring)."""
    data = read_json_argument(path, "--acceptance")
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


def cap_model(model: AcceptanceModel, cap: int) -> AcceptanceModel:
    """``model`` with at most ``cap`` drafted positions (per-position models are cut; others re-read)."""
    if isinstance(model, PositionalAcceptance) and model.horizon > cap:
        return PositionalAcceptance(model.alphas[:cap])
    return model


def _policy_report(policy) -> dict:
    return {
        **asdict(policy.evaluation),
        "threshold": policy.threshold,
        "rejection_threshold": policy.rejection_threshold,
        "is_threshold_rule": policy.is_threshold_rule,
        "iterations": policy.iterations,
        "table": [asdict(row) for row in policy.table],
    }


def plan_with_latency(args: argparse.Namespace) -> dict:
    """The plan under a measured profile: solved per verification cap ``K``, charged ``t(K + 1)``."""
    from experiments.profiling import check_profile, profile_target_times

    if args.target_time is not None:
        raise ValueError(
            "--target-time and --latency exclude each other: the profile gives the target's times"
        )
    data = check_profile(read_json_argument(args.latency, "--latency"), "--latency")
    times = profile_target_times(data, "--latency")
    draft_time = args.draft_time
    if draft_time is None:
        if data.get("drafter") is None:
            raise ValueError("--latency: the profile measured no drafter; pass --draft-time in seconds")
        draft_time = data["drafter"]["draft_time"]
    full = load_acceptance_model(args.acceptance, args.max_length)
    caps = range(1, min(args.max_length, full.horizon, max(times) - 1) + 1)
    if not caps:
        raise ValueError("--latency: the profile must measure the target on at least 2 new tokens")
    plain = times[1]
    best = None
    rules: dict[str, tuple] = {}
    for cap in caps:
        model = cap_model(load_acceptance_model(args.acceptance, cap), cap)
        costs = LengthCosts(draft_time, times[cap + 1], args.discard_cost)
        policy = optimal_length_policy(model, costs)
        if best is None or policy.evaluation.cost_per_token < best[0].evaluation.cost_per_token:
            best = (policy, cap, model, costs)
        for evaluation in rank_rules(practical_rules(model), model, costs):
            if (
                evaluation.name not in rules
                or evaluation.cost_per_token < rules[evaluation.name][0].cost_per_token
            ):
                rules[evaluation.name] = (evaluation, cap)
    policy, cap, model, costs = best
    rules.setdefault(policy.evaluation.name, (policy.evaluation, cap))
    ranked = sorted(rules.values(), key=lambda item: item[0].cost_per_token)

    def rebased(evaluation, cap: int) -> dict:
        # Plain decoding pays t(1) per token, not the step's t(K + 1): speedups against the measured t(1).
        return {**asdict(evaluation), "speedup": plain / evaluation.cost_per_token, "cap": cap}

    optimal = _policy_report(policy)
    optimal.update(speedup=plain / policy.evaluation.cost_per_token, cap=cap)
    return {
        "model": repr(model),
        "costs": asdict(costs),
        "latency": {
            "file": str(args.latency),
            "dtype": data.get("dtype"),
            "drafter": (data.get("drafter") or {}).get("name"),
            "plain_time": plain,
            "cap": cap,
            "verify_time": times[cap + 1],
        },
        "optimal": optimal,
        "alternatives": [rebased(evaluation, rule_cap) for evaluation, rule_cap in ranked[: args.top]],
    }


def plan(args: argparse.Namespace) -> dict:
    if args.top < 1:
        raise ValueError(f"--top must be at least 1, got {args.top}")
    if args.latency is not None:
        return plan_with_latency(args)
    if args.draft_time is None:
        raise ValueError("--draft-time is required without --latency")
    model = load_acceptance_model(args.acceptance, args.max_length)
    target_time = 1.0 if args.target_time is None else args.target_time
    costs = LengthCosts(args.draft_time, target_time, args.discard_cost)
    policy = optimal_length_policy(model, costs)
    ranked = rank_rules([*practical_rules(model), policy], model, costs)
    return {
        "model": repr(model),
        "costs": asdict(costs),
        "optimal": _policy_report(policy),
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
    ]
    latency = result.get("latency")
    if latency:
        lines.append(
            f"measured ({latency['file']}, {latency['dtype']}, drafter {latency['drafter']}): plain decoding "
            f"{latency['plain_time'] * 1e3:.2f} ms/token; best cap K = {latency['cap']} drafted tokens, verified in "
            f"{latency['verify_time'] * 1e3:.2f} ms; speedups are against plain decoding"
        )
    lines += [
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
