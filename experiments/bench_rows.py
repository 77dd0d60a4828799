"""The rows of ``specbound bench`` on real models: transformers peers, our decoders, the measured forward costs
and the trees planned from them (the engine that runs the rows is :mod:`experiments.bench`).

Rows, for every dtype and temperature of :class:`BenchConfig` (all on the same GGUF weights, same threads):

* ``hf-generate`` -- ``transformers`` ``generate`` (plain decoding); ``hf-prompt-lookup-kK`` --
  ``generate(prompt_lookup_num_tokens=K)`` (prompt lookup decoding, Saxena 2023); ``hf-early-exit`` --
  ``generate(assistant_early_exit=L)`` (LayerSkip self-speculation, Elhoushi et al., ACL 2024,
  arXiv 2404.16710, run as assisted generation). At temperature > 0 they sample (``top_k=0, top_p=1``, so the
  law is the plain softmax, as ours).
* ``ar`` -- our plain decoding, the baseline of every speedup; ``chain-ngram-gK`` -- our chain decoder with
  the prompt-lookup drafter, ``K`` tokens.
* for every model drafter ``D`` (early exit at layer L, and the trained feature head when one is cached):
  ``chain-D`` (``gamma`` drafts; Leviathan et al., ICML 2023), ``tree-D`` (a DySpec/EAGLE-2 dynamic tree of
  ``2 gamma + 1`` nodes), ``multidraft-V-nN-D`` (``N`` i.i.d. drafts verified by ``V`` = ``rrs``, recursive
  rejection sampling, or ``optimal``, the run-time optimal verifier of Hu et al., ICLR 2025,
  arXiv 2502.18779; at temperature 0 both are the argmax rule, so one ``multidraft-argmax-nN-D`` row), and
  ``plan-tree-D``: the static tree :func:`theory.plan_tree` (Sequoia, Chen et al., NeurIPS 2024,
  arXiv 2402.12374, §4.1) chooses from this run's measured forward costs and the drafter's measured
  acceptance per child rank.

**Forward costs** (:func:`measure_forward`): :func:`experiments.profiling.profile_costs` -- the measurement of
``specbound profile`` -- one repeat at a time, round-robin over the dtypes and drafters, so the dtypes'
t(n) are compared under the same load (the ratio bfloat16 / float32 per n is reported). Each (dtype, drafter)
profile is written in ``specbound profile``'s format, which ``plan-tree --latency`` reads.

**Acceptance per child rank** (:func:`rank_acceptance`): Sequoia's positional acceptance vector, measured as
the Sequoia paper does: a star tree of ``W`` children of the root is drafted (the draft's top ``W`` at
temperature 0, ``W`` draws without replacement verified by RRS-without-replacement otherwise) and the rank of
the accepted child is counted; ``acc[k]`` = fraction of steps accepting the ``(k+1)``-th child. Measured on
the bench's own prompts before the timed rounds (untimed, ``calibration_tokens`` per prompt).
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import asdict, dataclass
from functools import partial

from experiments.bench import Record, RowKey

__all__ = [
    "BenchConfig",
    "build_runners",
    "load_peer",
    "load_target",
    "measure_forward",
    "plan_rows",
    "rank_acceptance",
]

DTYPES = ("float32", "bfloat16")
VERIFIERS = ("rrs", "optimal")


@dataclass(frozen=True)
class BenchConfig:
    """Every option of ``specbound bench`` that changes what runs (checked here, parsed by the command).

    A new option (e.g. a weight quantisation) is one field here, one argument in
    :mod:`experiments.commands.bench` and its use in :func:`load_target`.
    """

    dtypes: tuple[str, ...] = DTYPES
    temperatures: tuple[float, ...] = (0.0, 1.0)
    exit_layer: int = 6
    gamma: int = 3
    lookups: tuple[int, ...] = (2,)
    drafters: tuple[str, ...] | None = None  # None: early-exit:exit_layer, plus the cached feature head
    ns: tuple[int, ...] = (2, 4)
    verifiers: tuple[str, ...] = VERIFIERS
    plan_budget: int = 16
    plan_depth: int = 6
    plan_width: int = 4
    latency_repeats: int = 5
    context: int = 256
    calibration_tokens: int = 32
    rows: tuple[str, ...] = ("*",)

    def __post_init__(self) -> None:
        if not self.dtypes or any(d not in DTYPES for d in self.dtypes):
            raise ValueError(f"--dtypes must be a non-empty list of {', '.join(DTYPES)}; got {self.dtypes}")
        if not self.temperatures or any(not t >= 0 for t in self.temperatures):
            raise ValueError(f"--temperatures must be numbers >= 0, got {self.temperatures}")
        for name, value, minimum in (
            ("--exit-layer", self.exit_layer, 1),
            ("--gamma", self.gamma, 1),
            ("--plan-budget", self.plan_budget, 1),
            ("--plan-depth", self.plan_depth, 1),
            ("--plan-width", self.plan_width, 1),
            ("--latency-repeats", self.latency_repeats, 1),
            ("--context", self.context, 2),
            ("--calibration-tokens", self.calibration_tokens, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if any(k < 1 for k in self.lookups):
            raise ValueError(f"--lookups must be integers >= 1, got {self.lookups}")
        if any(n < 2 for n in self.ns):
            raise ValueError(f"--ns must be integers >= 2 (drafts per step), got {self.ns}")
        if any(v not in VERIFIERS for v in self.verifiers):
            raise ValueError(f"--verifiers must be among {', '.join(VERIFIERS)}, got {self.verifiers}")
        if not self.rows:
            raise ValueError("--rows must hold at least one pattern")

    def wants(self, decoder: str) -> bool:
        """Whether the row ``decoder`` matches one of the ``rows`` patterns (shell-style, ``*`` = any)."""
        return any(fnmatch.fnmatchcase(decoder, pattern) for pattern in self.rows)

    def to_json(self) -> dict:
        return asdict(self)


# --- models -----------------------------------------------------------------------------------------------


def load_target(dtype: str, config: BenchConfig):
    """Our model and tokenizer in ``dtype`` (the embedded SmolLM2-135M-Instruct): every row's target."""
    from executor.weights import load_model

    return load_model(device="cpu", dtype=dtype)


