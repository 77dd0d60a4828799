"""Tests of the opt-in compiled step: the one-line eager fallback (no compiler, or a failing backend), input
checks, warm-up bounds and, on a tiny model, compiled logits equal to eager ones (slow: Inductor compiles)."""

from __future__ import annotations

import pytest
import torch

from executor import compiled
from executor.compiled import compile_and_warm_up, compile_model, warm_up


def test_without_a_compiler_the_model_stays_eager_with_one_line(tiny_model, monkeypatch, capsys):
    model = tiny_model(1)
    expected = model(torch.tensor([[1, 2, 3]]), torch.arange(3))
    monkeypatch.setattr(compiled, "compiler_available", lambda: False)
    assert compile_model(model) is model and model.step is None
    message = capsys.readouterr().err
    assert message.count("\n") == 1 and "C++ compiler" in message
    torch.testing.assert_close(model(torch.tensor([[1, 2, 3]]), torch.arange(3)), expected, atol=0, rtol=0)


FAILURES = {
    "torch.compile failed": lambda: torch._dynamo.exc.BackendCompilerFailed(
        None, RuntimeError("no cc1plus"), None
    ),
    "recompile limit": lambda: torch._dynamo.exc.FailOnRecompileLimitHit("recompile_limit reached"),
}


@pytest.mark.parametrize("message", FAILURES)
def test_a_compile_failure_at_a_call_falls_back_to_eager(tiny_model, monkeypatch, capsys, message):
    model = tiny_model(2)
    expected = model(torch.tensor([[4, 5]]), torch.arange(2))

    def broken_compile(function, **options):
        def run(*args):
            raise FAILURES[message]()

        return run

    monkeypatch.setattr(compiled, "compiler_available", lambda: True)
    monkeypatch.setattr(torch, "compile", broken_compile)
    compile_model(model)
    assert model.step is not None
    torch.testing.assert_close(model(torch.tensor([[4, 5]]), torch.arange(2)), expected, atol=0, rtol=0)
    assert model.step is None and message in capsys.readouterr().err


def test_compile_model_and_warm_up_reject_bad_input(tiny_model):
    with pytest.raises(ValueError, match="model"):
        compile_model(torch.nn.Linear(2, 2))
    model = tiny_model(0, max_seq_len=8)
    with pytest.raises(ValueError, match="slots"):
        warm_up(model, (1, 4), context=6)
    with pytest.raises(ValueError, match="token_counts"):
        warm_up(model, (0,), context=2)


def test_compile_and_warm_up_sets_up_a_cache_warms_every_size_and_reports_a_fallback(tiny_model, monkeypatch):
    sizes = []

    def counting_compile(function, **options):
        def step(*args):
            sizes.append(args[0].shape[1])
            return function(*args)

        return step

    monkeypatch.setattr(compiled, "compiler_available", lambda: True)
    monkeypatch.setattr(torch, "compile", counting_compile)
    model = tiny_model(4, max_seq_len=64)
    model.setup_cache(8)  # too small: compile_and_warm_up allocates context + max(sizes) slots
    seconds = compile_and_warm_up(model, (4, 1, 2))
    assert seconds >= 0 and sizes == [16, 1, 2, 4] and model.cache_slots == 20
    # No compiler: the model stays eager and the answer is None, not a time.
    monkeypatch.setattr(compiled, "compiler_available", lambda: False)
    assert compile_and_warm_up(tiny_model(4), (1,)) is None


@pytest.mark.slow
def test_compiled_logits_equal_eager_on_a_tiny_model_with_tree_masks(tiny_model):
    model = tiny_model(3)
    eager = tiny_model(3)
    compile_model(model)
    assert compiled.compiler_available() and model.step is not None
    for m in (model, eager):
        m(torch.tensor([[1, 2, 3, 4]]), torch.arange(4))
    mask = torch.tensor(
        [[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 1]], dtype=torch.bool
    )
    calls = [
        ((torch.tensor([[5]]), torch.tensor([4])), {}),
        (
            (torch.tensor([[6, 7, 8]]), torch.arange(4, 7)),
            {"attention_mask": mask, "positions": torch.tensor([4, 5, 5])},
        ),
        ((torch.tensor([[9, 1]]), torch.arange(5, 7)), {"exit_layer": 1}),
    ]
    for args, kwargs in calls:
        torch.testing.assert_close(model(*args, **kwargs), eager(*args, **kwargs), atol=1e-5, rtol=1e-5)
