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
stopped. The report (``report.md``, ``report.json``, ``acceptance.png``) is rebuilt from all units at the end by
:mod:`experiments.validation_report`; this module runs the decoders and the theory.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path


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
    dtype: str = "auto"  # resolved to "float32" or "bfloat16" by run_validation, before the fingerprint

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


def run_validation(config: ValidationConfig, out: str | os.PathLike, *, restart: bool = False, progress=True):
    """Run (or resume) a validation and write its report; returns the report dict."""
    from executor.device import resolve_dtype
    from executor.drafters import default_drafter
    from executor.files import write_json
    from executor.weights import load_model
    from experiments.prompts import humaneval_prompts
    from experiments.validation_report import build_report

    config = replace(config, dtype=str(resolve_dtype(config.dtype, name="dtype")).removeprefix("torch."))
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

    model, tokenizer = load_model(config.model, dtype=config.dtype)
    drafter = config.drafter or default_drafter(model, train_if_missing=True)
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
