"""experiments.bench_plan on tiny random models (seconds): the acceptance per rank has an exact oracle, the
drafter's costs are timed per call, the overheads count what a step spends outside its passes, the forward
costs interleave the dtypes, and the planned tree is what `specbound plan-tree` prints for the files the
bench wrote.
"""

import copy
import json
import time

import pytest
import torch

from executor.decoders import AutoregressiveDecoder
from executor.drafters import EarlyExitDrafter
from executor.drafters.separate_model import ModelDrafter
from executor.model import Transformer
from experiments import bench_plan, profiling
from experiments.bench_plan import measure_forward, plain_overhead, plan_rows, rank_acceptance
from experiments.bench_rows import BenchConfig
from experiments.cli import main
from experiments.profiling import check_profile
from tests.tiny_models import build_tiny_model

PROMPTS = [[3, 1, 4, 1, 5], [2, 7, 1, 8]]


def tiny(seed=3, dtype=torch.float32):
    return build_tiny_model(seed, vocab_size=24, n_layers=3, max_seq_len=96).to(dtype)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_acceptance_per_rank_is_one_for_the_first_child_of_a_perfect_drafter(temperature):
    # Oracle: a drafter with the target's own weights has q = p, so its first child is always accepted
    # (temperature 0: the same argmax; temperature 1: sum(min(p, q)) = 1).
    model = tiny()
    perfect = ModelDrafter(copy.deepcopy(model))
    acc, steps, costs = rank_acceptance(model, perfect, PROMPTS, temperature, width=3, tokens=10)
    assert steps >= 2 and acc == [1.0, 0.0, 0.0]
    # One root call (1 node) and one level call (3 nodes) per step, each timed.
    assert len(costs["token"]) == len(costs["level"]) == steps and min(costs["token"]) > 0
    # Negative control: a different drafter (the first layer of the target) misses some steps.
    acc, _, _ = rank_acceptance(model, EarlyExitDrafter(model, 1), PROMPTS, temperature, width=3, tokens=10)
    assert acc[0] < 1.0 and sum(acc) <= 1.0 + 1e-12 and all(a >= 0 for a in acc)


#: Injected delay per call (seconds), against a tiny model's ~1 ms of overhead per step.
DELAY = 0.02


def test_the_overheads_count_time_outside_the_passes_only(monkeypatch):
    model = tiny()
    assert plain_overhead(model, PROMPTS, 0.0, 6) < DELAY / 2
    real_forward = Transformer.forward

    def slow_forward(self, *args, **kwargs):
        time.sleep(DELAY)
        return real_forward(self, *args, **kwargs)

    # Time inside the target's pass, and inside an early exit's draft passes through it, is not overhead.
    monkeypatch.setattr(Transformer, "forward", slow_forward)
    assert plain_overhead(model, PROMPTS, 0.0, 6) < DELAY / 2
    _, _, costs = rank_acceptance(model, EarlyExitDrafter(model, 1), PROMPTS, 0.0, width=2, tokens=6)
    assert 0 <= costs["step_overhead"] < DELAY / 2 and min(costs["token"]) >= DELAY
    monkeypatch.setattr(Transformer, "forward", real_forward)
    # Negative control: a step that waits outside its pass is charged the wait.
    real_step = AutoregressiveDecoder.step

    def slow_step(self, state, generator):
        time.sleep(DELAY)
        return real_step(self, state, generator)

    monkeypatch.setattr(AutoregressiveDecoder, "step", slow_step)
    assert plain_overhead(model, PROMPTS, 0.0, 6) >= DELAY


def test_forward_costs_alternate_the_dtypes_round_by_round(monkeypatch):
    order = []
    real = profiling.profile_costs

    def recording(model, context, **options):
        order.append(str(model.tok_embeddings.weight.dtype))
        # Each call prefills the context; a pass timed right after the prefill ran 25-40% slow on SmolLM2.
        assert options["warmup"] >= 1
        return real(model, context, **options)

    monkeypatch.setattr(profiling, "profile_costs", recording)
    config = BenchConfig(dtypes=("float32", "bfloat16"), plan_budget=3, latency_repeats=2)
    models = {d: tiny(dtype=getattr(torch, d)) for d in config.dtypes}
    forward, samples = measure_forward(models, list(range(1, 9)), config)
    assert order == ["torch.float32", "torch.bfloat16"] * 3  # a warm-up round, then 2 timed rounds
    assert [row["n"] for row in forward] == [1, 2, 4] and all(
        len(s) == 2 for s in samples["float32"].values()
    )
    for row in forward:
        assert row["bfloat16_over_float32"] == row["median_ms"]["bfloat16"] / row["median_ms"]["float32"]


def test_planned_tree_is_what_plan_tree_prints_for_the_files_written(tmp_path, capsys):
    config = BenchConfig(
        dtypes=("float32", "bfloat16"),
        temperatures=(0.0, 1.0),
        plan_budget=6,
        plan_width=2,
        latency_repeats=2,
        calibration_tokens=8,
        context=16,
    )
    targets = {d: (tiny(dtype=getattr(torch, d)), {"early-exit": "early-exit:1"}) for d in config.dtypes}
    _, samples = measure_forward({d: m for d, (m, _) in targets.items()}, list(range(1, 17)), config)
    plans = plan_rows(targets, samples, PROMPTS, config, str(tmp_path / "bench"))
    assert [(p["dtype"], p["temperature"]) for p in plans] == [
        ("float32", 0.0),
        ("float32", 1.0),
        ("bfloat16", 0.0),
        ("bfloat16", 1.0),
    ]
    for plan in plans:
        profile = json.loads(open(plan["command"].split("--latency ")[1].split()[0]).read())
        check_profile(profile)
        assert profile["target"]["sizes"] == [1, 2, 4, 8] and profile["target"]["stats"][0]["repeats"] == 2
        assert plan["cost_ratio"] == profile["drafter"]["cost_ratio"] > 0
        capsys.readouterr()
        assert main([*plan["command"].split()[1:], "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["tree"]["parents"] == plan["parents"] and printed["size"] == plan["size"] <= 6
        assert printed["speedup"] == pytest.approx(plan["speedup"])


def test_a_drafter_that_never_drafts_cannot_be_planned_for(tmp_path, monkeypatch):
    class Silent(EarlyExitDrafter):
        def draft_logits(self, state, tree, nodes):
            return None

    model = tiny()
    config = BenchConfig(dtypes=("float32",), temperatures=(0.0,), plan_budget=2, latency_repeats=1)
    _, samples = measure_forward({"float32": model}, list(range(1, 9)), config)
    monkeypatch.setattr(
        bench_plan, "rank_acceptance", lambda m, d, *args: rank_acceptance(m, Silent(m, 1), *args)
    )
    with pytest.raises(ValueError, match="proposed nothing"):
        plan_rows({"float32": (model, {"s": "early-exit:1"})}, samples, PROMPTS, config, str(tmp_path / "b"))
