"""Report of an a-priori run: ``results.json`` (one row per configuration and temperature), ``report.md`` and the
plots, rebuilt from the units on disk.

The predictions are recomputed here from the calibration units and the latency profile only (and must equal
``predictions-T*.json``, written before the evaluation ran); the evaluation units feed the measured columns,
the replay column and the diagnosis, never the predictions.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np

from experiments.apriori.calibrate import Calibration, LatencyProfile, calibrate, shallow_profile
from experiments.apriori.compare import (
    chance_within,
    diagnose,
    difference_interval,
    expand,
    interval,
    position_intervals,
    ratio_samples,
    speedup_samples,
    unbiased_spread,
    within_ci,
    within_floor,
)
from experiments.apriori.predict import DecoderConfig, predict

__all__ = ["build_report", "evaluate_rows", "render_markdown"]

#: A speedup prediction counts as good within this relative distance of the measurement.
SPEEDUP_TOLERANCE = 0.10

SECTIONS = (
    "## Settings",
    "## Calibration",
    "## Predicted against measured",
    "## Acceptance by position",
    "## Where predictions miss",
    "## Multi-draft: optimal against achieved acceptance",
    "## Speedup against tree budget",
    "## Plots",
)


def _pad(values, size: int) -> list[float]:
    values = list(values)[:size]
    return values + [0.0] * (size - len(values))


def _replay(units: list[dict]) -> tuple[float, float]:
    """Replay check: ``1 + Σπ / steps`` on the evaluation run's own logged distributions, and its z-score."""
    replay = np.array([r["replay"] for u in units for r in u["records"]], dtype=np.float64)
    accepted = np.array([r["accepted"] for u in units for r in u["records"]], dtype=np.float64)
    steps = sum(u["steps"] for u in units)
    variance = float(np.sum(replay * (1 - replay)))
    gap = float(np.sum(accepted - replay))
    z = gap / math.sqrt(variance) if variance > 0 else (0.0 if abs(gap) < 1e-9 else math.inf)
    return 1.0 + float(replay.sum()) / steps, z


def baseline_of(unit: dict, ar_unit: dict) -> dict:
    """The plain decoding a unit's speedup is measured against: the runs that bracketed it (tokens, steps and
    seconds summed), or, for a unit recorded without them, the prompt's plain-decoding unit."""
    references = unit.get("reference")
    if not references:
        return ar_unit
    return {key: sum(r[key] for r in references) for key in references[0]}


def bracket_spread(units) -> dict | None:
    """How far plain decoding's speed moved across each evaluation unit: ``|ln(v_before / v_after)|`` of the two
    plain-decoding runs that bracketed it. Returns the units counted, ``median_change`` (the median as a relative
    change, ``e^median - 1``) and ``over_10pct`` (units whose brackets differ by more than 10%); ``None`` when no
    unit has both brackets. On a machine whose speed moves by 10% within seconds, a speedup cannot be measured to
    10% (docs/validate.md)."""
    moves = []
    for unit in units:
        references = unit.get("reference") or []
        if len(references) == 2 and all(r["tokens"] > 0 and r["seconds"] > 0 for r in references):
            before, after = (r["tokens"] / r["seconds"] for r in references)
            moves.append(abs(math.log(before / after)))
    if not moves:
        return None
    return {
        "units": len(moves),
        "median_change": math.expm1(float(np.median(moves))),
        "over_10pct": int(np.sum(np.array(moves) > math.log(1.1))),
    }


