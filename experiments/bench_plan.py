"""The planned-tree rows of ``specbound bench``: forward costs, acceptance per child rank, and the plan.

Sequoia's planner (Chen et al., NeurIPS 2024, arXiv 2402.12374, §4.1; :func:`theory.plan_tree`) chooses the
tree size ``n`` and depth ``d`` maximising :math:`(t(1) + o_1)\\,G(n, d) / (t(n) + d\\,t_{draft} + o)`, with
``G`` the expected tokens of Sequoia's optimal tree for the acceptance vector and :math:`o`, :math:`o_1` what a
drafting and a plain decoding step spend beyond their passes. Every input is measured in the run:

* **Target forward times** :math:`t(n)` (:func:`measure_forward`): :func:`experiments.profiling.profile_costs`
  -- the measurement of ``specbound profile`` -- one repeat at a time, round-robin over the dtypes, so that the
  dtypes are compared under the same machine load (the bfloat16 / float32 ratio per ``n`` is reported; the
  first round warms up and is dropped, and within each round every size runs once untimed before the timed
  passes, since a pass right after the context's prefill is slow).
* **Acceptance per child rank and the drafter's costs** (:func:`rank_acceptance`), as the Sequoia paper
  measures them: decode with a calibration tree whose root has ``W`` children, each with one child of its own;
  ``acc[k]`` is the fraction of steps that accept the root's ``(k+1)``-th child (the draft's top ``W`` at
  temperature 0; ``W`` draws without replacement verified by RRS-without-replacement otherwise). Each step
  calls the drafter once on the root (the cost of one drafted token, ``draft_time``) and once on a level of
  ``W`` nodes (``level_time``, what the planner charges per drafted level of a tree of width at most ``W``);
  both are timed in the run, inside real decoding, so drafters that need the target's features (the trained
  heads) are measured as they are used. The calibration decodes the bench's own prompts, untimed, before the
  timed rounds.
* **Overheads** :math:`o` and :math:`o_1`: the same calibration decoding, and plain decoding of the same
  prompts (:func:`plain_overhead`), with each step's target and drafter passes subtracted
  (:class:`~experiments.apriori.run.StepClock`, as ``specbound validate`` measures them). Per temperature: a
  sampled step draws and verifies where a greedy one takes an argmax. Sequoia's formula leaves them out; on
  SmolLM2, compiled bfloat16 on 2 cores, the 9-node calibration tree spent 6.7 ms (T = 0) and 9.7 ms (T = 1)
  a step on them, against a 25 ms pass.

:func:`plan_rows` writes, per dtype and drafter, the costs as a ``specbound profile`` document
(``OUT.latency-DTYPE-D.json``) and, per temperature, the vector (``OUT.acceptance-DTYPE-TT-D.json``), so that
``specbound plan-tree --acceptance A --latency L --budget B --max-depth D --max-width W --step-overhead O
--plain-overhead O1`` reproduces each plan.
"""

from __future__ import annotations

import numpy as np

__all__ = ["measure_forward", "plain_overhead", "plan_rows", "rank_acceptance"]


def measure_forward(models: dict, context: list[int], config, *, progress: bool = False):
    """Target forward times per dtype, interleaved: ``(forward rows, {dtype: {n: [seconds, ...]}})``.

    ``models[dtype]`` is the target in that dtype. Sizes ``1, 2, 4, ...`` up to the power of two at least
    ``config.plan_budget``; ``config.latency_repeats`` timed rounds after one warm-up round. A forward row holds
    each dtype's median t(n) in ms and, with both dtypes, their ratio bfloat16 / float32.
    """
    from experiments import profiling

    sizes = profiling.power_of_two_sizes(1 << (config.plan_budget - 1).bit_length())
    samples = {dtype: {n: [] for n in sizes} for dtype in models}
    rounds = range(1 + config.latency_repeats)
    if progress:
        from tqdm import tqdm

        rounds = tqdm(rounds, desc="forward costs", unit="round")
    for round_index in rounds:
        for dtype, model in models.items():
            # Each call prefills the context first; the pass right after that ran 25-40% slow (t(1) 32 ms
            # against 24 in decoding), so one untimed pass of every size comes between them.
            measured = profiling.profile_costs(model, context, sizes=sizes, repeats=1, warmup=1)
            if round_index > 0:
                for n, seconds in zip(sizes, measured["target"]["times"], strict=True):
                    samples[dtype][n].append(seconds)
    forward = []
    for n in sizes:
        medians = {dtype: 1e3 * float(np.median(samples[dtype][n])) for dtype in models}
        row = {"n": n, "median_ms": medians}
        if {"float32", "bfloat16"} <= set(medians):
            row["bfloat16_over_float32"] = medians["bfloat16"] / medians["float32"]
        forward.append(row)
    return forward, samples


