"""Reports of ``bound --logs``: the Markdown tables and the plot of alpha*(n) and each verifier's efficiency."""

from __future__ import annotations

import os

import numpy as np


def _cell(entry: dict | None, digits: int = 4) -> str:
    if entry is None:
        return "n/a"
    if abs(entry["high"] - entry["low"]) < 0.5 * 10**-digits:
        return f"{entry['low']:.{digits}f}"
    return f"[{entry['low']:.{digits}f}, {entry['high']:.{digits}f}]"


def _quantile_cell(entry: dict | None) -> str:
    if entry is None or "quantiles_low" not in entry:
        return "n/a"
    picks = ("0.05", "0.5", "0.95")
    low = " / ".join(f"{entry['quantiles_low'][k]:.3f}" for k in picks)
    high = " / ".join(f"{entry['quantiles_high'][k]:.3f}" for k in picks)
    return low if low == high else f"{low} (low) · {high} (high)"


def render_markdown(report: dict) -> str:
    """The report as Markdown: shards, alpha* per draft law and n, verifiers, features, skipped shards."""
    shards = report["shards"]
    ns = report["n"]
    lines = [
        f"# Bounds over logs `{report.get('logs', '')}`",
        "",
        f"{report['positions']} positions in {shards['used']} shards ({', '.join(report['kinds']) or 'none'});"
        f" {shards['skipped_count']} skipped.",
        "Intervals `[low, high]` are certified bounds on the mean over every completion of the unlogged tail"
        " (docs/truncated_logs.md); a single number means the log determines it.",
        "",
        f"single-draft acceptance sum min(p, q): {_cell(report['overlap'])}",
        "",
        "| draft law | " + " | ".join(f"alpha* n = {n}" for n in ns) + " |",
        "|---|" + "---|" * len(ns),
    ]
    for draft, row in report["optimal"].items():
        lines.append(f"| {draft} | " + " | ".join(_cell(row[str(n)]) for n in ns) + " |")
    lines += ["", "| verifier | draft | " + " | ".join(f"acceptance n = {n} (efficiency)" for n in ns) + " |"]
    lines.append("|---|---|" + "---|" * len(ns))
    for name, row in report["verifiers"].items():
        cells = []
        for n in ns:
            entry = row["n"].get(str(n))
            if entry is None:
                cells.append("n/a")
            else:
                eff = entry.get("efficiency")
                cells.append(f"{_cell(entry)} ({_cell(eff, 3) if eff else '-'})")
        lines.append(f"| {name} | {row['draft']} | " + " | ".join(cells) + " |")
    if report["by_feature"]:
        n = ns[-1]
        lines += [
            "",
            f"By position feature (n = {n}; target entropy in nats, of the logged entries when the log has no"
            " `entropy`; quantiles 5% / 50% / 95% of the per-position low and high ends, from 20-bin histograms):",
            "",
            "| feature | bin | positions | sum min(p, q) | alpha* iid | alpha* wor | alpha* iid quantiles |",
            "|---|---|---:|---|---|---|---|",
        ]
        for group in report["by_feature"].values():
            lines.append(
                f"| {group.get('feature', '')} | {group.get('bin', '')} | {group['positions']} | "
                f"{_cell(group.get('overlap@1'))} | {_cell(group.get(f'iid@{n}'))} | "
                f"{_cell(group.get(f'wor@{n}'))} | {_quantile_cell(group.get(f'iid@{n}'))} |"
            )
    if shards["skipped"]:
        lines += ["", "Skipped shards:", ""]
        lines += [f"- `{s['shard']}`: {s['error']}" for s in shards["skipped"]]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: str | os.PathLike) -> None:
    """alpha*(n) per draft law (band = certified interval) and each verifier's efficiency against n."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from executor.files import atomic_path

    ns = report["n"]
    figure, axes = plt.subplots(2, 2, figsize=(11, 8))
    (left, right), (means, hists) = axes
    for draft, row in report["optimal"].items():
        entries = [row[str(n)] for n in ns]
        if any(e is None for e in entries):
            continue
        low = [e["low"] for e in entries]
        high = [e["high"] for e in entries]
        left.plot(
            ns, [(a + b) / 2 for a, b in zip(low, high, strict=True)], marker="o", label=f"alpha* {draft}"
        )
        left.fill_between(ns, low, high, alpha=0.25)
    left.set_xlabel("drafts per step n")
    left.set_ylabel("mean optimal acceptance")
    left.set_xscale("log", base=2)
    left.legend()
    for name, row in report["verifiers"].items():
        points = [
            (n, row["n"][str(n)]["efficiency"]) for n in ns if (row["n"].get(str(n)) or {}).get("efficiency")
        ]
        if not points:
            continue
        xs = [n for n, _ in points]
        mid = [(e["low"] + e["high"]) / 2 for _, e in points]
        err = [
            [m - e["low"] for m, (_, e) in zip(mid, points, strict=True)],
            [e["high"] - m for m, (_, e) in zip(mid, points, strict=True)],
        ]
        right.errorbar(xs, mid, yerr=err, marker="o", capsize=3, label=f"{name} ({row['draft']})")
    right.set_xlabel("drafts per step n")
    right.set_ylabel("acceptance / alpha* of its draft law")
    right.set_xscale("log", base=2)
    right.legend(fontsize=7)
    _plot_features(report, means, hists)
    figure.tight_layout()
    with atomic_path(path, suffix=".png") as temporary:
        figure.savefig(temporary, dpi=110)
    plt.close(figure)


def _plot_features(report: dict, means, hists) -> None:
    """Per feature bin: alpha* at the largest n (bars = certified interval of the mean), and the histograms."""
    n = report["n"][-1]
    groups = report["by_feature"]
    labels = list(groups)
    for offset, draft in ((-0.15, "iid"), (0.15, "wor")):
        points = [(i, groups[label].get(f"{draft}@{n}")) for i, label in enumerate(labels)]
        points = [(i, e) for i, e in points if e is not None]
        if not points:
            continue
        xs = [i + offset for i, _ in points]
        mid = [e["mean"] for _, e in points]
        err = [[e["mean"] - e["low"] for _, e in points], [e["high"] - e["mean"] for _, e in points]]
        means.errorbar(xs, mid, yerr=err, fmt="o", capsize=3, label=f"alpha* {draft}, n = {n}")
    means.set_xticks(range(len(labels)))
    means.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    means.set_ylabel("mean over the bin's positions")
    if labels:
        means.legend(fontsize=7)
    key = f"iid@{n}"
    for label in labels:
        entry = groups[label].get(key)
        if not entry or "histogram" not in entry or not label.startswith("entropy"):
            continue
        counts = np.asarray(entry["histogram"]["low"], dtype=float)
        edges = np.linspace(0.0, 1.0, entry["histogram"]["bins"] + 1)
        hists.stairs(counts / max(counts.sum(), 1.0), edges, label=label)
    hists.set_xlabel(f"alpha* iid, n = {n} (per position, low end)")
    hists.set_ylabel("fraction of the bin's positions")
    if hists.get_legend_handles_labels()[0]:
        hists.legend(fontsize=7)