def evaluate_rows(
    temperature: float,
    cal: Calibration,
    decoders: list[DecoderConfig],
    eval_units: dict[str, list[dict]],
    *,
    depth: int,
    seed: int = 0,
    resampled: list[Calibration] = (),
) -> list[dict]:
    """Rows of ``results.json`` for one temperature: prediction from ``cal``, measurement from ``eval_units``
    (label -> unit records, plain decoding under ``"ar"``), paired by prompt: each unit's speedup is measured
    against the plain-decoding runs that bracketed it (:func:`baseline_of`).

    ``resampled`` are calibrations of bootstrap resamples of the calibration prompts
    (:func:`calibration_resamples`): their predictions give ``predicted_tau_ci`` / ``predicted_speedup_ci``
    (the prediction's own noise) and ``within_combined_ci`` / ``speedup_within_combined_ci`` (0 inside the
    interval of measured − predicted, both halves resampled). ``within_ci`` is unchanged: the point
    prediction inside the measured interval.
    """
    rng = np.random.default_rng(seed)
    ar_units = {u["prompt"]: u for u in eval_units.get("ar", [])}
    rows = []
    for decoder in decoders:
        units = [u for u in eval_units.get(decoder.label, []) if u["prompt"] in ar_units]
        if not units:
            continue
        ar = [baseline_of(u, ar_units[u["prompt"]]) for u in units]
        prediction = predict(decoder, cal)
        tokens = np.array([u["tokens"] for u in units], dtype=np.float64)
        steps = np.array([u["steps"] for u in units], dtype=np.float64)
        seconds = np.array([u["seconds"] for u in units], dtype=np.float64)
        ar_tokens = np.array([u["tokens"] for u in ar], dtype=np.float64)
        ar_seconds = np.array([u["seconds"] for u in ar], dtype=np.float64)
        ar_steps = np.array([u["steps"] for u in ar], dtype=np.float64)
        positions = max([len(prediction.acceptance)] + [len(u["reached"]) for u in units])
        reached = np.array([_pad(u["reached"], positions) for u in units], dtype=np.float64)
        drafted = np.array([u["drafted_steps"] for u in units], dtype=np.float64)
        if positions and drafted.sum() > 0:
            measured_acc, acc_ci = position_intervals(reached, drafted, rng)
        else:
            measured_acc, acc_ci = [], []
        measured_tau = float(tokens.sum() / steps.sum())
        tokens_per_s = float(tokens.sum() / seconds.sum())
        speedup = tokens_per_s / float(ar_tokens.sum() / ar_seconds.sum())
        # Expanded bootstrap samples (compare.expand): the evaluation prompts for the measurement, the
        # calibration prompts for the prediction's own noise.
        tau_samples = expand(ratio_samples(tokens, steps, rng), measured_tau, len(units))
        raw_speedups = speedup_samples(tokens, seconds, ar_tokens, ar_seconds, rng)
        speedup_boot = expand(raw_speedups, speedup, len(units))
        tau_ci, speedup_ci = interval(tau_samples), interval(speedup_boot)
        if all("step_tokens" in u for u in units):  # units logged before the field: the bootstrap alone
            tau_ci = within_floor(tau_ci, measured_tau, [u["step_tokens"] for u in units])
        again = [predict(decoder, c, rule_buckets=cal.buckets) for c in resampled]
        calibration_prompts = len(cal.prompts)  # the units the resamples drew from
        if again:
            predicted_taus = expand([p.tau for p in again], prediction.tau, calibration_prompts)
            predicted_speedups = expand([p.speedup for p in again], prediction.speedup, calibration_prompts)
            spread = unbiased_spread([p.speedup for p in again], prediction.speedup, calibration_prompts)
        else:
            predicted_taus, predicted_speedups = np.array([prediction.tau]), np.array([prediction.speedup])
            spread = predicted_speedups
        # The chance that an exact prediction lands within 10%: the halves' spreads, unbiased, not expanded.
        chance = chance_within(
            unbiased_spread(raw_speedups, speedup, len(units)),
            speedup,
            spread,
            prediction.speedup,
            SPEEDUP_TOLERANCE,
        )
        row = {
            "decoder": decoder.label,
            "kind": decoder.kind,
            "verifier": decoder.verifier if decoder.kind not in ("ar", "chain", "stop") else None,
            "n": decoder.n,
            "temperature": temperature,
            "prediction": "a-priori",
            "prompts": len(units),
            "steps": int(steps.sum()),
            "measured_tau": measured_tau,
            "tau_ci": tau_ci,
            "predicted_tau": prediction.tau,
            "within_ci": within_ci(prediction.tau, tau_ci),
            "measured_acceptance": measured_acc,
            "acceptance_ci": acc_ci,
            "predicted_acceptance": _pad(prediction.acceptance, positions),
            "tokens_per_s": tokens_per_s,
            "speedup_vs_ar": speedup,
            "speedup_ci": speedup_ci,
            "predicted_speedup": prediction.speedup,
            "speedup_within_ci": within_ci(prediction.speedup, speedup_ci),
            "speedup_within_10pct": abs(prediction.speedup / speedup - 1.0) <= SPEEDUP_TOLERANCE,
            "speedup_within_10pct_chance": chance,
            "predicted_tau_ci": interval(predicted_taus),
            "joint_tau_ci": difference_interval(tau_samples, predicted_taus),
            "predicted_speedup_ci": interval(predicted_speedups),
            "joint_speedup_ci": difference_interval(speedup_boot, predicted_speedups),
            "predicted_step_time": prediction.step_time,
            "measured_step_time": float(seconds.sum() / steps.sum()),
            "note": decoder.note,
            "within_combined_ci": None,
            "detail": prediction.detail,
        }
        row["within_combined_ci"] = within_ci(0.0, row["joint_tau_ci"])
        row["speedup_within_combined_ci"] = within_ci(0.0, row["joint_speedup_ci"])
        records = [r for u in units for r in u["records"]]
        if decoder.kind != "ar" and any(r["depth"] == 0 for r in records):
            replay_tau, z = _replay(units)
            own = calibrate(records, cal.latency, temperature=temperature, depth=depth)
            profiled = predict(decoder, own).tau
            row.update(
                replay_tau=replay_tau,
                replay_within_ci=within_ci(replay_tau, tau_ci),
                replay_z=z,
                diagnosis=diagnose(
                    predicted_tau=prediction.tau,
                    profiled_tau=profiled,
                    replay_tau=replay_tau,
                    measured_tau=measured_tau,
                    predicted_step_ratio=prediction.step_time / cal.latency.target_time[1],
                    measured_step_ratio=row["measured_step_time"] / float(ar_seconds.sum() / ar_steps.sum()),
                ),
            )
            if decoder.kind == "multidraft":
                key = f"{decoder.verifier}-n{decoder.n}"
                row["optimal_acceptance"] = cal.bound[key]
                row["measured_optimal_acceptance"] = float(
                    np.mean([r["bound"][key] for r in records if "bound" in r])
                )
        else:
            row.update(
                replay_tau=1.0 if decoder.kind == "ar" else float("nan"), replay_within_ci=None, replay_z=None
            )
        rows.append(row)
    return rows