def _decode_timed(model, decoder, prompts, tokens, drafter=None):
    """Decode every prompt (seeded per prompt); returns the results and the seconds per step spent beyond the
    target's and the drafter's passes (:class:`~experiments.apriori.run.StepClock`)."""
    import torch

    from experiments.apriori.run import StepClock, overhead_per_step

    clock = StepClock(model, decoder, drafter)
    try:
        results = [
            decoder.generate(prompt, tokens, generator=torch.Generator().manual_seed(10_000 + index))
            for index, prompt in enumerate(prompts)
        ]
    finally:
        clock.detach()
    record = {
        "steps": sum(len(result.steps) for result in results),
        "step_seconds": clock.step_seconds,
        "target_seconds": clock.target_seconds,
        "draft_seconds": sum(seconds for *_, seconds in drafter.call_times) if drafter is not None else 0.0,
    }
    return results, overhead_per_step([record])


def plain_overhead(model, prompts: list[list[int]], temperature: float, tokens: int) -> float:
    """Seconds a plain decoding step spends beyond its forward pass (sampling, bookkeeping), measured on the
    calibration prompts: what :func:`theory.plan_tree` adds to its baseline (``plain_overhead``)."""
    from executor.decoders import AutoregressiveDecoder, Sampling

    decoder = AutoregressiveDecoder(model, sampling=Sampling(temperature=temperature))
    return _decode_timed(model, decoder, prompts, tokens)[1]


def rank_acceptance(model, drafter, prompts: list[list[int]], temperature: float, width: int, tokens: int):
    """Acceptance per child rank and the drafter's costs, from the calibration tree (module docstring).

    Returns ``(acc, steps, costs)``: ``acc[k]`` = fraction of the ``steps`` decoding steps accepting the root's
    ``(k+1)``-th child (``sum(acc) <= 1``); ``costs = {"token": [...], "level": [...], "step_overhead": s}``
    the seconds of each drafter call on the root and on a level of ``width`` nodes, and the seconds per step
    beyond the target's and the drafter's passes (masks, probabilities, verification).
    """
    from executor.decoders import Sampling, TreeDecoder
    from experiments.apriori import TimedDrafter

    timed = TimedDrafter(drafter)
    parents = [-1] + [0] * width + list(range(1, width + 1))
    decoder = TreeDecoder(
        model, timed, tree=parents, verifier="rrs_wor", sampling=Sampling(temperature=temperature)
    )
    counts, steps = [0] * width, 0
    results, overhead = _decode_timed(model, decoder, prompts, tokens, timed)
    for result in results:
        for step in result.steps:
            steps += 1
            if len(step.accepted_path) > 1:
                counts[step.accepted_path[1] - 1] += 1
    costs = {
        "token": [s for _, n, s in timed.call_times if n == 1],
        "level": [s for _, n, s in timed.call_times if n == width and width > 1],
        "step_overhead": overhead,
    }
    if width == 1:
        costs["level"] = list(costs["token"])
    return [c / steps for c in counts], steps, costs


