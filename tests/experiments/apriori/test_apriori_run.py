"""`specbound validate` end to end on a tiny random model: every report section, results.json's columns,
within_ci against the numbers, resuming, predictions that depend on the calibration half only.
"""

import json
import shutil

import pytest

from experiments.apriori.calibrate import split_prompts
from experiments.apriori.report import SECTIONS, build_report
from experiments.apriori.run import AprioriConfig
from experiments.cli import main
from tests.tiny_models import build_tiny_model

ARGS = ["validate", "--quick", "--prompts", "4", "--max-new-tokens", "10"]
FIELDS = (
    "decoder",
    "temperature",
    "prediction",
    "measured_tau",
    "tau_ci",
    "predicted_tau",
    "measured_acceptance",
    "predicted_acceptance",
    "tokens_per_s",
    "speedup_vs_ar",
    "predicted_speedup",
    "speedup_ci",
    "within_ci",
    "replay_tau",
    "speedup_within_10pct_chance",
)


class CharacterTokenizer:
    eos_id = None

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 10 for c in text][:8]


def use_tiny_model(patch) -> None:
    """Load a tiny random model in place of SmolLM2, with short prompts in place of HumanEval's."""
    import executor.weights
    import experiments.prompts

    model = build_tiny_model(seed=3, vocab_size=10, n_layers=8, max_seq_len=64)
    patch.setattr(
        executor.weights,
        "load_model",
        lambda source=None, dtype=None, quantize=None: (model, CharacterTokenizer()),
    )
    patch.setattr(
        experiments.prompts, "humaneval_prompts", lambda count: [f"def f{i}(x):" for i in range(count)]
    )


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One quick run on a tiny random model."""
    out = tmp_path_factory.mktemp("validate") / "run"
    with pytest.MonkeyPatch.context() as patch:
        use_tiny_model(patch)
        assert main([*ARGS, "--out", str(out), "--log-out", str(out / "logs")]) == 0
        yield out, patch


def test_latency_repeats_reach_the_profile_measured_in_the_run(tmp_path, monkeypatch):
    import experiments.apriori.run

    use_tiny_model(monkeypatch)

    class Measured(Exception):
        pass

    def measure_latency(*args, repeats, **kwargs):
        raise Measured(repeats)

    monkeypatch.setattr(experiments.apriori.run, "measure_latency", measure_latency)
    with pytest.raises(Measured) as measured:
        main([*ARGS, "--temperatures", "1", "--latency-repeats", "3", "--out", str(tmp_path / "run")])
    assert measured.value.args == (3,)


def test_quick_validate_writes_every_section(tiny_run):
    out, _ = tiny_run
    report = (out / "report.md").read_text()
    for section in SECTIONS:
        assert section in report
    assert "speedup predictions within 10%, where exact predictions would give" in report
    for plot in ("tau.png", "speedup.png", "acceptance.png", "budget.png", "multidraft.png"):
        assert (out / plot).stat().st_size > 1000 and f"]({plot})" in report
    rows = json.loads((out / "results.json").read_text())["rows"]
    kinds = {(r["temperature"], r["kind"]) for r in rows}
    for t in (0.0, 1.0):
        assert {(t, k) for k in ("ar", "chain", "multidraft", "tree", "dynamic", "stop")} <= kinds
        optimal = {r["n"] for r in rows if r["temperature"] == t and r["verifier"] == "optimal"}
        assert optimal == {2, 4, 8}  # issue 9: the optimal verifier's rows next to RRS and K-SEQ
    overheads = sorted((out / "units").glob("overhead-T1--*.json"))
    assert {json.loads(p.read_text())["decoder"] for p in overheads} == {
        r["decoder"] for r in rows if r["temperature"] == 1.0
    }
    for row in rows:
        assert all(name in row for name in FIELDS) and row["prediction"] == "a-priori"
        low, high = row["tau_ci"]
        assert row["within_ci"] == (low - 1e-12 <= row["predicted_tau"] <= high + 1e-12)
        low, high = row["speedup_ci"]
        assert row["speedup_within_ci"] == (low - 1e-12 <= row["predicted_speedup"] <= high + 1e-12)
        assert len(row["predicted_acceptance"]) == len(row["measured_acceptance"])
        low, high = row["joint_tau_ci"]  # measured − predicted, both halves resampled
        assert row["within_combined_ci"] == (low - 1e-12 <= 0.0 <= high + 1e-12)
        low, high = row["joint_speedup_ci"]
        assert row["speedup_within_combined_ci"] == (low - 1e-12 <= 0.0 <= high + 1e-12)
        assert 0.0 <= row["speedup_within_10pct_chance"] <= 1.0
        assert row["detail"]["overhead"] >= 0.0
        if row["kind"] == "ar":
            assert row["measured_tau"] == row["predicted_tau"] == 1.0
        if row["temperature"] == 0 and row["kind"] != "ar":
            assert row["replay_tau"] == pytest.approx(row["measured_tau"])  # greedy: replay is exact


def test_log_out_writes_every_evaluation_run_in_the_log_format_bound_reads(tiny_run, capsys):
    import numpy as np

    import theory
    from experiments.logformat import LogShard

    out, _ = tiny_run
    units = [json.loads(p.read_text()) for p in sorted((out / "units").glob("eval-*.json"))]
    logs = sorted((out / "logs").glob("*.npz"))
    drafting = [u for u in units if u["decoder"] != "ar" and u["drafted_steps"] > 0]
    assert len(logs) == len(drafting) and not list((out / "logs").glob("*--ar--*"))
    rows = 0
    for unit in drafting:
        name = f"T{unit['temperature']:g}--{unit['decoder']}--{unit['prompt']:03d}.npz"
        shard = LogShard.open(out / "logs" / name)
        assert shard.kind == "full" and shard.vocab_size == 10 and shard.rows >= unit["drafted_steps"]
        rows += shard.rows
        if unit["decoder"] == "kseq-n4" and unit["temperature"] == 1.0:
            # A multi-draft step expands the root only, and every root is verified: row i of the log is the
            # (p, q) of event i, whose exact acceptance the run recorded.
            with np.load(out / "logs" / name) as archive:
                p, q, temperature = archive["p"], archive["q"], float(archive["temperature"])
            assert temperature == 1.0 and shard.rows == len(unit["records"])
            p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)
            exact = theory.verifier("kseq").acceptance(p.astype(np.float64), q.astype(np.float64), 4)
            recorded = [r["replay"] for r in unit["records"]]
            np.testing.assert_allclose(exact, recorded, atol=1e-5)
    capsys.readouterr()
    # Greedy (T = 0) logs hold one-hot q: only the i.i.d. draft law is defined on them with n = 2.
    arguments = ["bound", "--logs", str(out / "logs" / "*.npz"), "-n", "2", "--draft", "iid"]
    arguments += ["--verifiers", "rrs", "--workers", "0", "--no-progress", "--json"]
    assert main(arguments) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["positions"] == rows and summary["shards"]["skipped_count"] == 0


def test_a_rerun_with_log_out_writes_missing_logs_and_keeps_the_measurements(tiny_run, tmp_path):
    source, _ = tiny_run
    out = tmp_path / "run"
    shutil.copytree(source, out)
    logs = sorted((out / "logs").glob("*.npz"))
    logs[0].unlink()
    units = sorted((out / "units").glob("eval-*.json"))
    before = {p: p.read_text() for p in units}
    assert main([*ARGS, "--out", str(out), "--log-out", str(out / "logs")]) == 0
    assert logs[0].exists() and sorted((out / "logs").glob("*.npz")) == logs
    assert {p: p.read_text() for p in units} == before


def test_an_interrupted_run_resumes_with_the_same_predictions(tiny_run, tmp_path):
    source, _ = tiny_run
    out = tmp_path / "run"
    shutil.copytree(source, out)
    units = sorted((out / "units").glob("eval-*.json"))
    removed = units[len(units) // 2]
    removed.unlink()
    before = {p: p.stat().st_mtime_ns for p in units if p != removed}
    predictions = (out / "predictions-T1.json").read_text()
    assert main([*ARGS, "--out", str(out)]) == 0
    assert removed.exists() and all(p.stat().st_mtime_ns == t for p, t in before.items())
    assert (out / "predictions-T1.json").read_text() == predictions


def stored_config(out) -> AprioriConfig:
    data = json.loads((out / "config.json").read_text())["config"]
    data.update(
        temperatures=tuple(data["temperatures"]),
        budgets=tuple(data["budgets"]),
        multidraft=tuple(tuple(m) for m in data["multidraft"]),
    )
    return AprioriConfig(**data)


def test_predictions_depend_on_the_calibration_half_only(tiny_run, tmp_path):
    source, _ = tiny_run
    out = tmp_path / "run"
    shutil.copytree(source, out)
    config = stored_config(out)
    first = build_report(config, out, "early-exit:5")["rows"]
    for path in (out / "units").glob("eval-*.json"):
        unit = json.loads(path.read_text())
        unit["tokens"] += 3
        for record in unit["records"]:
            record["chain"] = record["replay"] = 0.0
        path.write_text(json.dumps(unit))
    second = build_report(config, out, "early-exit:5")["rows"]
    assert [r["predicted_tau"] for r in first] == [r["predicted_tau"] for r in second]
    assert [r["predicted_speedup"] for r in first] == [r["predicted_speedup"] for r in second]
    assert [r["predicted_tau_ci"] for r in first] == [r["predicted_tau_ci"] for r in second]
    assert [r["measured_tau"] for r in first] != [r["measured_tau"] for r in second]
    # The calibration half does feed them: perturbing it is caught against the stored predictions.
    calibration_unit = sorted((out / "units").glob("calib-T1--*.json"))[0]
    unit = json.loads(calibration_unit.read_text())
    for record in unit["records"]:
        record["chain"] = 0.0
        record["ranks"] = [0.0 for _ in record["ranks"]]
        record.get("grid", {}).update({k: 0.0 for k in record.get("grid", {})})
    calibration_unit.write_text(json.dumps(unit))
    with pytest.raises(ValueError, match="predictions differ"):
        build_report(config, out, "early-exit:5")


def recorded_generations(tiny_run, out, *options: str, event_records: list | None = None) -> list[tuple]:
    """Run the quick validation into ``out`` (with command-line ``options``) and return ``(seed, temperature,
    decoder label)`` of every generation, in the order they ran; ``event_records`` (a list) receives
    ``(seed, whether the generation computed event records)`` of each."""
    import experiments.apriori.run as run

    _, patch = tiny_run
    calls = []
    real = run.run_generation

    def recording(decoder, model, prompt, **kwargs):
        calls.append((kwargs["seed"], kwargs["temperature"], decoder.label))
        if event_records is not None:
            event_records.append((kwargs["seed"], kwargs.get("event_records", True)))
        return real(decoder, model, prompt, **kwargs)

    patch.setattr(run, "run_generation", recording)
    try:
        assert main([*ARGS, "--out", str(out), *options]) == 0
    finally:
        patch.setattr(run, "run_generation", real)
    return calls


def test_temperatures_take_turns_in_the_overhead_and_evaluation_runs(tiny_run, tmp_path):
    """A drift of the machine's speed must hit both temperatures alike: the overhead runs alternate between
    the temperatures configuration by configuration, and the evaluation runs go prompt by prompt, both
    temperatures within each prompt (before, every T = 0 unit ran before every T = 1 unit). The overhead runs
    alone skip the event records (they keep none, and each record costs the theory milliseconds)."""
    flags: list = []
    calls = recorded_generations(tiny_run, tmp_path / "run", event_records=flags)
    assert {computed for seed, computed in flags if 2000 <= seed < 3000} == {False}
    assert {computed for seed, computed in flags if not 2000 <= seed < 3000} == {True}
    calls = [call for call in calls if not call[2].startswith("calibration")]
    overhead = [(t, label) for seed, t, label in calls if seed >= 2000]
    # a configuration runs on further calibration prompts until it has enough steps: one turn per configuration
    overhead = [call for k, call in enumerate(overhead) if k == 0 or call != overhead[k - 1]]
    evaluation = [(seed - 1000, t) for seed, t, _ in calls if 1000 <= seed < 2000]
    turns = 2 * min(sum(t == 0.0 for t, _ in overhead), sum(t == 1.0 for t, _ in overhead))
    assert turns >= 4 and [t for t, _ in overhead[:turns]] == [0.0, 1.0] * (turns // 2)
    prompts = [prompt for prompt, _ in evaluation]
    assert prompts == sorted(prompts)
    for prompt in set(prompts):
        temperatures = [t for p, t in evaluation if p == prompt]
        assert temperatures == sorted(temperatures) and set(temperatures) == {0.0, 1.0}


def test_overhead_units_stop_once_they_hold_enough_steps(tiny_run):
    """Each configuration's overhead is measured over at least ``overhead_steps`` steps where the calibration
    prompts allow, and on no more prompts than it takes to get there."""
    from experiments.apriori.run import overhead_steps

    out, _ = tiny_run
    config = stored_config(out)
    needed = overhead_steps(config)
    grouped: dict = {}
    for path in sorted((out / "units").glob("overhead-*.json")):
        unit = json.loads(path.read_text())
        grouped.setdefault((unit["temperature"], unit["decoder"]), []).append(unit["steps"])
    calibration_half, _ = split_prompts(config.prompts, config.seed)
    for key, steps in grouped.items():
        assert sum(steps[:-1]) < needed, key  # the last prompt was needed
        assert sum(steps) >= needed or len(steps) == len(calibration_half), key


def test_a_short_overhead_run_is_topped_up_on_the_next_calibration_prompt(tiny_run, tmp_path):
    """A generation that ends early (an end-of-sequence token drawn in its first step) measured one
    configuration's overhead on a single step; the run then measures it on the next calibration prompt too."""
    import experiments.apriori.run as run

    _, patch = tiny_run
    real = run.run_generation
    prompts = []

    def one_step_overheads(decoder, model, prompt, **kwargs):
        record = real(decoder, model, prompt, **kwargs)
        if 2000 <= kwargs["seed"] < 3000 and decoder.label == "chain-opt":  # the overhead phase (seed 0)
            prompts.append((kwargs["temperature"], kwargs["seed"]))
            record = {**record, "steps": 1}
        return record

    patch.setattr(run, "run_generation", one_step_overheads)
    try:
        assert main([*ARGS, "--out", str(tmp_path / "run")]) == 0
    finally:
        patch.setattr(run, "run_generation", real)
    config = stored_config(tmp_path / "run")
    assert config.seed == 0
    calibration_half, _ = split_prompts(config.prompts, config.seed)
    for t in (0.0, 1.0):
        assert sorted(seed - 2000 for temp, seed in prompts if temp == t) == calibration_half


