"""Run the a-priori loop: calibrate on one half of the prompts, predict, run the other half, report.

Work is split into units, each written atomically to ``<out>/units/`` when it finishes: the calibration chains
of one (temperature, calibration prompt), one generation per (temperature, configuration, evaluation prompt).
The latency profile (``latency.json``), the calibrations (``calibration-T*.json``) and the predictions
(``predictions-T*.json``) are written *before* any evaluation unit runs, and kept on a rerun: an
interrupted run resumes where it stopped with the same configurations. The report is rebuilt from the
units at the end (:mod:`experiments.apriori.report`).
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from experiments.apriori.calibrate import (
    LATENCY_REPEATS,
    Calibration,
    LatencyProfile,
    RecordingDrafter,
    calibrate,
    event_record,
    measure_latency,
    read_latency,
    shallow_profile,
    split_prompts,
    verification_events,
)
from experiments.apriori.predict import BucketStopRule, DecoderConfig, plan_configurations, predict

__all__ = [
    "AprioriConfig",
    "StepClock",
    "calibration_records",
    "overhead_per_step",
    "resolve_drafter",
    "run_apriori",
    "run_generation",
    "write_unit_log",
]


@dataclass(frozen=True)
class AprioriConfig:
    """Everything that determines an a-priori run (its hash names the run's settings on disk)."""

    model: str | None = None
    drafter: str | None = None
    # The default fits the 15 minutes on an idle 2-core machine (docs/validate.md, measured figures):
    # 8 prompts (4 + 4) of 32 new tokens, and the multi-draft grid of the paper's table (RRS, K-SEQ at n = 2,
    # 4, 8, SpecHub at n = 2; the optimal verifier is added at each n by the CLI).
    prompts: int = 8
    max_new_tokens: int = 32
    temperatures: tuple[float, ...] = (0.0, 1.0)
    seed: int = 0
    depth: int = 6
    max_budget: int = 12
    budgets: tuple[int, ...] = (4, 8)
    multidraft: tuple[tuple[str, int], ...] = (
        ("rrs", 2),
        ("rrs", 4),
        ("rrs", 8),
        ("kseq", 2),
        ("kseq", 4),
        ("kseq", 8),
        ("spechub", 2),
    )
    decoders: tuple[str, ...] | None = None
    latency: str | None = None
    latency_repeats: int = LATENCY_REPEATS  # timed rounds of the profile measured in the run
    # Sampled calibration paths per prompt at T > 0. A prompt's acceptance varies more between its sampled paths
    # than between prompts: the mean of four calibration prompts' root acceptance at T = 1 was 0.296 with one
    # set of seeds and 0.34-0.39 with three others (docs/validate.md). Greedy paths are deterministic: T = 0
    # runs one.
    calibration_paths: int = 3
    dtype: str = "auto"  # resolved to "float32" or "bfloat16" before the fingerprint: runs never mix dtypes
    quantize: str = "none"  # "int8": the int8 model is the target (executor.quantize)

    def fingerprint(self) -> str:
        settings = asdict(self)
        # Runs written before --quantize and --latency-repeats existed keep their fingerprint.
        if settings["quantize"] == "none":
            del settings["quantize"]
        if settings["latency_repeats"] == LATENCY_REPEATS:
            del settings["latency_repeats"]
        return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


#: ``--quick``: fewer prompts, tokens, positions and configurations; every report section still produced.
QUICK = {
    "prompts": 6,
    "max_new_tokens": 12,
    "depth": 3,
    "max_budget": 8,
    "budgets": (),
    "multidraft": (("rrs", 2), ("rrs", 4), ("rrs", 8), ("kseq", 2), ("kseq", 4), ("kseq", 8), ("spechub", 2)),
}

#: Decoder names ``--decoders`` accepts (plain decoding always runs: it is the speedup baseline).
DECODER_NAMES = ("chain-opt", "chain-fixed", "multidraft", "tree-plan", "tree-dyspec", "tree-budgets", "stop")


def _selected(config: AprioriConfig, decoder: DecoderConfig) -> bool:
    if config.decoders is None or decoder.kind == "ar":
        return True
    family = {
        "chain-opt": decoder.label == "chain-opt",
        "chain-fixed": decoder.kind == "chain" and decoder.label != "chain-opt",
        "multidraft": decoder.kind == "multidraft",
        "tree-plan": decoder.label == "tree-plan",
        "tree-dyspec": decoder.kind == "dynamic",
        "tree-budgets": decoder.label.startswith("tree-b"),
        "stop": decoder.kind == "stop",
    }
    return any(family[name] for name in config.decoders)


def _tag(temperature: float) -> str:
    return f"T{temperature:g}"


def build_decoder(decoder: DecoderConfig, model, drafter, temperature: float, calibration=None):
    """The executor decoder of ``decoder`` with a :class:`RecordingDrafter` (``None`` for plain decoding);
    ``drafter`` is a drafter name or a drafter built for ``model`` (every decoder restarts it)."""
    from executor.decoders import (
        AutoregressiveDecoder,
        ChainDecoder,
        DynamicTree,
        MultiDraftDecoder,
        Sampling,
        TreeDecoder,
    )
    from executor.drafters import parse_drafter

    sampling = Sampling(temperature=temperature)
    if decoder.kind == "ar":
        return AutoregressiveDecoder(model, sampling=sampling), None
    inner = parse_drafter(drafter, model) if isinstance(drafter, str) else drafter
    common = {"sampling": sampling, "log_distributions": "full"}
    if decoder.kind == "chain":
        built = ChainDecoder(model, inner, gamma=decoder.gamma, **common)
    elif decoder.kind == "stop":
        rule = BucketStopRule(decoder.rule, decoder.threshold, calibration.buckets, decoder.gamma)
        built = ChainDecoder(model, inner, gamma=decoder.gamma, stop_rule=rule, **common)
    elif decoder.kind == "multidraft":
        built = MultiDraftDecoder(model, inner, n=decoder.n, verifier=decoder.verifier, **common)
    elif decoder.kind == "tree":
        built = TreeDecoder(model, inner, tree=list(decoder.parents), verifier=decoder.verifier, **common)
    else:
        shape = DynamicTree(budget=decoder.budget, max_depth=decoder.gamma, branching=decoder.n)
        built = TreeDecoder(model, inner, tree=shape, verifier=decoder.verifier, **common)
    recorder = RecordingDrafter(inner)
    recorder.attach(built)
    return built, recorder


def run_generation(
    decoder: DecoderConfig,
    model,
    prompt_ids: list[int],
    *,
    drafter,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    eos_id: int | None = None,
    calibration: Calibration | None = None,
    grid: tuple[tuple[str, int], ...] = (),
    log_path=None,
    log_top_k: int | None = None,
    event_records: bool = True,
    prefill_cache=None,
) -> dict:
    """Generate once and return the unit record: counts, times, acceptance by position and event records.

    With ``log_path``, the drafted positions' ``(p, q)`` are also written there in the project's log format
    (:func:`write_unit_log`). ``event_records=False`` leaves ``records`` empty: the theory's exact values at
    every event cost milliseconds each at a real vocabulary, and a unit timed for its overhead keeps none.
    ``prefill_cache`` (:class:`executor.decoders.PrefillCache` of ``model``) reuses the prompt's prefill.
    """
    import torch

    from executor.logs import step_distributions

    built, recorder = build_decoder(decoder, model, drafter, temperature, calibration)
    generator = torch.Generator(device=model.tok_embeddings.weight.device).manual_seed(seed)
    clock = StepClock(model, built, recorder)
    try:
        result = built.generate(
            prompt_ids, max_new_tokens, generator=generator, eos_id=eos_id, prefill_cache=prefill_cache
        )
    finally:
        clock.detach()
    if log_path is not None:
        write_unit_log(result, log_path, temperature=temperature, top_k=log_top_k)
    depth = max((len(s.accepted) for s in result.steps), default=0)
    reached = [sum(1 for s in result.steps if s.n_accepted > i) for i in range(depth)]
    records = []
    if recorder is not None and event_records:
        verifier = "rrs" if decoder.kind in ("chain", "stop") else decoder.verifier
        for step, logits in zip(result.steps, recorder.logits_per_step, strict=True):
            events = list(verification_events(step))
            if not events:
                continue
            p_rows, q_rows = step_distributions(step)
            for row, node, n_children, accepted, d in events:
                records.append(
                    event_record(
                        p_rows[row],
                        q_rows[row],
                        logits[node],
                        temperature=temperature,
                        depth=d,
                        n_children=n_children,
                        accepted=accepted,
                        verifier=verifier,
                        grid=grid,
                    )
                )
    return {
        "decoder": decoder.label,
        "temperature": temperature,
        "steps": len(result.steps),
        "tokens": sum(len(s.emitted) for s in result.steps),
        "step_tokens": [len(s.emitted) for s in result.steps],
        "seconds": result.wall_time - result.prefill_time,
        "drafted_steps": sum(1 for s in result.steps if s.n_drafted > 0),
        "step_seconds": clock.step_seconds,
        "target_seconds": clock.target_seconds,
        "draft_seconds": sum(t for _, _, t in recorder.call_times) if recorder is not None else 0.0,
        "draft_calls": [[level, t] for level, _, t in recorder.call_times] if recorder is not None else [],
        "step_sizes": [len(s.tokens) for s in result.steps],  # tokens each target pass verified
        "reached": reached,
        "records": records,
    }


class StepClock:
    """Times a decoder's steps and, within them, the target's forward passes (those the drafter makes, as an
    early-exit drafter does, are the drafter's): what a step spends beyond its target and draft passes is the
    configuration's *overhead* (verification, sampling, logging, bookkeeping), which the prediction charges.

    Wraps ``decoder.step`` and ``model.forward`` for one generation; :meth:`detach` restores the model.
    """

    def __init__(self, model, decoder, recorder=None) -> None:
        import time

        self.model, self.recorder = model, recorder
        self.step_seconds = self.target_seconds = 0.0
        self.in_step = False
        self._own_forward = model.__dict__.get("forward")
        forward, step = model.forward, decoder.step

        def timed_forward(*args, **kwargs):
            if not self.in_step or (recorder is not None and recorder.drafting):
                return forward(*args, **kwargs)
            start = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                self.target_seconds += time.perf_counter() - start

        def timed_step(state, generator):
            start = time.perf_counter()
            self.in_step = True
            try:
                return step(state, generator)
            finally:
                self.in_step = False
                self.step_seconds += time.perf_counter() - start

        model.forward = timed_forward
        decoder.step = timed_step

    def detach(self) -> None:
        """Give the model its own ``forward`` back (the wrapper is an instance attribute)."""
        if self._own_forward is None:
            self.model.__dict__.pop("forward", None)
        else:
            self.model.forward = self._own_forward


#: Plain decoding, as run around every evaluation unit for its baseline.
PLAIN = DecoderConfig("ar", "ar")


def reference_summary(record: dict) -> dict:
    """What a plain-decoding run around an evaluation unit keeps: its tokens, steps and decode seconds."""
    return {key: record[key] for key in ("tokens", "steps", "seconds")}


def overhead_per_step(units: list[dict]) -> float:
    """Seconds per step beyond the target and draft passes, pooled over ``units`` (0 for units measured
    before the clock existed)."""
    steps = sum(u["steps"] for u in units)
    if not steps or any("step_seconds" not in u for u in units):
        return 0.0
    spent = sum(u["step_seconds"] - u["target_seconds"] - u["draft_seconds"] for u in units)
    return max(spent / steps, 0.0)


def overhead_steps(config: AprioriConfig) -> int:
    """Steps each configuration's overhead is measured over (at least; more calibration prompts are run until
    there are): half the new tokens of a prompt, at most 16. One prompt alone was not enough: at T = 1 a
    generation that drew the end-of-sequence token in its first step measured `optimal-n4`'s overhead on one
    step, 17.2 ms against 12.1 over the evaluation's 74 steps."""
    return max(1, min(16, config.max_new_tokens // 2))


def write_unit_log(result, path, *, temperature: float, top_k: int | None = None) -> int:
    """Write one generation's drafted positions as a log of docs/logformat.md (full, or top-k with ``top_k``),
    readable by ``specbound bound --logs``; returns the rows written (a generation that drafted nothing, such
    as plain decoding, writes no file and returns 0)."""
    from experiments.logformat import write_generation_log

    drafted = [step for step in result.steps if step.expanded]  # a stop rule may draft nothing in a step
    if not drafted:
        return 0
    return write_generation_log([replace(result, steps=drafted)], path, top_k=top_k, temperature=temperature)


#: Seed offset of the one-draft calibration chains (apart from every other phase's seeds).
SHALLOW_PHASE_SEED = 50_000


def calibration_paths(config: AprioriConfig, temperature: float) -> int:
    """Calibration chains per prompt at ``temperature``: ``config.calibration_paths`` sampled paths, one greedy."""
    return 1 if temperature == 0 else config.calibration_paths


def calibration_phase_seed(path: int) -> int:
    """Seed offset of a prompt's ``path``-th calibration chain: 0 for the first (as before several paths), then
    3000, 4000, ...: apart from the evaluation (1000) and overhead (2000) phases."""
    return 0 if path == 0 else 2000 + 1000 * path


def calibration_unit(index: int, paths: list[dict]) -> dict:
    """One calibration prompt's unit: each path's counts and times under ``paths``, every event record pooled
    under ``records``."""
    return {
        "prompt": index,
        "paths": [{k: v for k, v in path.items() if k != "records"} for path in paths],
        "records": [record for path in paths for record in path["records"]],
    }


def calibration_records(units: list[dict]) -> list[dict]:
    """Every event record of a list of unit records, in order."""
    return [record for unit in units for record in unit["records"]]


def _write_json(data, path: Path) -> None:
    from executor.files import write_json

    write_json(data, str(path))


def _load(path: Path):
    return json.loads(path.read_text())


def _units(out: Path, pattern: str) -> list[dict]:
    return [_load(p) for p in sorted((out / "units").glob(pattern))]


def run_apriori(
    config: AprioriConfig,
    out,
    *,
    restart: bool = False,
    progress: bool = True,
    model=None,
    prompt_ids: list[list[int]] | None = None,
    eos_id: int | None = None,
    log_out=None,
    log_top_k: int | None = None,
) -> dict:
    """Run (or resume) the a-priori validation into ``out``; returns the report (see the module docstring).

    ``model`` and ``prompt_ids`` replace the embedded model and the HumanEval prompts (tests use a tiny model).
    With ``log_out``, each evaluation generation's drafted positions are written to
    ``<log_out>/T<t>--<decoder>--<prompt>.npz`` (:func:`write_unit_log`); on a rerun a finished unit whose log
    is missing is generated again for its log only (its measurement is kept).
    """
    from executor.decoders import PrefillCache
    from executor.device import run_dtype_name
    from executor.drafters import parse_drafter
    from experiments.apriori.report import build_report

    config = replace(config, dtype=run_dtype_name(config.dtype, model))
    if model is not None:
        config = replace(config, quantize=model.quantization or "none")
    out = Path(out)
    manifest = {"fingerprint": config.fingerprint(), "config": asdict(config)}
    if (out / "config.json").exists() and not restart:
        if _load(out / "config.json").get("fingerprint") != manifest["fingerprint"]:
            raise ValueError(
                f"out: {out} holds a run with other settings; pass --restart to discard it or choose another --out"
            )
    if restart:
        for stale in [*(out / "units").glob("*.json"), *out.glob("*-T*.json"), out / "latency.json"]:
            if stale.exists():
                stale.unlink()
    _write_json(manifest, out / "config.json")

    model_loaded_here = model is None
    if model is None:
        from executor.weights import load_model
        from experiments.prompts import humaneval_prompts

        model, tokenizer = load_model(config.model, dtype=config.dtype, quantize=config.quantize)
        prompt_ids = [tokenizer.encode(text) for text in humaneval_prompts(config.prompts)]
        eos_id = tokenizer.eos_id
    if prompt_ids is None or len(prompt_ids) != config.prompts:
        raise ValueError(f"prompt_ids: expected {config.prompts} prompts")
    drafter, drafter_note = resolve_drafter(config, model, train_if_missing=model_loaded_here)
    print(f"validate: drafting with {drafter} ({drafter_note})", file=sys.stderr)
    # Built once (its head loaded and packed once, ~75 ms for the feature head); every decoder restarts it.
    draft = parse_drafter(drafter, model)
    # Every prompt is generated dozens of times: its prefill runs once (excluded from the timed decoding
    # either way; ~0.4 s a generation in float32 on a 2-core AVX2 CPU).
    prefills = PrefillCache(model)
    calibration_half, evaluation_half = split_prompts(config.prompts, config.seed)
    bar = _progress(progress)

    def generate(decoder, t: float, index: int, phase_seed: int, **options) -> dict:
        """One generation of ``decoder`` on prompt ``index``; seeds differ by phase (calibration, evaluation,
        overhead) so that no two phases draw the same samples."""
        return run_generation(
            decoder,
            model,
            prompt_ids[index],
            drafter=draft,
            temperature=t,
            max_new_tokens=config.max_new_tokens,
            seed=config.seed + phase_seed + index,
            eos_id=eos_id,
            prefill_cache=prefills,
            **options,
        )

    # 1. Calibration chains on the calibration half: one unit per prompt holding all its paths, so that the
    # bootstrap over calibration prompts resamples whole prompts. Chains of `depth` drafts, and chains of one
    # draft for the roots of depth-1 configurations (Calibration.shallow).
    chains = (
        ("calib", DecoderConfig("calibration", "chain", gamma=config.depth), 0),
        ("calib1", DecoderConfig("calibration-1", "chain", gamma=1), SHALLOW_PHASE_SEED),
    )
    jobs = [(t, i, chain) for t in config.temperatures for i in calibration_half for chain in chains]
    for t, index, (prefix, chain, phase) in bar(jobs, desc="calibrate"):
        path = out / "units" / f"{prefix}-{_tag(t)}--{index:03d}.json"
        if not path.exists():
            paths = [
                generate(chain, t, index, phase + calibration_phase_seed(k), grid=config.multidraft)
                for k in range(calibration_paths(config, t))
            ]
            _write_json(calibration_unit(index, paths), path)

    # 2. Latency profile: read from --latency, or measured here (target and drafter interleaved).
    latency_path = out / "latency.json"
    if latency_path.exists():
        latency = LatencyProfile.from_json(_load(latency_path))
    elif config.latency:
        latency = read_latency(config.latency)
    else:
        widest = max([n + 1 for _, n in config.multidraft], default=1)
        sizes = range(1, max(config.max_budget, config.depth + 1, widest) + 1)
        latency = measure_latency(
            model, draft, sizes, temperature=max(config.temperatures), repeats=config.latency_repeats
        )
    _write_json(latency.to_json(), latency_path)

    # 3. Calibrate and predict, per temperature, before any evaluation unit runs.
    plans, pending = {}, {}
    for t in config.temperatures:
        cal_path, pred_path = out / f"calibration-{_tag(t)}.json", out / f"predictions-{_tag(t)}.json"
        if pred_path.exists():
            cal = Calibration.from_json(_load(cal_path))
            plans[t] = (cal, [DecoderConfig.from_json(d["config"]) for d in _load(pred_path)["decoders"]])
            continue
        cal = calibrate_from_units(out, t, config, latency, calibration_half)
        decoders, planning = plan_configurations(
            cal, multidraft=config.multidraft, budgets=config.budgets, max_budget=config.max_budget
        )
        pending[t] = (cal, [d for d in decoders if _selected(config, d)], planning)
    # Each configuration's per-step overhead, measured on the calibration prompts in turn until it has
    # overhead_steps(config) steps; the temperatures take turns so that a drift of the machine's speed hits both
    # alike.
    jobs = [
        (t, decoders[k])
        for k in range(max((len(p[1]) for p in pending.values()), default=0))
        for t, (_, decoders, _) in pending.items()
        if k < len(decoders)
    ]
    for t, decoder in bar(jobs, desc="overhead"):
        steps = 0
        for index in calibration_half:
            path = out / "units" / f"overhead-{_tag(t)}--{decoder.label}--{index:03d}.json"
            if path.exists():
                steps += _load(path)["steps"]
            else:
                record = generate(decoder, t, index, 2000, calibration=pending[t][0], event_records=False)
                _write_json({"prompt": index, **record}, path)
                steps += record["steps"]
            if steps >= overhead_steps(config):
                break
    for t, (cal, decoders, planning) in pending.items():
        cal.overhead = overheads(out, t)  # the calibration itself is unchanged by the overhead units
        predictions = {
            "temperature": t,
            "planning": planning,
            "decoders": [{"config": d.to_json(), "prediction": asdict(predict(d, cal))} for d in decoders],
        }
        _write_json(cal.to_json(), out / f"calibration-{_tag(t)}.json")
        _write_json(predictions, out / f"predictions-{_tag(t)}.json")
        plans[t] = (cal, decoders)

    # 4. Run every configuration on the evaluation half, prompt by prompt and, within a prompt, temperature by
    # temperature. Each unit is bracketed by plain decoding of the same prompt (one run between two units serves
    # both), whose speed is that unit's baseline: this machine's speed drifts by 10-30% over seconds
    # (docs/validate.md), so a baseline timed once per prompt misjudged a unit measured seconds later.
    jobs = [(t, i, d) for i in evaluation_half for t in config.temperatures for d in plans[t][1]]
    previous = None  # (temperature, prompt, summary) of the plain-decoding run that ended last
    for t, index, decoder in bar(jobs, desc="evaluate"):
        path = out / "units" / f"eval-{_tag(t)}--{decoder.label}--{index:03d}.json"
        log_path = None
        if log_out is not None and decoder.kind != "ar":
            log_path = Path(log_out) / f"{_tag(t)}--{decoder.label}--{index:03d}.npz"
        if path.exists() and (log_path is None or log_path.exists()):
            previous = None  # a resumed run: the next unit's bracket starts afresh
            continue
        grid = ((decoder.verifier, decoder.n),) if decoder.kind == "multidraft" else ()
        # An existing unit runs again for its missing log only: its measurement stays, and needs no brackets.
        measure = not path.exists()
        if measure and (previous is None or previous[:2] != (t, index)):
            previous = (t, index, reference_summary(generate(PLAIN, t, index, 1000)))
        record = generate(
            decoder,
            t,
            index,
            1000,
            calibration=plans[t][0],
            grid=grid,
            log_path=log_path,
            log_top_k=log_top_k,
        )
        if not measure:
            previous = None
            continue
        after = reference_summary(generate(PLAIN, t, index, 1000))
        _write_json({"prompt": index, **record, "reference": [previous[2], after]}, path)
        previous = (t, index, after)
    return build_report(config, out, drafter, drafter_note=drafter_note)


def resolve_drafter(config: AprioriConfig, model, *, train_if_missing: bool) -> tuple[str, str]:
    """The drafter of the run and where it comes from.

    ``--drafter`` when given; otherwise the trained feature head (issue 8): the cached one for ``model``, or,
    with ``train_if_missing`` (the embedded model, loaded by the run), one trained now on the standard
    library, with a message (minutes, once). A model without the embedded vocabulary, or a model passed in
    (tests), drafts with the early exit at 2/3 of its layers, and the report says so.
    """
    from executor.drafters import default_drafter
    from executor.training import trainer

    if config.drafter:
        return config.drafter, "named by --drafter"
    cached = trainer.cached_checkpoints(model, "feature")
    drafter = default_drafter(model, train_if_missing=train_if_missing)
    if drafter != "feature":
        return drafter, "no trained feature head for this model, none trained: the early-exit fallback"
    if cached:
        return drafter, f"trained feature head from the cache, {cached[0]}"
    return drafter, f"feature head trained in this run, {trainer.cached_checkpoints(model, 'feature')[0]}"


def calibrate_from_units(
    out: Path, temperature: float, config: AprioriConfig, latency, prompts
) -> Calibration:
    """The calibration of one temperature from its calibration units on disk (nothing else is read); the draft
    passes are priced from the calibration chains' own (:meth:`LatencyProfile.with_pass_times`)."""
    units = _units(out, f"calib-{_tag(temperature)}--*.json")
    shallow = _units(out, f"calib1-{_tag(temperature)}--*.json")
    latency = latency.with_pass_times([path for unit in units + shallow for path in unit["paths"]])
    cal = calibrate(
        calibration_records(units), latency, temperature=temperature, depth=config.depth, prompts=prompts
    )
    if shallow:
        cal.shallow = shallow_profile(calibration_records(shallow), temperature)
    cal.overhead = overheads(out, temperature)
    return cal


def overheads(out: Path, temperature: float) -> dict[str, float]:
    """Per-step overhead of each configuration from its overhead units (calibration half) on disk."""
    grouped: dict[str, list[dict]] = {}
    for unit in _units(out, f"overhead-{_tag(temperature)}--*.json"):
        grouped.setdefault(unit["decoder"], []).append(unit)
    return {label: overhead_per_step(units) for label, units in sorted(grouped.items())}


def _progress(enabled: bool):
    if not enabled:
        return lambda items, desc: items
    from tqdm import tqdm

    return lambda items, desc: tqdm(items, desc=desc, unit="run")