def _profile(target: dict, costs: dict, name: str, dtype: str, context: int, width: int) -> dict:
    """A ``specbound profile`` document (docs/profile.md) from the run's samples."""
    from experiments.profiling import PROFILE_FORMAT, PROFILE_VERSION, summarise_times

    if not costs["token"] or not costs["level"]:
        raise ValueError(
            f"drafter {name!r} proposed nothing on the calibration prompts: no cost to plan a tree with"
        )
    stats = [{"n": n, **summarise_times(times)} for n, times in target.items()]
    base = stats[0]["median"]
    token = summarise_times(costs["token"])
    level = {"width": width, **summarise_times(costs["level"])}
    return {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "model": "specbound bench target",
        "dtype": dtype,
        "device": "cpu",
        "context_tokens": context,
        "repeats": stats[0]["repeats"],
        "warmup": 1,
        "source": "specbound bench: target interleaved over dtypes, drafter timed in calibration decoding",
        "target": {
            "sizes": list(target),
            "times": [row["median"] for row in stats],
            "relative": [row["median"] / base for row in stats],
            "stats": stats,
        },
        "drafter": {
            "name": name,
            "per_token": token,
            "per_level": {"widths": [width], "times": [level["median"]], "stats": [level]},
            "draft_time": token["median"],
            "level_time": level["median"],
            "cost_ratio": token["median"] / base,
        },
    }


def plan_rows(
    targets: dict, samples: dict, prompts: list[list[int]], config, stem: str, *, progress: bool = False
) -> list[dict]:
    """The tree :func:`theory.plan_tree` plans per dtype, temperature and model drafter (module docstring).

    ``targets[dtype] = (model, {label: drafter spec})``; ``samples`` from :func:`measure_forward`. Returns one
    dict per plan: its ``parents``, size, depth, expected tokens, predicted speedup, the measured acceptance
    vector and draft/target cost ratio, and the ``specbound plan-tree`` command that reproduces it.
    """
    from executor.drafters import parse_drafter
    from executor.files import write_json
    from experiments.profiling import profile_target_times
    from theory import plan_tree

    jobs = [
        (dtype, label, spec, temperature)
        for dtype in config.dtypes
        for label, spec in targets[dtype][1].items()
        for temperature in config.temperatures
    ]
    if progress:
        from tqdm import tqdm

        jobs = tqdm(jobs, desc="acceptance per rank", unit="plan")
    measured, costs, plain = [], {}, {}
    for dtype, label, spec, temperature in jobs:
        model = targets[dtype][0]
        if (dtype, temperature) not in plain:
            plain[dtype, temperature] = plain_overhead(model, prompts, temperature, config.calibration_tokens)
        acc, steps, timed = rank_acceptance(
            model,
            parse_drafter(spec, model),
            prompts,
            temperature,
            config.plan_width,
            config.calibration_tokens,
        )
        measured.append((dtype, label, spec, temperature, acc, steps, timed["step_overhead"]))
        # The drafter's costs do not depend on the temperature: pooled over the temperatures.
        pooled = costs.setdefault((dtype, label), {"token": [], "level": []})
        pooled["token"] += timed["token"]
        pooled["level"] += timed["level"]
    plans, profiles = [], {}
    for dtype, label, spec, temperature, acc, steps, step_overhead in measured:
        latency = f"{stem}.latency-{dtype}-{label}.json"
        if latency not in profiles:
            profiles[latency] = _profile(
                samples[dtype], costs[(dtype, label)], spec, dtype, config.context, config.plan_width
            )
            write_json(profiles[latency], latency)
        profile = profiles[latency]
        acceptance = f"{stem}.acceptance-{dtype}-T{temperature:g}-{label}.json"
        write_json({"acceptance": acc, "steps": steps}, acceptance)
        plan = plan_tree(
            acc,
            profile_target_times(profile),
            profile["drafter"]["level_time"],
            max_budget=config.plan_budget,
            max_depth=config.plan_depth,
            max_width=config.plan_width,
            step_overhead=step_overhead,
            plain_overhead=plain[dtype, temperature],
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
                "step_overhead": step_overhead,
                "plain_overhead": plain[dtype, temperature],
                "command": f"specbound plan-tree --acceptance {acceptance} --latency {latency} "
                f"--budget {config.plan_budget} --max-depth {config.plan_depth} "
                f"--max-width {config.plan_width} --step-overhead {step_overhead!r} "
                f"--plain-overhead {plain[dtype, temperature]!r}",
            }
        )
    return plans