def test_each_calibration_prompt_runs_several_sampled_paths_and_one_greedy_path(tiny_run, tmp_path):
    """At T > 0 each calibration prompt runs ``calibration_paths`` chains with distinct seeds, pooled in one unit
    (the bootstrap resamples whole prompts); at T = 0 the greedy path is deterministic and runs once."""
    import experiments.apriori.run as run

    _, patch = tiny_run
    calls = []
    real = run.run_generation

    def recording(decoder, model, prompt, **kwargs):
        result = real(decoder, model, prompt, **kwargs)
        if decoder.label == "calibration":
            calls.append((kwargs["temperature"], tuple(prompt), kwargs["seed"], len(result["records"])))
        return result

    patch.setattr(run, "run_generation", recording)
    try:
        out = tmp_path / "run"
        assert main([*ARGS, "--calibration-paths", "2", "--out", str(out)]) == 0
    finally:
        patch.setattr(run, "run_generation", real)
    config = stored_config(out)
    assert config.calibration_paths == 2
    for t, paths in ((0.0, 1), (1.0, 2)):
        units = [json.loads(p.read_text()) for p in sorted((out / "units").glob(f"calib-T{t:g}--*.json"))]
        assert len(units) == 2  # --prompts 4: two calibration prompts
        for unit in units:
            assert len(unit["paths"]) == paths
            assert all(path["temperature"] == t and path["tokens"] > 0 for path in unit["paths"])
        runs = [c for c in calls if c[0] == t]
        assert len(runs) == 2 * paths
        assert len({seed for _, _, seed, _ in runs}) == len(runs)  # no two paths draw the same samples
        assert sum(len(u["records"]) for u in units) == sum(events for *_, events in runs)