def load_peer(dtype: str, config: BenchConfig):
    """``transformers``' reading of the same GGUF file in ``dtype``: ``(model, tokenizer)``."""
    import torch

    from experiments.peers import load_transformers_model

    return load_transformers_model(dtype=getattr(torch, dtype))


def model_drafters(config: BenchConfig, target) -> dict[str, str]:
    """``{label: drafter spec}`` of the model drafters (labels name the rows: ``chain-<label>``)."""
    if config.drafters is None:
        from executor.drafters.parse import feature_checkpoint

        specs = [f"early-exit:{config.exit_layer}"]
        checkpoint = feature_checkpoint(target, train_if_missing=False)
        if checkpoint is not None:  # the trained head of `specbound train-drafter --kind feature`
            specs.append(f"feature:{checkpoint}")
    else:
        specs = list(config.drafters)
    kinds = [spec.partition(":")[0] for spec in specs]
    return {
        (kind if kinds.count(kind) == 1 else spec.replace(":", "").replace("/", "_")): spec
        for kind, spec in zip(kinds, specs, strict=True)
    }


# --- runners ----------------------------------------------------------------------------------------------


def hf_runner(model, pad_id: int, temperature: float, options: dict):
    """``transformers`` ``generate`` as a bench runner (sampling seeded with ``torch.manual_seed``: its API)."""
    import torch

    sampling = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        if temperature > 0
        else {"do_sample": False}
    )

    def run(prompt_ids: list[int], max_new_tokens: int, seed: int) -> Record:
        ids = torch.tensor([prompt_ids])
        torch.manual_seed(seed)
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                pad_token_id=pad_id,
                **sampling,
                **options,
            )
        seconds = time.perf_counter() - start
        generated = out[0, ids.shape[1] :].tolist()
        return Record(tokens=len(generated), seconds=seconds, token_ids=generated)

    return run


