"""Tests of experiments/commands/__init__.py: the helpers every sub-command shares."""

from __future__ import annotations

import numpy as np
import pytest

import executor.weights
from experiments.cli import main
from experiments.commands import check_writable, check_writable_file
from experiments.logformat import write_full_log


@pytest.fixture
def blocker(tmp_path):
    """A regular file: nothing can be created below it."""
    path = tmp_path / "file"
    path.write_text("not a directory")
    return path


def test_check_writable_creates_the_directory_and_leaves_no_probe(tmp_path):
    out = tmp_path / "a" / "b"
    check_writable(str(out), "--out")
    assert out.is_dir() and list(out.iterdir()) == []


def test_check_writable_names_the_argument_and_the_path(blocker):
    with pytest.raises(ValueError, match=r"^--log-out: cannot write to .*file/x: Not a directory$"):
        check_writable(str(blocker / "x"), "--log-out")


def test_check_writable_file_refuses_a_directory(tmp_path):
    with pytest.raises(ValueError, match="--out: .* is a directory; give a file name"):
        check_writable_file(str(tmp_path), "--out")
    check_writable_file(str(tmp_path / "new" / "x.json"), "--out")
    assert (tmp_path / "new").is_dir()


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: the output check must come before any work."""

    def refuse(*args, **kwargs):
        raise AssertionError("the command loaded a model before checking its output path")

    monkeypatch.setattr(executor.weights, "load_model", refuse)


@pytest.mark.parametrize(
    ("arguments", "name"),
    [
        (["profile", "--out", "{blocked}/latency.json"], "--out"),
        (["generate", "--prompt", "x", "--decoder", "chain", "--log-out", "{blocked}/log.npz"], "--log-out"),
        (["methods", "--quick", "--out", "{blocked}/methods"], "--out"),
        (["train-drafter", "--kind", "feature", "--minutes", "1", "--out", "{blocked}/head"], "--out"),
        (["bound", "--logs", "{log}", "--workers", "0", "--out", "{blocked}/bound"], "--out"),
        (["convert-log", "{log}", "{blocked}/top.npz", "--top-k", "2"], "OUT"),
        (["bench", "--out", "{blocked}/bench.json"], "--out"),
        (["validate", "--quick", "--out", "{blocked}/run"], "--out"),
    ],
)
def test_every_command_that_writes_refuses_an_unwritable_output_first(
    arguments, name, blocker, tmp_path, no_model, capsys
):
    log = tmp_path / "log.npz"
    write_full_log(log, np.full((2, 4), 0.25), np.full((2, 4), 0.25))
    argv = [a.format(blocked=blocker, log=log) for a in arguments]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {name}: cannot write to" in err and "Traceback" not in err


def test_generate_checks_its_log_options_before_generating(no_model, capsys):
    assert main(["generate", "--prompt", "x", "--log-top-k", "3"]) == 2
    assert "--log-top-k needs --log-out" in capsys.readouterr().err
    assert main(["generate", "--prompt", "x", "--log-out", "x.npz", "--log-top-k", "0"]) == 2
    assert "--log-top-k must be at least 1, got 0" in capsys.readouterr().err
