"""The report of ``specbound validate``: pool the finished units of each decoder, compare predicted against
measured, and write ``report.json``, ``report.md`` and ``acceptance.png`` atomically.

The running side (generation and the theory's prediction per verification event) is
:mod:`experiments.validate`; this module only reads the units it wrote.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np

__all__ = ["build_report", "plot_acceptance", "render_markdown", "summarise"]


def summarise(units: list[dict]) -> dict:
    """Pool the units of one decoder into measured/predicted acceptance, z-score, efficiency and tau."""
    predicted = np.concatenate([u["evidence"]["predicted"] for u in units])
    accepted = np.concatenate([u["evidence"]["accepted"] for u in units]).astype(float)
    bound = np.concatenate([u["evidence"]["bound"] for u in units])
    steps = sum(u["steps"] for u in units)
    tokens = sum(u["tokens"] for u in units)
    variance = float(np.sum(predicted * (1.0 - predicted)))
    gap = float(np.sum(accepted - predicted))
    events = len(predicted)
    return {
        "prompts": len(units),
        "events": events,
        "steps": steps,
        "measured_acceptance": float(accepted.mean()) if events else math.nan,
        "predicted_acceptance": float(predicted.mean()) if events else math.nan,
        # 95% half-width of the measured mean around the prediction, from the martingale's variance.
        "acceptance_ci95": 1.96 * math.sqrt(variance) / events if events else math.nan,
        "z": gap / math.sqrt(variance) if variance > 0 else (0.0 if gap == 0 else math.inf),
        "optimal_acceptance": float(bound.mean()) if events else math.nan,
        "efficiency": float(predicted.mean() / bound.mean()) if events and bound.mean() > 0 else math.nan,
        "measured_tau": tokens / steps if steps else math.nan,
        "predicted_tau": 1.0 + float(predicted.sum()) / steps if steps else math.nan,
        "tokens_per_second": tokens / sum(u["wall_time"] for u in units),
    }


def build_report(config, out: Path, drafter: str) -> dict:
    """Summarise every finished unit; write report.json, report.md and acceptance.png atomically."""
    from executor.files import write_json, write_text

    rows = {}
    for spec in config.decoders:
        units = [json.loads(p.read_text()) for p in sorted((out / "units").glob(f"{spec.label}--*.json"))]
        if units:
            rows[spec.label] = {
                "decoder": spec.decoder,
                "verifier": spec.verifier,
                "n": spec.n,
                **summarise(units),
            }
    report = {"config": asdict(config), "drafter": drafter, "decoders": rows}
    write_json(report, out / "report.json")
    write_text(render_markdown(report), out / "report.md")
    plot_acceptance(report, out / "acceptance.png")
    return report


def render_markdown(report: dict) -> str:
    config = report["config"]
    lines = [
        "# specbound validate: predicted against measured",
        "",
        f"Model: {config['model'] or 'embedded SmolLM2-135M-Instruct'}; drafter: {report['drafter']}; "
        f"{config['prompts']} HumanEval prompts; {config['max_new_tokens']} new tokens; "
        f"temperature {config['temperature']}; seed {config['seed']}.",
        "",
        "Acceptance = P(output token is one of the drafts) per verification event. *predicted* is the theory's "
        "exact acceptance of the verifier for the logged (p, q); *α\\** the optimum for its draft law; "
        "|z| < 3 means the executor and the theory agree.",
        "",
        "| decoder | verifier | n | events | measured α | predicted α ± 95% | z | α* | efficiency α/α* "
        "| measured τ | predicted τ | tokens/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, row in report["decoders"].items():
        lines.append(
            f"| {label} | {row['verifier']} | {row['n']} | {row['events']} | {row['measured_acceptance']:.4f} "
            f"| {row['predicted_acceptance']:.4f} ± {row['acceptance_ci95']:.4f} | {row['z']:+.2f} "
            f"| {row['optimal_acceptance']:.4f} | {row['efficiency']:.4f} | {row['measured_tau']:.3f} "
            f"| {row['predicted_tau']:.3f} | {row['tokens_per_second']:.1f} |"
        )
    lines += ["", "![predicted against measured acceptance](acceptance.png)", ""]
    return "\n".join(lines)


def plot_acceptance(report: dict, path: Path) -> None:
    """Bar chart: measured acceptance with the predicted value, its 95% band and the optimum per decoder."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(report["decoders"])
    rows = [report["decoders"][label] for label in labels]
    x = np.arange(len(labels))
    figure, axes = plt.subplots(figsize=(max(6, 1.2 * len(labels)), 4))
    axes.bar(x - 0.2, [r["measured_acceptance"] for r in rows], 0.4, label="measured")
    axes.bar(
        x + 0.2,
        [r["predicted_acceptance"] for r in rows],
        0.4,
        yerr=[r["acceptance_ci95"] for r in rows],
        label="predicted (theory) ± 95%",
    )
    axes.scatter(
        x, [r["optimal_acceptance"] for r in rows], marker="_", s=600, color="black", label="optimum α*"
    )
    axes.set_xticks(x, labels, rotation=30, ha="right")
    axes.set_ylabel("acceptance rate α")
    axes.set_ylim(0, 1)
    axes.legend(loc="upper right", fontsize=8)
    figure.tight_layout()
    temporary = path.with_suffix(".tmp.png")
    figure.savefig(temporary, dpi=120)
    plt.close(figure)
    os.replace(temporary, path)