def our_runner(decoder):
    """One of our decoders as a bench runner (its own ``torch.Generator`` seeded per round)."""
    import torch

    def run(prompt_ids: list[int], max_new_tokens: int, seed: int) -> Record:
        generator = torch.Generator().manual_seed(seed)
        return Record.from_generation(decoder.generate(prompt_ids, max_new_tokens, generator=generator))

    return run


def build_runners(config: BenchConfig, targets: dict, peers: dict, plans: list[dict]) -> dict:
    """``{RowKey: runner}`` for every row of the module docstring that ``config.rows`` selects.

    ``targets[dtype] = (model, {label: drafter spec})``; ``peers[dtype] = (hf_model, hf_tokenizer)`` or
    ``None`` (no transformers rows); ``plans`` from :func:`plan_rows`.
    """
    from executor.drafters import parse_drafter

    runners: dict = {}
    for dtype in config.dtypes:
        model, specs = targets[dtype]
        drafters = {label: parse_drafter(spec, model) for label, spec in specs.items()}
        for temperature in config.temperatures:
            planned = {
                p["drafter"]: p["parents"]
                for p in plans
                if (p["dtype"], p["temperature"]) == (dtype, float(temperature))
            }
            rows = _peer_rows(config, peers.get(dtype), temperature)
            rows.update(_our_rows(config, model, drafters, planned, temperature))
            for name, make in rows.items():
                if config.wants(name):
                    runners[RowKey(name, dtype, float(temperature))] = make()
    return runners


def _peer_rows(config: BenchConfig, peer, temperature: float) -> dict:
    """``{row name: runner factory}`` of the transformers rows (none without a peer)."""
    if peer is None:
        return {}
    model, tokenizer = peer
    pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    options = {"hf-generate": {}}
    options.update({f"hf-prompt-lookup-k{k}": {"prompt_lookup_num_tokens": k} for k in config.lookups})
    options["hf-early-exit"] = {"assistant_early_exit": config.exit_layer}
    return {name: partial(hf_runner, model, pad, temperature, extra) for name, extra in options.items()}


def _our_rows(config: BenchConfig, model, drafters: dict, planned: dict, temperature: float) -> dict:
    """``{row name: runner factory}`` of our decoders (module docstring) at ``temperature``."""
    from executor.decoders import (
        AutoregressiveDecoder,
        ChainDecoder,
        DynamicTree,
        MultiDraftDecoder,
        Sampling,
        TreeDecoder,
    )
    from executor.drafters import PromptLookupDrafter

    sampling = Sampling(temperature=temperature)
    gamma = config.gamma

    def ours(decoder_class, *args, **kwargs):
        return lambda: our_runner(decoder_class(model, *args, sampling=sampling, **kwargs))

    rows = {"ar": ours(AutoregressiveDecoder)}
    for k in config.lookups:
        rows[f"chain-ngram-g{k}"] = ours(ChainDecoder, PromptLookupDrafter(), gamma=k)
    for label, drafter in drafters.items():
        rows[f"chain-{label}"] = ours(ChainDecoder, drafter, gamma=gamma)
        rows[f"tree-{label}"] = ours(TreeDecoder, drafter, tree=DynamicTree(2 * gamma + 1, gamma, 2))
        for verifier in ("argmax",) if temperature == 0 else config.verifiers:
            for n in config.ns:
                rows[f"multidraft-{verifier}-n{n}-{label}"] = ours(
                    MultiDraftDecoder, drafter, n=n, verifier="rrs" if verifier == "argmax" else verifier
                )
        if label in planned:
            rows[f"plan-tree-{label}"] = ours(TreeDecoder, drafter, tree=planned[label])
    return rows


