"""``specbound generate`` and ``executor.generate.generate`` on the embedded model."""

from __future__ import annotations

import json
import re

import pytest
import torch

from executor.generate import generate
from experiments.cli import main


@pytest.fixture(scope="module")
def smollm():
    from executor.weights import load_model

    return load_model(device="cpu", dtype=torch.float32)


def test_cli_json_reports_tokens_text_tau_acceptance_and_speed(capsys):
    code = main(
        [
            "generate",
            "--prompt",
            "def add(a, b):",
            "--decoder",
            "chain",
            "--drafter",
            "ngram",
            "--gamma",
            "3",
            "--max-new-tokens",
            "8",
            "--json",
            "--threads",
            "1",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["token_ids"]) == 8
    assert report["text"]
    assert report["tau"] >= 1.0
    assert isinstance(report["acceptance_per_position"], list)
    assert report["tokens_per_second"] > 0


def test_cli_text_mode_prints_steps_and_tau_of_a_speculative_decoder_on_stderr(capsys):
    argv = ["generate", "def add(a, b):", "--decoder", "chain", "--drafter", "ngram", "--gamma", "3"]
    argv += ["--max-new-tokens", "12", "--threads", "1"]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out == report["text"] + "\n"  # greedy: the same text
    assert captured.err.startswith("12 tokens in ")
    assert f"; {report['steps']} steps, tau {report['tau']:.2f} tokens per step; chain)" in captured.err


def test_python_call_matches_the_cli_and_greedy_decoders_agree(smollm, capsys):
    model, tokenizer = smollm
    reference = generate("def add(a, b):", model=model, tokenizer=tokenizer, max_new_tokens=8)
    main(
        [
            "generate",
            # the prompt as a positional argument here, as --prompt in the JSON test above
            *("def add(a, b):", "--max-new-tokens", "8", "--threads", "1", "--dtype", "float32"),
        ]
    )
    captured = capsys.readouterr()
    assert captured.out == reference.text + "\n"  # the text alone on stdout; statistics go to stderr
    assert re.fullmatch(r"8 tokens in [0-9.]+ s \([0-9.]+ tokens/s; ar\)\n", captured.err)
    tree = generate(
        "def add(a, b):",
        model=model,
        tokenizer=tokenizer,
        max_new_tokens=8,
        decoder="tree",
        drafter="early-exit:4",
        gamma=2,
        n=2,
    )
    assert tree.token_ids == reference.token_ids


def test_chat_prompt_uses_the_chat_template(smollm):
    model, tokenizer = smollm
    result = generate("Hi", model=model, tokenizer=tokenizer, chat=True, max_new_tokens=2)
    assert result.prompt_ids == tokenizer.encode(
        tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prompt", ""], "the prompt must be a non-empty string"),
        (["--prompt", "x", "--max-new-tokens", "-1"], "--max-new-tokens must be an integer >= 0"),
        (["--prompt", "x", "--decoder", "chain", "--drafter", "bogus"], "unknown drafter 'bogus'"),
        (["--prompt", "x", "--decoder", "multidraft", "--verifier", "bogus"], "--verifier must be one of"),
        (["--prompt", "x", "--decoder", "chain", "--drafter", "early-exit:99"], "exit_layer must be below"),
        # the argument the user gave, not the tree budget gamma * n + 1 it becomes (issue 7)
        (["--prompt", "x", "--decoder", "tree", "--gamma", "0"], "--gamma must be at least 1, got 0"),
        (["--prompt", "x", "--decoder", "tree", "--n", "0"], "-n must be at least 1, got 0"),
        (["x", "--decoder", "tree", "-n", "0"], "-n must be at least 1, got 0"),  # -n as in specbound bound
        ([], "no prompt: give the text to continue once"),
        (["x", "--prompt", "y"], "both PROMPT and --prompt"),
    ],
)
def test_cli_bad_input_exits_2_with_a_clear_message(capsys, argv, message):
    assert main(["generate", "--threads", "1", *argv]) == 2
    assert message in capsys.readouterr().err


def test_dtype_must_be_a_known_name_and_match_a_given_model(smollm, capsys):
    model, tokenizer = smollm
    with pytest.raises(ValueError, match="dtype must be one of"):
        generate("x", model=model, tokenizer=tokenizer, dtype="half", max_new_tokens=1)
    with pytest.raises(ValueError, match="dtype 'bfloat16' differs from the given model's torch.float32"):
        generate("x", model=model, tokenizer=tokenizer, dtype="bfloat16", max_new_tokens=1)
    # The model's own dtype, by name or "auto", is accepted.
    generate("x", model=model, tokenizer=tokenizer, dtype="float32", max_new_tokens=1)
    with pytest.raises(SystemExit):
        main(["generate", "--prompt", "x", "--dtype", "half"])
    assert "--dtype: invalid choice: 'half'" in capsys.readouterr().err


def test_prompt_longer_than_the_context_is_an_error(smollm):
    model, tokenizer = smollm
    with pytest.raises(ValueError, match="longer than the model's context"):
        generate("hello " * 9000, model=model, tokenizer=tokenizer, max_new_tokens=1)


def test_drafter_help_lists_every_kind_parse_drafter_accepts(capsys, monkeypatch):
    from executor.drafters import DRAFTER_KINDS
    from experiments.commands.generate import DRAFTER_FORMS, drafter_forms

    assert list(DRAFTER_FORMS) == list(DRAFTER_KINDS)
    monkeypatch.setenv("COLUMNS", "400")  # one line per option: argparse wraps at hyphens otherwise
    for command in ("generate", "validate"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert drafter_forms() in capsys.readouterr().out


def test_unknown_drafter_message_names_every_kind(capsys):
    from experiments.commands.generate import drafter_forms

    assert main(["validate", "--drafter", "nonsense", "--out", "unused"]) == 2
    assert drafter_forms() in capsys.readouterr().err


def test_validate_refuses_a_combined_drafter_it_cannot_predict(capsys):
    assert main(["validate", "--drafter", "ngram+feature", "--out", "unused"]) == 2
    assert "--drafter: 'ngram+feature' combines prompt lookup" in capsys.readouterr().err