def _load(path: Path):
    return json.loads(path.read_text())


#: Bootstrap resamples of the calibration prompts for the predictions' own intervals.
CALIBRATION_RESAMPLES = 200


def calibration_resamples(
    units: list[dict],
    cal: Calibration,
    *,
    depth: int,
    seed: int,
    resamples: int = CALIBRATION_RESAMPLES,
    shallow_units: list[dict] = (),
) -> list[Calibration]:
    """Calibrations of ``resamples`` bootstrap resamples of the calibration prompts (whole prompts drawn with
    replacement from ``units``, the calibration chains, and the same prompts from ``shallow_units``, their
    one-draft chains), with the point calibration ``cal``'s bucket edges, latency profile and overheads (the
    configurations and the stop rules' buckets stay those that ran). A resample without a root event is
    skipped."""
    if shallow_units and [u["prompt"] for u in shallow_units] != [u["prompt"] for u in units]:
        raise ValueError("shallow_units: the one-draft chains must cover the calibration prompts in order")
    rng = np.random.default_rng([seed, 7])
    out = []
    for _ in range(resamples):
        drawn = rng.integers(0, len(units), size=len(units))
        records = [r for i in drawn for r in units[i]["records"]]
        shallow = [r for i in drawn for r in shallow_units[i]["records"]] if shallow_units else []
        if not any(r["depth"] == 0 for r in records) or (
            shallow_units and not any(r["depth"] == 0 for r in shallow)
        ):
            continue
        again = calibrate(
            records, cal.latency, temperature=cal.temperature, depth=depth, edges=cal.buckets["edges"]
        )
        if shallow_units:
            again.shallow = shallow_profile(shallow, cal.temperature)
        again.overhead = dict(cal.overhead)
        out.append(again)
    return out