# --- forward costs and planned trees ----------------------------------------------------------------------


def measure_forward(targets: dict, context: list[int], config: BenchConfig, *, progress: bool = False):
    """Forward costs per dtype, dtypes and drafters interleaved; ``(forward rows, {(dtype, label): profile})``.

    Every round calls :func:`experiments.profiling.profile_costs` once (one repeat) for each dtype and model
    drafter in turn; the first round warms up. Each profile has the format of ``specbound profile``
    (docs/profile.md) built from all the rounds' samples; the forward rows hold each dtype's median t(n) in ms
    and, with both dtypes, their ratio bfloat16 / float32.
    """
    from executor.drafters import parse_drafter
    from experiments.profiling import PROFILE_FORMAT, PROFILE_VERSION, power_of_two_sizes, profile_costs

    sizes = power_of_two_sizes(1 << (config.plan_budget - 1).bit_length())
    widths = power_of_two_sizes(1 << (config.plan_width - 1).bit_length())
    jobs = []
    for dtype in config.dtypes:
        model, specs = targets[dtype]
        for label, spec in specs.items() or [(None, None)]:
            jobs.append((dtype, model, label, None if spec is None else parse_drafter(spec, model)))
    target = {dtype: {n: [] for n in sizes} for dtype in config.dtypes}
    drafted = {(dtype, label): {"token": [], **{w: [] for w in widths}} for dtype, _, label, _ in jobs}
    rounds = range(1 + config.latency_repeats)
    if progress:
        from tqdm import tqdm

        rounds = tqdm(rounds, desc="forward costs", unit="round")
    for round_index in rounds:
        for dtype, model, label, drafter in jobs:
            measured = profile_costs(
                model, context, drafter=drafter, sizes=sizes, widths=widths, repeats=1, warmup=0
            )
            if round_index == 0:
                continue
            for n, seconds in zip(sizes, measured["target"]["times"], strict=True):
                target[dtype][n].append(seconds)
            if drafter is not None:
                drafted[(dtype, label)]["token"].append(measured["drafter"]["per_token"]["median"])
                for w, seconds in zip(widths, measured["drafter"]["per_level"]["times"], strict=True):
                    drafted[(dtype, label)][w].append(seconds)
    profiles = {}
    for dtype, _, label, drafter in jobs:
        if drafter is None:
            continue
        profiles[(dtype, label)] = _profile(
            target[dtype], drafted[(dtype, label)], drafter.name, len(context), config, dtype
        )
        profiles[(dtype, label)].update(format=PROFILE_FORMAT, version=PROFILE_VERSION)
    forward = []
    for n in sizes:
        medians = {dtype: 1e3 * _median(target[dtype][n]) for dtype in config.dtypes}
        row = {"n": n, "median_ms": medians}
        if {"float32", "bfloat16"} <= set(medians):
            row["bfloat16_over_float32"] = medians["bfloat16"] / medians["float32"]
        forward.append(row)
    return forward, profiles


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else 0.5 * (ordered[middle - 1] + ordered[middle])


def _profile(target: dict, drafted: dict, name: str, context: int, config: BenchConfig, dtype: str) -> dict:
    """A ``specbound profile`` document (docs/profile.md) from interleaved samples."""
    from experiments.profiling import summarise_times

    stats = [{"n": n, **summarise_times(times)} for n, times in target.items()]
    base = stats[0]["median"]
    token = summarise_times(drafted["token"])
    widths = [w for w in drafted if w != "token"]
    levels = [{"width": w, **summarise_times(drafted[w])} for w in widths]
    return {
        "model": "bench target",
        "dtype": dtype,
        "device": "cpu",
        "context_tokens": context,
        "repeats": config.latency_repeats,
        "warmup": 1,
        "source": "specbound bench (dtypes and drafters interleaved)",
        "target": {
            "sizes": list(target),
            "times": [row["median"] for row in stats],
            "relative": [row["median"] / base for row in stats],
            "stats": stats,
        },
        "drafter": {
            "name": name,
            "per_token": token,
            "per_level": {"widths": widths, "times": [row["median"] for row in levels], "stats": levels},
            "draft_time": token["median"],
            "level_time": levels[-1]["median"],
            "cost_ratio": token["median"] / base,
        },
    }


