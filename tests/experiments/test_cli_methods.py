"""``specbound methods``: bad arguments, and an end-to-end ``--quick`` run on a tiny model saved to disk."""

from __future__ import annotations

import json

import pytest

import executor.methods as methods
from experiments.cli import main
from tests.tiny_models import build_tiny_model

REQUIRED = {
    "method",
    "temperature",
    "measured_tau",
    "predicted_tau",
    "acceptance_by_position",
    "tokens_per_s",
    "speedup_vs_ar",
    "greedy_identical",
    "lossless",
    "train_seconds",
    "drafter_train_seconds",
}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--only", "medusa"], "unknown method 'medusa'"),
        (["--only", ","], "--only needs at least one method"),
        (["--set", "ppd"], "METHOD.OPTION=VALUE"),
        (["--set", "medusa.k=1"], "unknown method 'medusa'"),
        (["--prompts", "0"], "--prompts must be at least 1"),
        (["--max-new-tokens", "-3"], "--max-new-tokens must be at least 1"),
    ],
)
def test_bad_arguments_exit_non_zero_naming_the_problem(tmp_path, capsys, arguments, message):
    code = main(["methods", "--quick", "--out", str(tmp_path / "run"), *arguments])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_dtype_is_one_of_the_model_commands_choices(tmp_path, capsys):
    with pytest.raises(SystemExit) as error:
        main(["methods", "--quick", "--out", str(tmp_path / "run"), "--dtype", "int8"])
    assert error.value.code == 2
    assert "--dtype: invalid choice: 'int8'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_out_is_required(capsys):
    with pytest.raises(SystemExit) as error:
        main(["methods", "--quick"])
    assert error.value.code == 2
    assert "--out" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A random 4-layer model with SmolLM2's vocabulary and tokenizer, saved in Hugging Face layout."""
    from executor.weights import load_tokenizer, save_safetensors

    tokenizer = load_tokenizer()
    model = build_tiny_model(seed=1, vocab_size=tokenizer.vocab_size, n_layers=4, dim=16, max_seq_len=640)
    directory = tmp_path_factory.mktemp("tiny")
    save_safetensors(model, directory, tokenizer)
    return directory


def test_quick_run_on_a_tiny_model_writes_every_row_and_resumes(
    tiny_checkpoint, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # PPD's tokens stay out of the user's cache
    out = tmp_path / "run"
    arguments = ["methods", "--quick", "--model", str(tiny_checkpoint), "--out", str(out), "--threads", "1"]
    arguments += ["--prompts", "1", "--max-new-tokens", "8", "--dtype", "float32"]
    arguments += ["--set", "ppd.train_steps=2"]
    assert main(arguments) == 0
    assert "specbound methods" in capsys.readouterr().out
    report = json.loads((out / "methods.json").read_text())
    rows = {(row["method"], row["temperature"]) for row in report["rows"]}
    expected = {(name, t) for name in methods.names() for t in (0.0, 1.0)} - {("code-completion", 1.0)}
    assert rows == expected
    for row in report["rows"]:
        assert REQUIRED <= set(row)
        if row["lossless"]:
            assert row["measured_tau"] >= 1 and row["predicted_tau"] >= 1
            if row["temperature"] == 0:
                assert row["greedy_identical"] is True
        else:
            assert row["greedy_identical"] is None and 0 <= row["rouge_l"] <= 1
    assert (out / "methods.md").read_text().count("\n| ") == len(report["rows"]) + 1
    assert (out / "methods.png").stat().st_size > 0
    assert not list(out.rglob("*.tmp"))

    # --quick shares plain decoding between the units of one temperature (one run per prompt).
    units = [json.loads(path.read_text()) for path in (out / "units").glob("*--T0.json")]
    assert len({unit["prompts"][0]["ar_wall_time"] for unit in units}) == 1 < len(units)
    for row in report["rows"]:
        assert ("where_it_pays" in row) and ("prediction_check" in row)

    # A second run finds every unit done and runs nothing.
    import experiments.methods_run as runner

    def refuse(*args, **kwargs):
        raise AssertionError("a finished unit was run again")

    monkeypatch.setattr(runner, "run_unit", refuse)
    assert main(arguments) == 0
    # Other settings in the same directory are refused, naming --restart.
    assert main([*arguments, "--only", "dyspec"]) == 2
    assert "--restart" in capsys.readouterr().err


def test_every_method_runs_on_an_int8_target_and_stays_greedy(tiny_checkpoint, tmp_path, capsys):
    # The int8 model is the target: lossless methods must reproduce its own greedy text.
    out = tmp_path / "int8"
    arguments = ["methods", "--quick", "--model", str(tiny_checkpoint), "--out", str(out), "--threads", "1"]
    arguments += ["--prompts", "1", "--max-new-tokens", "8", "--quantize", "int8", "--dtype", "float32"]
    # PPD trains its prompt tokens through the target, which int8 cannot differentiate: refused by name.
    trained_through_target = {"ppd"}
    assert main([*arguments, "--only", "ppd", "--out", str(tmp_path / "ppd")]) != 0
    assert "int8 kernel has no derivative" in capsys.readouterr().err
    others = [name for name in methods.names() if name not in trained_through_target]
    assert main([*arguments, "--only", ",".join(others)]) == 0
    report = json.loads((out / "methods.json").read_text())
    assert json.loads((out / "config.json").read_text())["config"]["quantize"] == "int8"
    greedy = [row for row in report["rows"] if row["lossless"] and row["temperature"] == 0]
    assert len(greedy) == len(others) - 1  # code-completion is not lossless
    assert all(row["greedy_identical"] is True for row in greedy)
