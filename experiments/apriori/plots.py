"""Plots of an a-priori run (matplotlib, Agg backend, written atomically).

* ``tau.png`` and ``speedup.png``: predicted against measured, one point per row with its 95% interval,
  the diagonal drawn (a perfect prediction lies on it);
* ``acceptance.png``: acceptance by position, predicted (line) against measured (points with intervals);
* ``budget.png``: speedup against tree size, the planner's predicted curve (:func:`theory.plan_tree`'s best
  speedup at each size) with the measured trees;
* ``multidraft.png``: the optimal acceptance α* against each multi-draft verifier's acceptance by ``n``
  (lines: exact on the same calibration positions; points: measured in its own run) and the efficiency α/α*,
  per temperature (the analogue of the multi-draft paper's main table, Hu et al.,
  ICLR 2025, arXiv 2502.18779).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["PLOTS", "write_plots"]

PLOTS = ("tau.png", "speedup.png", "acceptance.png", "budget.png", "multidraft.png")
COLOURS = {0.0: "tab:blue", 1.0: "tab:red"}


def _colour(temperature: float) -> str:
    return COLOURS.get(float(temperature), "tab:green")


def _save(figure, path: Path) -> None:
    import matplotlib.pyplot as plt

    from executor.files import atomic_path

    figure.tight_layout()
    with atomic_path(path, suffix=".png") as temporary:
        figure.savefig(temporary, dpi=110)
    plt.close(figure)


def _diagonal(axes, rows, predicted: str, measured: str, interval: str, label: str) -> None:
    values = []
    for r in rows:
        low, high = r[interval]
        error = [[max(r[measured] - low, 0.0)], [max(high - r[measured], 0.0)]] if np.isfinite(low) else None
        axes.errorbar(
            r[predicted],
            r[measured],
            yerr=error,
            fmt="o",
            color=_colour(r["temperature"]),
            ms=4,
            capsize=2,
            alpha=0.8,
        )
        values += [r[predicted], r[measured]]
    finite = [v for v in values if np.isfinite(v)] or [0.0, 1.0]
    low, high = min(finite) * 0.95, max(finite) * 1.05
    axes.plot([low, high], [low, high], color="black", lw=1, ls="--", label="predicted = measured")
    for t in sorted({r["temperature"] for r in rows}):
        axes.scatter([], [], color=_colour(t), label=f"T = {t:g}")
    axes.set_xlabel(f"predicted {label} (a priori)")
    axes.set_ylabel(f"measured {label} (95% CI)")
    axes.legend(fontsize=8)


def write_plots(report: dict, out) -> list[str]:
    """Write the five PNGs of the module docstring into ``out``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    rows = report["rows"]
    temperatures = sorted({r["temperature"] for r in rows}) or [1.0]

    figure, axes = plt.subplots(figsize=(5, 5))
    _diagonal(axes, rows, "predicted_tau", "measured_tau", "tau_ci", "tokens per step τ")
    _save(figure, out / "tau.png")

    figure, axes = plt.subplots(figsize=(5, 5))
    _diagonal(axes, rows, "predicted_speedup", "speedup_vs_ar", "speedup_ci", "speedup over plain decoding")
    _save(figure, out / "speedup.png")

    figure, grid = plt.subplots(1, len(temperatures), figsize=(5.5 * len(temperatures), 4), squeeze=False)
    for axes, t in zip(grid[0], temperatures, strict=True):
        chosen = [
            r for r in rows if r["temperature"] == t and r["kind"] in ("chain", "tree", "dynamic", "stop")
        ]
        for index, r in enumerate(chosen):
            colour = plt.cm.tab10(index % 10)
            x = np.arange(1, len(r["predicted_acceptance"]) + 1)
            axes.plot(x, r["predicted_acceptance"], color=colour, lw=1.2, label=r["decoder"])
            measured = r["measured_acceptance"]
            if measured:
                low = [m - c[0] for m, c in zip(measured, r["acceptance_ci"], strict=True)]
                high = [c[1] - m for m, c in zip(measured, r["acceptance_ci"], strict=True)]
                axes.errorbar(
                    np.arange(1, len(measured) + 1),
                    measured,
                    yerr=[np.maximum(low, 0), np.maximum(high, 0)],
                    fmt="o",
                    color=colour,
                    ms=3,
                    capsize=2,
                )
        axes.set_title(f"T = {t:g}: line predicted, points measured")
        axes.set_xlabel("position (depth of the accepted path)")
        axes.set_ylabel("P(accepted path reaches it)")
        axes.set_ylim(0, 1.02)
        axes.legend(fontsize=7)
    _save(figure, out / "acceptance.png")

    figure, axes = plt.subplots(figsize=(6, 4))
    for t in temperatures:
        curve = report["planning"].get(f"T{t:g}", {}).get("planner_curve", {})
        if curve:
            sizes = sorted(int(n) for n in curve)
            axes.plot(sizes, [curve[str(n)] for n in sizes], color=_colour(t), label=f"planner, T = {t:g}")
        for r in rows:
            if r["temperature"] == t and r["kind"] in ("tree", "dynamic"):
                low, high = r["speedup_ci"]
                size = r["detail"].get("size", 0)
                axes.errorbar(
                    size,
                    r["speedup_vs_ar"],
                    yerr=[[max(r["speedup_vs_ar"] - low, 0)], [max(high - r["speedup_vs_ar"], 0)]],
                    fmt="s" if r["kind"] == "tree" else "^",
                    color=_colour(t),
                    capsize=2,
                )
    axes.axhline(1.0, color="grey", lw=0.8)
    axes.set_xlabel("tree size (nodes, root included)")
    axes.set_ylabel("speedup over plain decoding")
    axes.set_title("planner's predicted curve; measured static (■) and dynamic (▲) trees")
    axes.legend(fontsize=8)
    _save(figure, out / "budget.png")

    figure, grid = plt.subplots(2, len(temperatures), figsize=(5.5 * len(temperatures), 7), squeeze=False)
    for column, t in enumerate(temperatures):
        top, bottom = grid[0][column], grid[1][column]
        table = report.get("multidraft", {}).get(f"T{t:g}", [])
        names = sorted({e["verifier"] for e in table})
        for index, name in enumerate(names):
            colour = plt.cm.tab10(index % 10)
            entries = sorted((e for e in table if e["verifier"] == name), key=lambda e: e["n"])
            ns = [e["n"] for e in entries]
            top.plot(ns, [e["acceptance"] for e in entries], "-", color=colour, lw=1.2, label=name)
            bottom.plot(
                ns, [e["efficiency"] or np.nan for e in entries], "-", color=colour, lw=1.2, label=name
            )
            done = [e for e in entries if e["measured_acceptance"] is not None]
            if done:
                values = [e["measured_acceptance"] for e in done]
                low = [max(v - e["measured_ci"][0], 0) for v, e in zip(values, done, strict=True)]
                high = [max(e["measured_ci"][1] - v, 0) for v, e in zip(values, done, strict=True)]
                top.errorbar([e["n"] for e in done], values, yerr=[low, high], fmt="o", color=colour, ms=3)
                bottom.plot(
                    [e["n"] for e in done],
                    [e["measured_efficiency"] or np.nan for e in done],
                    "o",
                    color=colour,
                    ms=3,
                )
        bounds = {
            e["n"]: e["optimal_acceptance"] for e in table if e["verifier"] in ("rrs", "kseq", "optimal")
        }
        if bounds:
            ns = sorted(bounds)
            top.plot(ns, [bounds[n] for n in ns], "--", color="black", lw=1, label="optimal α*")
        bottom.axhline(1.0, color="black", lw=1, ls="--")
        top.set_title(f"T = {t:g}: lines same positions, points own runs")
        top.set_ylabel("root acceptance α")
        bottom.set_ylabel("efficiency α / α*")
        bottom.set_xlabel("drafts n")
        top.legend(fontsize=7)
    _save(figure, out / "multidraft.png")
    return list(PLOTS)