def rank_acceptance(model, drafter, prompts: list[list[int]], temperature: float, width: int, tokens: int):
    """Sequoia's acceptance per child rank, measured with a star tree of ``width`` children (module docstring).

    Returns ``(acc, steps)``: ``acc[k]`` = fraction of the ``steps`` decoding steps that accepted the
    ``(k+1)``-th child (``sum(acc) <= 1``).
    """
    import torch

    from executor.decoders import Sampling, TreeDecoder

    decoder = TreeDecoder(
        model,
        drafter,
        tree=[-1] + [0] * width,
        verifier="rrs_wor",
        sampling=Sampling(temperature=temperature),
    )
    counts, steps = [0] * width, 0
    for index, prompt in enumerate(prompts):
        result = decoder.generate(prompt, tokens, generator=torch.Generator().manual_seed(10_000 + index))
        for step in result.steps:
            steps += 1
            if len(step.accepted_path) > 1:
                counts[step.accepted_path[1] - 1] += 1
    return [c / steps for c in counts], steps


def plan_rows(
    targets: dict, profiles: dict, prompts: list[list[int]], config: BenchConfig, stem: str, *, progress=False
) -> list[dict]:
    """The tree :func:`theory.plan_tree` plans per dtype, temperature and model drafter.

    Writes ``STEM.latency-DTYPE-LABEL.json`` (the profile) and ``STEM.acceptance-DTYPE-TT-LABEL.json`` (the
    vector) so that ``specbound plan-tree --acceptance ... --latency ... --budget B --max-depth D --max-width
    W`` reproduces each plan; returns one dict per plan (its ``parents``, size, depth, predicted speedup and
    that command).
    """
    from executor.drafters import parse_drafter
    from executor.files import write_json
    from experiments.profiling import profile_target_times
    from theory import plan_tree

    plans = []
    jobs = [
        (dtype, label, spec, temperature)
        for dtype in config.dtypes
        for label, spec in targets[dtype][1].items()
        for temperature in config.temperatures
    ]
    if progress:
        from tqdm import tqdm

        jobs = tqdm(jobs, desc="acceptance per rank", unit="plan")
    for dtype, label, spec, temperature in jobs:
        model = targets[dtype][0]
        profile = profiles[(dtype, label)]
        latency = f"{stem}.latency-{dtype}-{label}.json"
        write_json(profile, latency)
        drafter = parse_drafter(spec, model)
        acc, steps = rank_acceptance(
            model, drafter, prompts, temperature, config.plan_width, config.calibration_tokens
        )
        acceptance = f"{stem}.acceptance-{dtype}-T{temperature:g}-{label}.json"
        write_json({"acceptance": acc, "steps": steps}, acceptance)
        plan = plan_tree(
            acc,
            profile_target_times(profile),
            profile["drafter"]["level_time"],
            max_budget=config.plan_budget,
            max_depth=config.plan_depth,
            max_width=config.plan_width,
        )
        plans.append(
            {
                "drafter": label,
                "dtype": dtype,
                "temperature": float(temperature),
                "acceptance": acc,
                "calibration_steps": steps,
                "cost_ratio": profile["drafter"]["cost_ratio"],
                "parents": [int(p) for p in plan.tree.parents],
                "size": plan.size,
                "depth": plan.depth,
                "expected_tokens": plan.expected_tokens,
                "speedup": plan.speedup,
                "command": f"specbound plan-tree --acceptance {acceptance} --latency {latency} "
                f"--budget {config.plan_budget} --max-depth {config.plan_depth} "
                f"--max-width {config.plan_width}",
            }
        )
    return plans