def build_report(config, out, drafter: str, *, drafter_note: str = "") -> dict:
    """Recompute predictions from calibration units, measure from evaluation units, write every output."""
    from executor.files import write_json, write_text
    from experiments.apriori.plots import write_plots
    from experiments.apriori.run import _tag, calibrate_from_units

    out = Path(out)
    latency = LatencyProfile.from_json(_load(out / "latency.json"))
    report = {
        "config": asdict(config),
        "drafter": drafter,
        "drafter_note": drafter_note,
        "latency": latency.to_json(),
        "calibration": {},
        "planning": {},
        "multidraft": {},
        "rows": [],
    }
    evaluated: list[dict] = []
    for t in config.temperatures:
        stored = _load(out / f"predictions-{_tag(t)}.json")
        cal = calibrate_from_units(
            out, t, config, latency, _load(out / f"calibration-{_tag(t)}.json")["prompts"]
        )
        decoders = [DecoderConfig.from_json(d["config"]) for d in stored["decoders"]]
        for entry, decoder in zip(stored["decoders"], decoders, strict=True):
            if not math.isclose(predict(decoder, cal).tau, entry["prediction"]["tau"], rel_tol=1e-9):
                raise ValueError(f"out: {decoder.label} predictions differ from the calibration units")
        units: dict[str, list[dict]] = {}
        for path in sorted((out / "units").glob(f"eval-{_tag(t)}--*.json")):
            unit = _load(path)
            units.setdefault(unit["decoder"], []).append(unit)
            evaluated.append(unit)
        report["calibration"][_tag(t)] = cal.to_json()
        report["planning"][_tag(t)] = stored["planning"]
        calib_units = [_load(p) for p in sorted((out / "units").glob(f"calib-{_tag(t)}--*.json"))]
        shallow_units = [_load(p) for p in sorted((out / "units").glob(f"calib1-{_tag(t)}--*.json"))]
        resampled = calibration_resamples(
            calib_units, cal, depth=config.depth, seed=config.seed, shallow_units=shallow_units
        )
        rows = evaluate_rows(
            t, cal, decoders, units, depth=config.depth, seed=config.seed, resampled=resampled
        )
        report["rows"] += rows
        report["multidraft"][_tag(t)] = multidraft_table(cal, rows)
    report["bracket_spread"] = bracket_spread(evaluated)
    write_json(
        {"rows": report["rows"], **{k: v for k, v in report.items() if k != "rows"}},
        str(out / "results.json"),
    )
    plots = write_plots(report, out)
    write_text(render_markdown(report, plots), out / "report.md")
    return report


def _pass_times_sentence(calibrations: dict) -> str:
    """The draft passes the predictions charge, per temperature, when the calibration chains measured them."""
    parts = []
    for tag, cal in calibrations.items():
        times = cal["latency"].get("pass_times")
        if times:
            parts.append(f"{tag}: " + ", ".join(f"{1000 * t:.2f}" for t in times) + " ms")
    if not parts:
        return ""
    return (
        " The predictions charge each step's draft passes as the calibration chains measured them, on the "
        "profile's scale (first pass, second, ...): " + "; ".join(parts) + "."
    )


def _spread_sentence(spread: dict | None) -> str:
    """The machine's own noise, next to the 10% criterion it limits (:func:`bracket_spread`)."""
    if not spread:
        return ""
    sentence = (
        f" Plain decoding before and after each unit ran at speeds a median {100 * spread['median_change']:.1f}% "
        f"apart, more than 10% apart around {spread['over_10pct']} of {spread['units']} units"
    )
    if spread["over_10pct"] > spread["units"] / 4:
        return sentence + ": the machine's speed moved by as much as the 10% criterion allows."
    return sentence + "."


