"""experiments.apriori.cli: argument checks (exit status 2 naming the argument, before any model loads) and
the optimal verifier joining the multi-draft grid when the executor runs it."""

import hashlib
import json
import os
from dataclasses import asdict

import pytest

from experiments.apriori.cli import with_optimal_verifier
from experiments.apriori.run import AprioriConfig
from experiments.cli import main


@pytest.mark.parametrize(
    "extra, name",
    [
        (["--decoders", "chain-opt,beam"], "--decoders"),
        (["--temperatures", "0,-0.5"], "--temperatures"),
        (["--temperature", "hot"], "--temperatures"),
        (["--prompts", "1"], "--prompts"),
        (["--calibration-paths", "0"], "--calibration-paths"),
        (["--drafter", "oracle"], "--drafter"),
        (["--log-top-k", "5"], "--log-top-k"),
        (["--log-out", "logs", "--log-top-k", "0"], "--log-top-k"),
        (["--latency-repeats", "0"], "--latency-repeats"),
        (["--latency-repeats", "3", "--latency", "profile.json"], "--latency-repeats"),
    ],
)
def test_bad_arguments_exit_non_zero_naming_them(extra, name, tmp_path, capsys):
    assert main(["validate", *extra, "--out", str(tmp_path / "run")]) == 2
    assert name in capsys.readouterr().err


def test_unwritable_output_directory_is_named(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main(["validate", "--quick", "--out", str(blocker / "run")]) == 2
    assert "--out" in capsys.readouterr().err
    assert not os.path.exists(blocker / "run")


def test_unwritable_log_directory_is_named(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main(["validate", "--quick", "--out", str(tmp_path / "run"), "--log-out", str(blocker / "x")]) == 2
    assert "--log-out" in capsys.readouterr().err


def test_optimal_verifier_joins_the_grid_only_when_the_executor_has_it(monkeypatch):
    import executor.decoders

    grid = (("rrs", 2), ("kseq", 3), ("spechub", 2))
    monkeypatch.setattr(executor.decoders, "TREE_VERIFIERS", ("rrs", "kseq", "spechub"))
    assert with_optimal_verifier(grid) == grid
    monkeypatch.setattr(executor.decoders, "TREE_VERIFIERS", ("rrs", "kseq", "spechub", "optimal"))
    assert with_optimal_verifier(grid) == (*grid, ("optimal", 2), ("optimal", 3))


def test_the_default_latency_repeats_keep_earlier_runs_fingerprints():
    # A run directory written before --latency-repeats existed resumes only if its fingerprint is unchanged:
    # the field leaves the hash at its default and changes it otherwise.
    default = AprioriConfig()
    assert AprioriConfig(latency_repeats=default.latency_repeats).fingerprint() == default.fingerprint()
    settings = {k: v for k, v in asdict(default).items() if k not in ("latency_repeats", "quantize")}
    assert (
        default.fingerprint()
        == hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    )
    assert AprioriConfig(latency_repeats=3).fingerprint() != default.fingerprint()
