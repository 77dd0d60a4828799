"""``specbound methods`` report: one row per method and temperature, from the finished units.

Per row: ``measured_tau`` (tokens per target step, pooled over the held-out prompts), ``predicted_tau`` (the
theory's, from calibration prompts, before the run), ``acceptance_by_position``, ``tokens_per_s`` and
``speedup_vs_ar`` (against plain decoding run back to back on the same prompts), ``greedy_identical`` (T = 0
rows of lossless methods), ``exact_match``/``rouge_l`` against plain decoding, ``layers_per_token`` and
``memory_bound_speedup``: the speedup if every forward pass cost only the weights it loads (decoder layers it
runs plus LM-head evaluations, in layer units), the regime of batch-1 decoding on a GPU, where verifying a tree
costs about as much as one token. Written atomically as ``methods.json``, ``methods.md`` and ``methods.png``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np

__all__ = ["build_report", "render_markdown", "summarise_unit"]


def _pooled_positions(prompts) -> list[float]:
    lists = [(p["acceptance_by_position"], p["steps"]) for p in prompts if p["acceptance_by_position"]]
    if not lists:
        return []
    depth = max(len(a) for a, _ in lists)
    total = sum(w for _, w in lists)
    return [sum((a[i] if i < len(a) else 0.0) * w for a, w in lists) / total for i in range(depth)]


def summarise_unit(unit: dict) -> dict:
    prompts = unit["prompts"]
    tokens = sum(p["tokens"] for p in prompts)
    steps = sum(p["steps"] for p in prompts)
    wall = sum(p["wall_time"] for p in prompts)
    ar_tokens = sum(p["ar_tokens"] for p in prompts)
    ar_wall = sum(p["ar_wall_time"] for p in prompts)
    tokens_per_s = tokens / wall if wall else math.nan
    ar_tokens_per_s = ar_tokens / ar_wall if ar_wall else math.nan
    cost = sum(p["memory_bound_cost"] for p in prompts)
    ar_cost = sum(p["ar_memory_bound_cost"] for p in prompts)
    measured = tokens / steps if steps else math.nan
    predicted = unit["predicted_tau"]
    speedup = tokens_per_s / ar_tokens_per_s if ar_tokens_per_s else math.nan
    memory_bound = (ar_cost / ar_tokens) / (cost / tokens) if cost and tokens and ar_tokens else math.nan
    identical = all(p["identical"] for p in prompts)
    row = {
        "method": unit["method"],
        "temperature": unit["temperature"],
        "lossless": unit["lossless"],
        "measured_tau": measured,
        "predicted_tau": predicted,
        "tau_relative_error": abs(predicted - measured) / measured
        if predicted is not None and steps
        else None,
        "acceptance_by_position": _pooled_positions(prompts),
        "tokens_per_s": tokens_per_s,
        "ar_tokens_per_s": ar_tokens_per_s,
        "speedup_vs_ar": speedup,
        "memory_bound_speedup": memory_bound,
        "greedy_identical": identical if unit["lossless"] and unit["temperature"] == 0 else None,
        "exact_match": float(np.mean([p["identical"] for p in prompts])),
        "rouge_l": float(np.mean([p["rouge_l"] for p in prompts])),
        "layers_per_token": sum(p["layer_evaluations"] for p in prompts) / tokens if tokens else math.nan,
        "n_layers": unit.get("n_layers"),
        "train_seconds": unit["train_seconds"] if unit["train_seconds"] is not None else 0.0,
        "paper": unit["paper"],
        "options": unit["options"],
        "prediction": unit["prediction"],
        "extra": _merge_extra([p["extra"] for p in prompts]),
        "prompts": len(prompts),
    }
    row["pays_on_this_machine"] = bool(speedup > 1)
    row["note"] = _note(row)
    return row


def _merge_extra(extras: list[dict]) -> dict:
    merged = {}
    for key in extras[0] if extras else []:
        values = [e.get(key) for e in extras]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            merged[key] = float(np.mean(values))
    return merged


def _note(row: dict) -> str:
    if row["speedup_vs_ar"] > 1:
        return f"pays here ({row['speedup_vs_ar']:.2f}x)"
    projected = row["memory_bound_speedup"]
    text = f"does not pay on this CPU ({row['speedup_vs_ar']:.2f}x)"
    if projected == projected:
        text += f"; {projected:.2f}x where passes cost their weight loads (batch-1 GPU)"
    cost = row["prediction"].get("step_cost_vs_one_token")
    if cost:
        text += (
            f"; its {row['prediction']['step_width']}-position pass costs {cost:.2f} one-token passes here"
        )
    devices = row["prediction"].get("predicted_by_devices")
    if devices:
        best = max(devices, key=lambda d: devices[d]["speedup"])
        text += f"; theory on {best} devices: {devices[best]['speedup']:.2f}x"
    return text


def build_report(config, out) -> dict:
    from executor.files import write_json

    out = Path(out)
    rows = [summarise_unit(json.loads(p.read_text())) for p in sorted((out / "units").glob("*.json"))]
    order = {name: i for i, name in enumerate(config.methods)}
    rows.sort(key=lambda r: (order.get(r["method"], len(order)), r["temperature"]))
    report = {"config": asdict(config), "rows": rows}
    write_json(report, out / "methods.json")
    temporary = out / "methods.md.tmp"
    temporary.write_text(render_markdown(report))
    os.replace(temporary, out / "methods.md")
    plot(report, out / "methods.png")
    return report


def _fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return f"{value:.{digits}f}"


def render_markdown(report: dict) -> str:
    config = report["config"]
    lines = [
        "# specbound methods: every seed method side by side",
        "",
        f"Model: {config['model'] or 'embedded SmolLM2-135M-Instruct'} ({config['dtype']}); "
        f"{config['calibration']} calibration + {config['prompts']} held-out HumanEval prompts; "
        f"{config['max_new_tokens']} new tokens; seed {config['seed']}.",
        "",
        "| method | T | lossless | measured τ | predicted τ | acceptance by position | tokens/s | AR tokens/s "
        "| speedup vs AR | greedy identical | exact match | ROUGE-L | layers/token | memory-bound speedup "
        "| train s | note |",
        "|---|---:|---|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in report["rows"]:
        positions = ", ".join(f"{a:.2f}" for a in row["acceptance_by_position"][:6]) or "–"
        lines.append(
            f"| {row['method']} | {row['temperature']:g} | {_fmt(row['lossless'])} | {_fmt(row['measured_tau'])} "
            f"| {_fmt(row['predicted_tau'])} | {positions} | {_fmt(row['tokens_per_s'], 1)} "
            f"| {_fmt(row['ar_tokens_per_s'], 1)} | {_fmt(row['speedup_vs_ar'])} | {_fmt(row['greedy_identical'])} "
            f"| {_fmt(row['exact_match'])} | {_fmt(row['rouge_l'])} | {_fmt(row['layers_per_token'], 1)} "
            f"| {_fmt(row['memory_bound_speedup'])} | {_fmt(row['train_seconds'], 3)} | {row['note']} |"
        )
    lines += ["", "![measured against predicted tokens per step, and speedups](methods.png)", ""]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    labels = [f"{r['method']}\nT={r['temperature']:g}" for r in rows]
    x = np.arange(len(rows))
    figure, (left, right) = plt.subplots(1, 2, figsize=(max(8, 1.1 * len(rows)), 4))
    left.bar(x - 0.2, [r["measured_tau"] for r in rows], 0.4, label="measured τ")
    left.bar(x + 0.2, [r["predicted_tau"] or 0 for r in rows], 0.4, label="predicted τ (theory)")
    left.set_ylabel("tokens per target step")
    right.bar(x - 0.2, [r["speedup_vs_ar"] for r in rows], 0.4, label="measured (this CPU)")
    right.bar(x + 0.2, [r["memory_bound_speedup"] for r in rows], 0.4, label="memory-bound projection")
    right.axhline(1, color="black", linewidth=0.8)
    right.set_ylabel("speedup vs plain decoding")
    for axes in (left, right):
        axes.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
        axes.legend(fontsize=8)
    figure.tight_layout()
    temporary = path.with_suffix(".tmp.png")
    figure.savefig(temporary, dpi=110)
    plt.close(figure)
    os.replace(temporary, path)