def test_depth_one_configurations_are_predicted_from_the_one_draft_chains(tiny_run, tmp_path):
    """Zeroing the one-draft calibration chains' acceptances moves the prediction of every configuration that
    drafts one level and of no other (the deep chains' roots fall after rejections, docs/validate.md)."""
    from experiments.apriori.calibrate import LatencyProfile
    from experiments.apriori.predict import DecoderConfig, decoder_depth, predict
    from experiments.apriori.run import calibrate_from_units

    source, _ = tiny_run
    out = tmp_path / "run"
    shutil.copytree(source, out)
    config = stored_config(out)
    latency = LatencyProfile.from_json(json.loads((out / "latency.json").read_text()))
    stored = json.loads((out / "predictions-T1.json").read_text())
    decoders = [DecoderConfig.from_json(d["config"]) for d in stored["decoders"]]
    prompts = json.loads((out / "calibration-T1.json").read_text())["prompts"]
    before = calibrate_from_units(out, 1.0, config, latency, prompts)
    assert before.shallow["events"] > 0 and 0.0 < before.shallow["positional"] <= 1.0
    for path in (out / "units").glob("calib1-T1--*.json"):
        unit = json.loads(path.read_text())
        for record in unit["records"]:
            record["chain"] = 0.0
            record["ranks"] = [0.0 for _ in record["ranks"]]
            record["grid"] = {k: 0.0 for k in record["grid"]}
        path.write_text(json.dumps(unit))
    after = calibrate_from_units(out, 1.0, config, latency, prompts)
    depths = {d.label: decoder_depth(d) for d in decoders}
    assert 1 in depths.values() and any(depth > 1 for depth in depths.values())
    for decoder in decoders:
        moved = predict(decoder, before).tau != predict(decoder, after).tau
        assert moved == (depths[decoder.label] == 1), decoder.label


