"""Tests of experiments/cli.py: error messages name the option the user typed; help and version."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from experiments.cli import build_parser, main, naming_the_option, option_names


def test_option_names_map_destinations_and_aliases_to_the_typed_option():
    parser = argparse.ArgumentParser()
    parser.add_argument("--top-p")
    parser.add_argument("-n", "--n")
    parser.add_argument("text", nargs="?")
    names = option_names(parser, {"max_budget": "--budget"})
    assert names == {"top_p": "--top-p", "n": "-n", "max_budget": "--budget"}  # no positional, no help


@pytest.mark.parametrize(
    "message, expected",
    [
        ("max_budget must be at least 1, got 0", "--budget must be at least 1, got 0"),
        (
            "acc entries must lie in [0, 1], got range [0.2, 1.6]",
            "--acceptance entries must lie in [0, 1], got range [0.2, 1.6]",
        ),
        ("top_p must be a number in (0, 1]", "--top-p must be a number in (0, 1]"),
        # Only the check's form is renamed: a name elsewhere, another verb, or an unknown name stay as they are.
        ("cannot read acc", "cannot read acc"),
        ("top_p is odd", "top_p is odd"),
        ("exit_layer must be below 30", "exit_layer must be below 30"),
        ("--budget must be at least 1", "--budget must be at least 1"),
    ],
)
def test_a_check_message_names_the_option_it_came_from(message, expected):
    names = {"max_budget": "--budget", "acc": "--acceptance", "top_p": "--top-p"}
    assert naming_the_option(message, names) == expected


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan-tree", "--acceptance", "[0.5]", "--budget", "0"], "--budget must be at least 1, got 0"),
        (["plan-tree", "--acceptance", "[1.5]", "--budget", "4"], "--acceptance entries must lie in [0, 1]"),
        (
            ["plan-length", "--acceptance", "[0.8, 1.5]", "--draft-time", "0.1"],
            "--acceptance entries must lie",
        ),
        (
            ["plan-length", "--acceptance", "0.8", "--draft-time", "0.1", "--top", "0"],
            "--top must be at least 1",
        ),
        (["bound", "--example", "-n", "0"], "-n must be at least 1, got 0"),
    ],
)
def test_the_command_line_reports_the_option_not_the_library_parameter(capsys, argv, message):
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert f"specbound {argv[0]}: error: {message}" in error


def test_every_option_of_every_command_has_help():
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [
        f"{name} {action.option_strings[0] if action.option_strings else action.dest}"
        for name, parser in subparsers.choices.items()
        for action in parser._actions
        if action.help is None
    ]
    assert missing == []


def test_version_prints_the_installed_distributions_version(capsys):
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()  # tomllib needs Python 3.11
    version = re.search(r'^version = "([^"]+)"$', pyproject, re.MULTILINE)[1]
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"specbound {version}"
