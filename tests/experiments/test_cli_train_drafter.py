"""``specbound train-drafter``: bad options exit non-zero with the reason, before any model is loaded."""

from __future__ import annotations

from experiments.cli import main


def test_bad_options_exit_with_the_reason(capsys):
    assert main(["train-drafter", "--minutes", "0"]) == 2
    assert "--minutes must be positive" in capsys.readouterr().err
    assert main(["train-drafter", "--train-tokens", "10"]) == 2
    assert "--train-tokens must be at least 1024" in capsys.readouterr().err
    assert main(["train-drafter", "--unroll", "0"]) == 2
    assert "--unroll must be 1 to 8" in capsys.readouterr().err
    assert main(["train-drafter", "--kind", "falcon", "--unroll", "2"]) == 2
    assert "--unroll applies to --kind feature only" in capsys.readouterr().err


def test_a_bad_self_distillation_corpus_exits_with_the_reason(capsys):
    assert main(["train-drafter", "--kind", "falcon", "--corpus", "self:0"]) == 2
    assert "positive integer number of tokens" in capsys.readouterr().err