def multidraft_table(cal: Calibration, rows: list[dict]) -> list[dict]:
    """Per ``n`` and verifier: the exact acceptance on the *same* positions (the calibration half's root
    events, every verifier on each), the optimum α* there and the efficiency α/α*; next to it the acceptance
    each verifier achieved in its own evaluation run, its optimum on those positions and that efficiency."""
    measured = {(r["verifier"], r["n"]): r for r in rows if r["kind"] == "multidraft"}
    table = []
    for key in sorted(cal.multidraft, key=lambda k: (int(k.rpartition("-n")[2]), k)):
        name, _, n = key.rpartition("-n")
        bound = cal.bound[key]
        row = measured.get((name, int(n)))
        achieved = row["measured_acceptance"][0] if row and row["measured_acceptance"] else None
        own_bound = row.get("measured_optimal_acceptance") if row else None
        table.append(
            {
                "verifier": name,
                "n": int(n),
                "acceptance": cal.multidraft[key],
                "optimal_acceptance": bound,
                "efficiency": cal.multidraft[key] / bound if bound > 0 else None,
                "measured_acceptance": achieved,
                "measured_ci": row["acceptance_ci"][0] if row and row["acceptance_ci"] else None,
                "measured_optimal_acceptance": own_bound,
                "measured_efficiency": achieved / own_bound if achieved is not None and own_bound else None,
            }
        )
    return table


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}"


def _ci(interval) -> str:
    return f"[{_fmt(interval[0])}, {_fmt(interval[1])}]"


