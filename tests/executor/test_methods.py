"""executor.methods: the registry and interface, and every lossless method's losslessness on tiny models
(greedy output identical to plain decoding; the exact law of the next three tokens at temperature 1 by a
G-test, with negative controls that break a verifier and must be caught)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import executor.methods as methods
from executor.decoders import AutoregressiveDecoder, Sampling
from executor.decoders import chain as chain_module
from executor.decoders import tree as tree_module
from executor.drafters import EarlyExitDrafter
from executor.methods.base import LayerCounter
from executor.methods.ppd import PromptTokens
from tests.executor.test_decoders import (
    HORIZON,
    P_THRESHOLD,
    PROMPT,
    SAMPLES,
    exact_law,
    outcome_p_value,
)

VOCAB = 8
LOSSLESS = [name for name in methods.names() if methods.get(name).lossless]

#: Options that fit a 4-layer test model (exit layers, budgets, lengths).
TINY_OPTIONS = {
    "dyspec": {"exit_layer": 1, "budget": 5, "max_depth": 3, "width": 2},
    "sequoia": {"exit_layer": 1, "budget": 5, "max_depth": 3, "width": 2},
    "staged": {"exit_layer": 1, "budget": 5, "max_depth": 3, "width": 2, "inner_length": 3},
    "staged-single": {"exit_layer": 1, "budget": 5, "max_depth": 3, "width": 2},
    "easyspec": {"exit_layer": 3, "gamma": 2, "group_size": 2, "exact_layers": 0},
    "del": {"layers": [1, 2, 3], "max_gamma": 4},
    "kangaroo": {"exit_layer": 1, "gamma": 3},
    "kangaroo-fixed": {"exit_layer": 1, "gamma": 3},
    "specdecpp": {"exit_layer": 1, "max_length": 3},
    "specdecpp-fixed": {"exit_layer": 1, "max_length": 3},
    "specdecpp-heuristic": {"exit_layer": 1, "max_length": 3},
    "code-completion": {"exit_layers": [2]},
    "online": {"gamma": 3, "steps": 2, "lr": 1e-2, "window": 16},
    # Untrained prompt tokens: the law and greedy identity hold whatever the guesses are.
    # A branching tree (two guesses at depth 1), so that the law tests cover PPD's sparse tree.
    "ppd": lambda model: {"prompts": PromptTokens(model, 2), "tree": [-1, 0, 0, 1]},
}


def spread_model(tiny_model, seed: int = 3):
    """A 4-layer tiny model whose next-token laws are spread out (final-norm gain scaled down)."""
    model = tiny_model(seed, vocab_size=VOCAB, n_layers=4, max_seq_len=48)
    with torch.no_grad():
        model.norm.weight.mul_(0.12)
    return model


def build(name: str, model, calibrate: float | None = None):
    options = TINY_OPTIONS[name]
    method = methods.get(name)(model, **(options(model) if callable(options) else options))
    if calibrate is not None:
        method.predict([[3, 1, 4, 1, 5], [2, 7, 1, 6]], calibrate, 6)
    return method


def test_registry_lists_every_seed_method_and_gets_them_by_name():
    assert set(methods.names()) == set(TINY_OPTIONS)
    for name in methods.names():
        cls = methods.get(name)
        assert cls.name == name and issubclass(cls, methods.Method) and cls.paper
    assert [n for n in methods.names() if not methods.get(n).lossless] == ["code-completion"]


@pytest.mark.parametrize("bad", ["medusa", "", None, 3])
def test_unknown_method_names_raise_a_value_error_listing_the_known_ones(bad):
    with pytest.raises(ValueError, match="unknown method .*dyspec"):
        methods.get(bad)


def test_registering_a_second_method_under_a_taken_name_is_refused():
    class Impostor(methods.Method):
        name = "dyspec"

        def build(self, temperature=0.0):
            raise AssertionError

    with pytest.raises(ValueError, match="already registered"):
        methods.register(Impostor)
    with pytest.raises(ValueError, match="Method subclasses"):
        methods.register(int)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("dyspec", {"budget": 1}, "budget"),
        ("sequoia", {"exit_layer": 4}, "exit_layer"),
        ("kangaroo", {"eta": 1.5}, "eta"),
        ("specdecpp", {"max_length": 0}, "max_length"),
        ("specdecpp-fixed", {"max_length": 3, "length": 4}, "length must be at most"),
        ("easyspec", {"group_size": 0}, "group_size"),
        ("del", {"layers": [9]}, "layers"),
        ("code-completion", {"exit_layers": [0]}, "exit_layers"),
        ("code-completion", {"stop_threshold": -0.1}, "stop_threshold"),
        ("online", {"update_every": 0}, "update_every"),
        ("online", {"lr": 0}, "lr"),
        ("online", {"learn": "yes"}, "learn"),
        ("ppd", {"prompt_tokens": 0}, "prompt_tokens"),
        ("ppd", {"train_steps": 0}, "train_steps"),
        ("ppd", {"prompts": "trained"}, "prompts"),
        ("ppd", {"tree": "sparse"}, "tree"),
        ("ppd", {"tree": [-1, 0, 1, 2, 3]}, "deeper than the 3 guesses"),
        ("ppd", {"guesses": 4}, "guesses must be at most"),
        ("dyspec", {"drafter": 3}, "drafter"),
        ("staged", {"drafter": "feature"}, "drafter"),
        ("staged", {"inner_length": 0}, "inner_length"),
        ("staged-single", {"inner_length": 2}, "inner_length"),
        (
            "staged",
            {"exit_layer": 1, "trained": True},
            "no trained exit:K head is cached for this target at layer 1",
        ),
        ("easyspec", {"trained": True}, "no trained exit:K head is cached"),
    ],
)
def test_bad_method_options_raise_a_value_error_naming_the_option(tiny_model, name, options, message):
    model = spread_model(tiny_model)
    with pytest.raises(ValueError, match=message):
        methods.get(name)(model, **options)


def test_tree_methods_draft_with_the_named_drafter_and_fall_back_to_the_early_exit(
    tiny_model, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no trained feature head cached for the tiny model
    model = spread_model(tiny_model)
    fallback = methods.get("sequoia")(model, exit_layer=2)
    assert fallback.options()["drafter"] == "early-exit:2"
    assert isinstance(fallback.make_drafter(), EarlyExitDrafter) and fallback.make_drafter().exit_layer == 2
    named = methods.get("dyspec")(model, drafter="early-exit:1")
    assert named.options()["drafter"] == "early-exit:1" and named.make_drafter().exit_layer == 1
    assert methods.get("staged")(model, exit_layer=2).options()["drafter"] == "early-exit:2"


def test_a_negative_temperature_is_refused(tiny_model):
    method = build("kangaroo", spread_model(tiny_model))
    with pytest.raises(ValueError, match="temperature"):
        method.run(PROMPT, temperature=-1.0, max_new_tokens=2)


def test_layer_counter_counts_layer_tokens_passes_and_heads(tiny_model):
    model = spread_model(tiny_model)
    with LayerCounter(model) as counter:
        AutoregressiveDecoder(model).generate(PROMPT, 3)
    # prefill of 4 tokens + 3 one-token steps, 4 layers each; one head call per forward.
    assert counter.total == 4 * (4 + 3) and counter.passes == 4 * 4 and counter.heads == 4
    counter.exclude_prefill(len(PROMPT))
    assert counter.total == 4 * 3 and counter.passes == 4 * 3 and counter.heads == 3


@pytest.mark.parametrize("name", LOSSLESS)
@pytest.mark.parametrize("seed", [3, 5])
def test_every_lossless_method_reproduces_greedy_decoding_token_for_token(tiny_model, name, seed):
    model = spread_model(tiny_model, seed)
    reference = AutoregressiveDecoder(model).generate(PROMPT, 16).token_ids
    method = build(name, model, calibrate=0.0)
    result = method.run(PROMPT, temperature=0.0, max_new_tokens=16)
    assert result.token_ids == reference
    assert result.steps <= 16 and result.layer_evaluations > 0


_real_verify_multidraft = tree_module.verify_multidraft_unchecked
_real_verify_chain = chain_module.verify_chain


def _letters_swapped(name, target_probs, draft_probs, drafts, generator):
    """The classic bug of papers that name the target q: accept with min(1, q/p), residual (q - p)+."""
    return _real_verify_multidraft(name, draft_probs, target_probs, drafts, generator)


def _chain_letters_swapped(target_probs, draft_probs, drafts, generator):
    """The same bug in the chain verifier: accept with min(1, q/p), residual (q - p)+."""
    swapped_target = torch.cat([draft_probs, target_probs[-1:]])  # the bonus row stays the target's
    return _real_verify_chain(swapped_target, target_probs[:-1], drafts, generator)


def sample_outcomes(method, seed: int, count: int = SAMPLES) -> list[tuple[int, ...]]:
    decoder = method.build(1.0)
    generator = torch.Generator().manual_seed(seed)
    return [tuple(decoder.generate(PROMPT, HORIZON, generator=generator).token_ids) for _ in range(count)]


@pytest.mark.slow
@pytest.mark.parametrize("name", LOSSLESS)
def test_every_lossless_method_samples_the_exact_target_law_of_the_next_three_tokens(tiny_model, name):
    model = spread_model(tiny_model)
    method = build(name, model, calibrate=1.0)
    law = exact_law(model, Sampling(temperature=1.0))
    assert np.max(law) < 0.5  # spread out: a broken verifier would show
    p_value = outcome_p_value(sample_outcomes(method, seed=11), law)
    assert p_value > P_THRESHOLD, f"{name}: G-test p = {p_value:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "module", "attribute", "broken"),
    [
        ("kangaroo", chain_module, "verify_chain", _chain_letters_swapped),
        ("dyspec", tree_module, "verify_multidraft_unchecked", _letters_swapped),
        ("ppd", tree_module, "verify_multidraft_unchecked", _letters_swapped),
    ],
)
def test_the_law_test_catches_a_broken_verifier_inside_a_method(
    tiny_model, monkeypatch, name, module, attribute, broken
):
    """Negative control: the same seed, samples and threshold reject a method whose verifier is broken
    (p = 2e-16 to 4e-32 at 400 samples on 2026-11-28; the joint test alone gave 2e-5 to 0.2 there)."""
    model = spread_model(tiny_model)
    method = build(name, model, calibrate=1.0)
    law = exact_law(model, Sampling(temperature=1.0))
    monkeypatch.setattr(module, attribute, broken)
    p_value = outcome_p_value(sample_outcomes(method, seed=11), law)
    assert p_value < P_THRESHOLD, f"the broken {attribute} went unnoticed in {name}: p = {p_value:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("name", LOSSLESS)
def test_every_lossless_method_equals_greedy_decoding_on_smollm(smollm, name):
    model, tokenizer = smollm
    from experiments.prompts import humaneval_prompts

    prompt = tokenizer.encode(humaneval_prompts(3)[2])
    reference = AutoregressiveDecoder(model).generate(prompt, 10).token_ids
    # PPD's prompt tokens untrained here (training is minutes; greedy identity holds for any prompt tokens).
    options = {"prompts": PromptTokens(model, 3)} if name == "ppd" else {}
    result = methods.get(name)(model, tokenizer, **options).run(prompt, temperature=0.0, max_new_tokens=10)
    assert result.token_ids == reference
