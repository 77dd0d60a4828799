"""Tests of the opt-in compiled step: the one-line eager fallback (no compiler, or a failing backend), input
checks, warm-up bounds, the compile cache's directory and, on a tiny model, compiled logits equal to eager ones
and a multi-prompt run that compiles nothing after its first prompt (slow: Inductor compiles)."""

from __future__ import annotations

import os

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from executor import compiled, products
from executor.compiled import compile_and_warm_up, compile_model, inductor_cache_dir, warm_up
from executor.decoders import AutoregressiveDecoder, ChainDecoder
from executor.drafters import PromptLookupDrafter
from executor.quantize import quantize_model

#: Three tree nodes after four committed slots: two siblings under the first.
TREE_MASK = torch.tensor(
    [[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 1]], dtype=torch.bool
)


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
    with pytest.raises(ValueError, match="more than"):  # 6 + 2 = all 8 slots: a graph no decoder needs
        warm_up(model, (1, 2), context=6)
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
    model.setup_cache(20)  # too small: compile_and_warm_up allocates context + max(sizes) + 1 slots
    seconds = compile_and_warm_up(model, (4, 1, 2))
    assert seconds >= 0 and sizes == [16, 1, 2, 4] and model.cache_slots == 21
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
    calls = [
        ((torch.tensor([[5]]), torch.tensor([4])), {}),
        (
            (torch.tensor([[6, 7, 8]]), torch.arange(4, 7)),
            {"attention_mask": TREE_MASK, "positions": torch.tensor([4, 5, 5])},
        ),
        ((torch.tensor([[9, 1]]), torch.arange(5, 7)), {"exit_layer": 1}),
    ]
    for args, kwargs in calls:
        torch.testing.assert_close(model(*args, **kwargs), eager(*args, **kwargs), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_a_compiled_int8_model_attends_under_the_mask_and_decodes_as_its_plain_decoding(tiny_model):
    # Eager, its row-wise attention reads the mask's values, which Dynamo cannot trace (fullgraph: an error);
    # compiled, several tokens attend under the mask, equal to the eager rows up to round-off.
    torch._dynamo.reset()
    counters.clear()
    model, eager = quantize_model(tiny_model(3)), quantize_model(tiny_model(3))
    assert model.rowwise_attention
    compile_model(model)
    calls = [
        ((torch.tensor([[1, 2, 3, 4]]), torch.arange(4)), {}),
        (
            (torch.tensor([[6, 7, 8]]), torch.arange(4, 7)),
            {"attention_mask": TREE_MASK, "positions": torch.tensor([4, 5, 5])},
        ),
        ((torch.tensor([[5]]), torch.tensor([4])), {}),
    ]
    for args, kwargs in calls:
        torch.testing.assert_close(model(*args, **kwargs), eager(*args, **kwargs), atol=1e-2, rtol=1e-2)
    assert counters["stats"]["unique_graphs"] >= 2 and model.step is not None
    prompt = [6, 7, 8, 6, 7, 8, 6, 7, 8, 9, 10, 11, 6, 7]
    plain = AutoregressiveDecoder(model).generate(prompt, 12)
    chain = ChainDecoder(model, PromptLookupDrafter(), gamma=3).generate(prompt, 12)
    assert chain.token_ids == plain.token_ids
    assert sum(len(step.tokens) - 1 for step in chain.steps) > 0  # it drafted: masked passes verified


@pytest.mark.slow
@pytest.mark.skipif(not products.packing_available(), reason="this torch build has no oneDNN")
def test_the_compiled_graph_multiplies_on_the_packed_copies_and_equals_packed_eager(tiny_model, monkeypatch):
    monkeypatch.setattr(products, "MIN_PACKED_ELEMENTS", 0)  # pack even a test model's small weights
    model, eager = tiny_model(4), tiny_model(4)
    compile_model(model)
    weights = [model.tok_embeddings.weight] + [
        module.weight for module in model.modules() if isinstance(module, torch.nn.Linear)
    ]
    table = products._PACKED_NATIVE if products.native_available(torch.float32) else products._PACKED
    assert not any(weight in table for weight in weights)
    tokens, slots = torch.tensor([[3, 1, 4, 1, 5, 9]]), torch.arange(6)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, slots), eager(tokens, slots), atol=1e-5, rtol=1e-5)
        # Every product of the compiled forward ran on a copy it packed (the eager model packed its own).
        assert all(weight in table for weight in weights) and model.step is not None
        for weight in weights:
            weight.mul_(0.5)  # in place, after compiling: the graph's next call repacks
        # The reference packs its own copies of the changed weights (a model whose copies were changed the same
        # way would go stale alike and hide a missed repack).
        changed = tiny_model(4)
        changed.load_state_dict(model.state_dict())
        torch.testing.assert_close(model(tokens, slots), changed(tokens, slots), atol=1e-5, rtol=1e-5)


def test_the_compile_cache_goes_next_to_the_drafters_unless_the_user_chose_a_directory(
    tiny_model, tmp_path, monkeypatch
):
    monkeypatch.setattr(compiled, "compiler_available", lambda: True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    expected = str(tmp_path / "specbound" / "inductor")
    # Unset, or Inductor's default (which importing torch._dynamo writes into the environment): ours.
    for value in (None, default_cache_dir()):
        if value is None:
            monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        else:
            monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", value)
        assert inductor_cache_dir() == expected
        compile_model(tiny_model(0))  # torch.compile is lazy: nothing compiles until a call
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == expected
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    compile_model(tiny_model(0))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == inductor_cache_dir() == str(tmp_path / "mine")


@pytest.mark.slow
def test_a_compiled_run_over_prompts_of_different_lengths_compiles_no_graph_after_the_first_prompt(
    tiny_model,
):
    # Dynamo's code cache and counters are per process: start from none, as a new process would.
    torch._dynamo.reset()
    counters.clear()
    model, eager = tiny_model(5, max_seq_len=96), tiny_model(5, max_seq_len=96)
    compile_model(model)
    # The first prompt ends in an n-gram seen before, so prompt lookup drafts (a masked pass) on it too.
    prompts = [
        [1, 2, 3, 4, 5, 1, 2, 3],
        [6, 7, 8, 6, 7, 8, 6, 7, 8, 9, 10, 11, 6, 7],
        [2, 3, 2, 3],
        [9, 1, 9, 1, 9, 1, 2, 4, 9, 1, 9, 1, 5, 6, 7, 8, 9, 1, 2, 3, 9],
        [4, 4, 5, 11, 4, 4],
    ]

    def decoders(target):
        return [AutoregressiveDecoder(target), ChainDecoder(target, PromptLookupDrafter(), gamma=3)]

    graphs, slots, drafted = [], set(), 0
    for prompt in prompts:
        for ours, theirs in zip(decoders(model), decoders(eager), strict=True):
            result = ours.generate(prompt, 10)
            assert result.token_ids == theirs.generate(prompt, 10).token_ids
            slots.add(model.cache_slots)
            drafted += sum(len(step.tokens) - 1 for step in result.steps)
        graphs.append(counters["stats"]["unique_graphs"])
    # Ten KV caches of ten sizes, prompt lookup drafted, and the graphs of the first prompt served them all.
    assert len(slots) == 2 * len(prompts) and drafted > 0 and model.step is not None
    assert graphs[0] >= 2 and graphs == [graphs[0]] * len(prompts)