def render_markdown(report: dict, plots: list[str]) -> str:
    config, rows = report["config"], report["rows"]
    lines = [
        "# specbound validate: the theory predicts, then the executor runs",
        "",
        SECTIONS[0],
        "",
        f"Model: {config['model'] or 'embedded SmolLM2-135M-Instruct'}; drafter {report['drafter']}"
        + (f" ({report['drafter_note']})" if report.get("drafter_note") else "")
        + "; "
        f"{config['prompts']} HumanEval prompts split by seed {config['seed']} into a calibration and an "
        f"evaluation half; {config['max_new_tokens']} new tokens; temperatures "
        f"{', '.join(f'{t:g}' for t in config['temperatures'])}; calibration chains per prompt: "
        f"{config['calibration_paths']} sampled paths at T > 0, the greedy path at T = 0. "
        f"Latency {report['latency']['source']}: "
        f"t(1) = {1000 * report['latency']['target_time']['1']:.2f} ms, draft pass "
        f"{1000 * report['latency']['draft_time']:.2f} ms." + _pass_times_sentence(report["calibration"]),
        "",
        SECTIONS[1],
        "",
        "Depth-1 configurations (one draft level: `chain-opt` at γ* = 1, the multi-draft rows, depth-1 trees) "
        "are predicted from the roots of one-draft calibration chains (*one-draft roots*), the others from the "
        "chains of the full depth: a deep chain's roots come after rejections, where hard positions cluster.",
        "",
        "| T | events by depth | positional acceptance | one-draft roots (events) | rank matrix (depth 1) | γ* "
        "| plan (size, depth) | SpecDec++ h | Kangaroo η |",
        "|---|---|---|---|---|---:|---|---:|---:|",
    ]
    for tag, cal in report["calibration"].items():
        plan = report["planning"][tag]
        shallow = cal.get("shallow") or {}
        roots = f"{shallow['positional']:.3f} ({shallow['events']})" if shallow else "–"
        lines.append(
            f"| {cal['temperature']:g} | {cal['events']} | {[round(a, 3) for a in cal['positional']]} | {roots} "
            f"| {[round(a, 3) for a in cal['rank_matrix'][0]]} | {plan['gamma_star']} "
            f"| ({plan['plan']['size']}, {plan['plan']['depth']}) | {plan['thresholds']['specdecpp']:.3f} "
            f"| {plan['thresholds']['kangaroo']:.3f} |"
        )
    lines += [
        "",
        SECTIONS[2],
        "",
        "τ = tokens per target pass (bonus token included); intervals are 95% bootstrap over evaluation prompts, "
        "expanded for the few prompts (Hesterberg's expanded percentile interval: the deviations scaled by "
        "√(n/(n−1))·t(n−1)/z, 1.88 over 4 prompts, 1.29 over 8; a plain percentile interval over 4 prompts "
        "covers about 81%); the τ interval is never narrower than ±1.96 standard errors of the steps within the "
        "prompts (a bootstrap over 4 prompts whose τ agree by chance has zero width). "
        "*a-priori* is predicted from the calibration half only; *replay* feeds the evaluation run's own logged "
        "(p, q) to the theory (|z| < 3: executor and theory agree).",
        "",
        "*in CI*: the point prediction inside the measured interval. *in joint CI*: 0 inside the 95% interval "
        "of measured − predicted with both halves resampled (evaluation prompts for the measurement, "
        "calibration prompts for the prediction, whose own interval is the *cal. CI*).",
        "",
        "*measured speedup*: tokens/s against plain decoding of the same prompt run just before and just after "
        "each unit (the machine's speed drifts over seconds); the `ar` row is plain decoding against its own "
        "brackets, the measurement's noise.",
        "",
        "| decoder | T | a-priori τ [cal. CI] | measured τ [95% CI] | in CI | in joint CI | replay τ | replay z "
        "| predicted speedup [cal. CI] | measured speedup [95% CI] | within 10% | chance if exact | tokens/s |",
        "|---|---:|---|---|:-:|:-:|---:|---:|---|---|:-:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['decoder']} | {r['temperature']:g} | {_fmt(r['predicted_tau'])} {_ci(r['predicted_tau_ci'])} "
            f"| {_fmt(r['measured_tau'])} {_ci(r['tau_ci'])} | {'yes' if r['within_ci'] else '**no**'} "
            f"| {'yes' if r['within_combined_ci'] else '**no**'} | {_fmt(r['replay_tau'])} "
            f"| {_fmt(r['replay_z'], 2)} | {_fmt(r['predicted_speedup'])} {_ci(r['predicted_speedup_ci'])} "
            f"| {_fmt(r['speedup_vs_ar'])} {_ci(r['speedup_ci'])} | {'yes' if r['speedup_within_10pct'] else 'no'} "
            f"| {_fmt(r['speedup_within_10pct_chance'], 2)} | {_fmt(r['tokens_per_s'], 1)} |"
        )
    inside = sum(r["within_ci"] for r in rows)
    joint = sum(r["within_combined_ci"] for r in rows)
    close = sum(r["speedup_within_10pct"] for r in rows)
    expected = sum(
        r["speedup_within_10pct_chance"] for r in rows if np.isfinite(r["speedup_within_10pct_chance"])
    )
    lines += [
        "",
        f"{inside} of {len(rows)} a-priori τ predictions inside their interval ({joint} of {len(rows)} inside the "
        f"joint interval); {close} of {len(rows)} speedup predictions within 10%, where exact predictions would "
        f"give {expected:.1f} on average: *chance if exact* is the share of the two halves' bootstrap samples "
        "(unbiased spread, normal shape) whose ratio, each centred on its own estimate, stays within 10%: the "
        "prompts' sampling alone (an estimate: over a few prompts the spread is itself uncertain)."
        + _spread_sentence(report.get("bracket_spread")),
        "",
        "Step model: target pass t(size) + draft passes + the configuration's overhead per step (verification, "
        "sampling, logging; measured on the first calibration prompt). Speedup without the overheads and, for "
        "the stop rules, τ of the pooled bucket model:",
        "",
        "| decoder | T | overhead ms/step | predicted speedup without overheads | pooled-bucket τ |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        detail = r["detail"]
        lines.append(
            f"| {r['decoder']} | {r['temperature']:g} | {_fmt(1000 * detail.get('overhead', float('nan')), 2)} "
            f"| {_fmt(detail.get('speedup_passes_only'))} | {_fmt(detail.get('pooled_tau'))} |"
        )
    lines.append("")
    notes = [f"- `{r['decoder']}` at T = {r['temperature']:g}: {r['note']}" for r in rows if r["note"]]
    lines += notes + ([""] if notes else [])
    lines += [
        SECTIONS[3],
        "",
        "P(the accepted path reaches depth i), predicted → measured [95% CI].",
        "",
        "| decoder | T | by position |",
        "|---|---:|---|",
    ]
    for r in rows:
        cells = [
            f"{_fmt(p)} → {_fmt(m)} {_ci(c)}"
            for p, m, c in zip(
                r["predicted_acceptance"], r["measured_acceptance"], r["acceptance_ci"], strict=False
            )
        ]
        if cells:
            lines.append(f"| {r['decoder']} | {r['temperature']:g} | {'; '.join(cells)} |")
    lines += ["", SECTIONS[4], ""]
    misses = [r for r in rows if not r["within_ci"] and "diagnosis" in r]
    if not misses:
        lines.append("Every a-priori τ prediction is inside its interval.")
    else:
        lines += [
            "Gap predicted − measured τ split by assumption (tokens per step); latency drift is the relative "
            "error of the predicted step time against plain decoding.",
            "",
            "| decoder | T | gap | positional acceptance | independence | sampling noise | latency drift "
            "| broke |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in misses:
            d = r["diagnosis"]
            parts = d["parts"]
            lines.append(
                f"| {r['decoder']} | {r['temperature']:g} | {_fmt(d['tau_gap'])} "
                f"| {_fmt(parts['positional acceptance'])} | {_fmt(parts['independence across positions'])} "
                f"| {_fmt(parts['sampling noise'])} | {_fmt(d['latency_drift'])} | {d['broke']} |"
            )
    lines += [
        "",
        SECTIONS[5],
        "",
        "Root acceptance with n drafts. *Same positions*: every verifier's exact acceptance on the calibration "
        "half's root events, against the optimum α* for the same draft law there (`theory.optimal_acceptance`; "
        "the optimal verifier attains it for i.i.d. drafts). *Own run*: the acceptance each verifier achieved "
        "in its evaluation run [95% CI], and its efficiency against α* on that run's positions.",
        "",
        "| T | n | verifier | α (same positions) | α* | α/α* | measured α [95% CI] | α/α* (own run) |",
        "|---:|---:|---|---:|---:|---:|---|---:|",
    ]
    for tag, table in report.get("multidraft", {}).items():
        for e in table:
            measured = (
                "–"
                if e["measured_acceptance"] is None
                else (f"{_fmt(e['measured_acceptance'])} {_ci(e['measured_ci'])}")
            )
            lines.append(
                f"| {tag[1:]} | {e['n']} | {e['verifier']} | {_fmt(e['acceptance'])} "
                f"| {_fmt(e['optimal_acceptance'])} | {_fmt(e['efficiency'])} | {measured} "
                f"| {_fmt(e['measured_efficiency'])} |"
            )
    lines += [
        "",
        SECTIONS[6],
        "",
        "| T | tree | size | planner's speedup | predicted | measured [95% CI] |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        if r["kind"] in ("tree", "dynamic"):
            size = r["detail"].get("size")
            curve = report["planning"][f"T{r['temperature']:g}"]["planner_curve"]
            lines.append(
                f"| {r['temperature']:g} | {r['decoder']} | {size} | {_fmt(curve.get(str(size)))} "
                f"| {_fmt(r['predicted_speedup'])} | {_fmt(r['speedup_vs_ar'])} {_ci(r['speedup_ci'])} |"
            )
    lines += ["", SECTIONS[7], ""] + [f"![{name}]({name})" for name in plots] + [""]
    return "\n".join(lines)
