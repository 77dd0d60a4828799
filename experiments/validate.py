"""``specbound validate``: run the executor's decoders, ask the theory what they should achieve, compare.

For every decoder in the run and every prompt, the executor generates with the target/draft distributions of
each drafted position logged in full. Each *verification event* (a node on the accepted path whose children
were drafted: every position of a chain up to the first rejection, the root of a multi-draft step, every
node of a tree walk) becomes one row of evidence:

* the measured outcome ``a`` = 1 if the walk went on into one of the node's children (the output token is a
  draft: the acceptance of Hu et al., SpecTr and SpecInfer);
* the theory's prediction :math:`\\pi` = ``theory.verifier(name).acceptance(p, q, n)``, the exact acceptance
  probability of that verifier for the logged ``p`` and ``q`` at that node with its ``n`` children;
* the bound :math:`\\alpha^*` = ``theory.optimal_acceptance(p, q, n, draft=law)`` for the verifier's own
  draft law, so that the efficiency :math:`\\alpha/\\alpha^*` of the verifier is measured on real
  distributions.

Given everything before the node's children were drawn, :math:`P(a = 1) = \\pi` exactly, so
:math:`\\sum (a - \\pi)` is a martingale. The report's z-score :math:`\\sum(a - \\pi)/\\sqrt{\\sum \\pi(1-\\pi)}`
is approximately standard normal when the executor and the theory agree, and the same sum divided by the
number of steps is the gap between the measured tokens per step :math:`\\tau` and the predicted one,
:math:`\\hat\\tau = 1 + \\sum \\pi / \\text{steps}` (optional stopping: the events reached depend only on the
past).

Work is split into units (one decoder on one prompt). Each finished unit is written atomically to
``<out>/units/``; a rerun with the same settings skips finished units, so an interrupted run resumes where it
stopped. The report (``report.md``, ``report.json``, ``acceptance.png``) is rebuilt from all units at the end.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class DecoderSpec:
    """One decoder of a validation run.

    ``verifier`` names the theory verifier whose acceptance predicts each event: the chain decoder's
    speculative sampling (Leviathan et al.) is ``"rrs"`` with one draft per node.
    """

    label: str
    decoder: str
    verifier: str
    n: int = 1
    gamma: int = 1

    def build_options(self) -> dict:
        """Keyword arguments of :func:`executor.generate.build_decoder` (drafter added by the run)."""
        if self.decoder == "chain":
            return {"gamma": self.gamma}
        return {"verifier": self.verifier, "n": self.n, "gamma": self.gamma}


#: The decoders ``specbound validate`` runs by default: a chain, every multi-draft verifier, a tree.
DEFAULT_DECODERS = (
    DecoderSpec("chain-g4", "chain", "rrs", n=1, gamma=4),
    DecoderSpec("rrs-n3", "multidraft", "rrs", n=3),
    DecoderSpec("rrs_wor-n2", "multidraft", "rrs_wor", n=2),
    DecoderSpec("kseq-n3", "multidraft", "kseq", n=3),
    DecoderSpec("spechub-n2", "multidraft", "spechub", n=2),
    DecoderSpec("greedy-n3", "multidraft", "greedy", n=3),
    DecoderSpec("tree-rrs_wor-g3n2", "tree", "rrs_wor", n=2, gamma=3),
)


@dataclass(frozen=True)
class ValidationConfig:
    """Everything that determines a run's results (its hash names the run's settings on disk)."""

    model: str | None = None
    drafter: str | None = None
    prompts: int = 4
    max_new_tokens: int = 48
    temperature: float = 1.0
    seed: int = 0
    decoders: tuple[DecoderSpec, ...] = DEFAULT_DECODERS

    def fingerprint(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Evidence:
    """The verification events of one unit (one decoder on one prompt)."""

    predicted: list[float] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    bound: list[float] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)


def verification_events(step):
    """Yield ``(row, n_children, accepted, depth)`` for each verified node of one :class:`StepLog`.

    ``row`` indexes the step's logged distributions. Expanded nodes off the accepted path were never
    verified (the walk did not reach them) and yield nothing.
    """
    path = step.accepted_path
    on_path = {node: depth for depth, node in enumerate(path)}
    for row, node in enumerate(step.expanded):
        if node not in on_path:
            continue
        depth = on_path[node]
        n_children = sum(1 for parent in step.parents if parent == node)
        yield row, n_children, depth + 1 < len(path), depth


def predict_events(steps, spec: DecoderSpec) -> Evidence:
    """The theory's prediction and bound for every verification event of a generation's steps."""
    import theory
    from executor.logs import step_distributions

    check = theory.verifier(spec.verifier)
    evidence = Evidence()
    for step in steps:
        events = list(verification_events(step))
        if not events:
            continue
        p_rows, q_rows = step_distributions(step)
        for row, n_children, accepted, depth in events:
            p, q = p_rows[row], q_rows[row]
            evidence.predicted.append(float(check.acceptance(p, q, n_children)))
            evidence.bound.append(float(theory.optimal_acceptance(p, q, n_children, draft=check.draft)))
            evidence.accepted.append(int(accepted))
            evidence.depth.append(depth)
    return evidence


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


def run_validation(config: ValidationConfig, out: str | os.PathLike, *, restart: bool = False, progress=True):
    """Run (or resume) a validation and write its report; returns the report dict."""
    from executor.drafters import default_drafter
    from executor.logs import write_json
    from executor.weights import load_model
    from experiments.prompts import humaneval_prompts

    out = Path(out)
    manifest_path = out / "config.json"
    manifest = {"fingerprint": config.fingerprint(), "config": asdict(config)}
    if manifest_path.exists() and not restart:
        existing = json.loads(manifest_path.read_text())
        if existing.get("fingerprint") != manifest["fingerprint"]:
            raise ValueError(
                f"out: {out} holds a run with other settings; pass --restart to discard it or choose another --out"
            )
    if restart and (out / "units").exists():
        for stale in (out / "units").glob("*.json"):
            stale.unlink()
    write_json(manifest, manifest_path)

    model, tokenizer = load_model(config.model)
    drafter = config.drafter or default_drafter(model)
    prompts = humaneval_prompts(config.prompts)
    units = [(spec, index) for spec in config.decoders for index in range(len(prompts))]

    iterator = units
    if progress:
        from tqdm import tqdm

        iterator = tqdm(units, desc="validate", unit="run")
    for spec, index in iterator:
        path = out / "units" / f"{spec.label}--{index:03d}.json"
        if path.exists():
            continue
        record = run_unit(
            spec,
            model,
            tokenizer.encode(prompts[index]),
            drafter=drafter,
            temperature=config.temperature,
            max_new_tokens=config.max_new_tokens,
            seed=config.seed + index,
            eos_id=tokenizer.eos_id,
        )
        write_json({"prompt": index, **record}, path)
    report = build_report(config, out, drafter)
    return report


def run_unit(
    spec: DecoderSpec,
    model,
    prompt_ids: list[int],
    *,
    drafter: str,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    eos_id: int | None = None,
) -> dict:
    """Generate with one decoder on one prompt and return the unit's record (its evidence and counts)."""
    import torch

    from executor.decoders import Sampling
    from executor.generate import build_decoder

    decoder = build_decoder(
        spec.decoder,
        model,
        drafter=drafter,
        log_distributions="full",
        sampling=Sampling(temperature=temperature),
        **spec.build_options(),
    )
    generator = torch.Generator(device=model.tok_embeddings.weight.device).manual_seed(seed)
    result = decoder.generate(prompt_ids, max_new_tokens, generator=generator, eos_id=eos_id)
    return {
        "decoder": spec.label,
        "steps": len(result.steps),
        "tokens": sum(len(s.emitted) for s in result.steps),
        "wall_time": result.wall_time,
        "evidence": asdict(predict_events(result.steps, spec)),
    }


def build_report(config: ValidationConfig, out: Path, drafter: str) -> dict:
    """Summarise every finished unit; write report.json, report.md and acceptance.png atomically."""
    from executor.logs import write_json

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
    _write_text(out / "report.md", render_markdown(report))
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


def _write_text(path: Path, text: str) -> None:
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