def test_every_evaluation_unit_is_bracketed_by_plain_decoding_of_its_prompt(tiny_run, tmp_path):
    out = tmp_path / "run"
    calls = recorded_generations(tiny_run, out)
    evaluation = [call for call in calls if 1000 <= call[0] < 2000]
    configurations = [i for i, call in enumerate(evaluation) if call[2] != "ar"]
    assert configurations
    for i in configurations:  # the same prompt and temperature, plain decoding, just before and just after
        assert evaluation[i - 1] == evaluation[i + 1] == (*evaluation[i][:2], "ar")
    # The run after one unit is the run before the next: its summary is stored in both.
    for t in ("T0", "T1"):
        decoders = [
            d["config"]["label"] for d in json.loads((out / f"predictions-{t}.json").read_text())["decoders"]
        ]
        for prompt in {
            json.loads(p.read_text())["prompt"] for p in (out / "units").glob(f"eval-{t}--ar--*.json")
        }:
            units = [
                json.loads((out / "units" / f"eval-{t}--{d}--{prompt:03d}.json").read_text())
                for d in decoders
            ]
            for before, after in zip(units, units[1:], strict=False):
                assert before["reference"][1] == after["reference"][0]


def test_speedups_are_measured_against_the_bracketing_runs(tiny_run, tmp_path):
    source, _ = tiny_run
    out = tmp_path / "run"
    shutil.copytree(source, out)
    config = stored_config(out)
    first = {(r["decoder"], r["temperature"]): r for r in build_report(config, out, "early-exit:5")["rows"]}
    for path in (out / "units").glob("eval-*--ar--*.json"):  # the plain-decoding units no longer count
        unit = json.loads(path.read_text())
        unit["seconds"] *= 3
        path.write_text(json.dumps(unit))
    for path in (out / "units").glob("eval-T1--*.json"):  # T = 1 units' bracketing runs twice as slow
        unit = json.loads(path.read_text())
        for reference in unit["reference"]:
            reference["seconds"] *= 2
        path.write_text(json.dumps(unit))
    second = {(r["decoder"], r["temperature"]): r for r in build_report(config, out, "early-exit:5")["rows"]}
    for key, row in first.items():
        if row["prediction"] != "a-priori" or key[0] == "ar":
            continue
        factor = 2.0 if key[1] == 1.0 else 1.0
        assert second[key]["speedup_vs_ar"] == pytest.approx(factor * row["speedup_vs_ar"], rel=1e-9), key


def test_a_rerun_for_a_missing_log_generates_that_unit_alone_without_brackets(tiny_run, tmp_path):
    # Its measurement is kept, so the plain decoding that would bracket it is not run again.
    source, _ = tiny_run
    out = tmp_path / "run"
    shutil.copytree(source, out)
    missing = sorted((out / "logs").glob("*.npz"))[0]
    missing.unlink()
    temperature, label, prompt = missing.stem.split("--")
    calls = recorded_generations(tiny_run, out, "--log-out", str(out / "logs"))
    assert missing.exists()
    assert [(t, name) for _, t, name in calls] == [(float(temperature[1:]), label)]
    assert calls[0][0] == 1000 + int(prompt)
