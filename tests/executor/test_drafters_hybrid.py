"""``ngram+D``: prompt lookup where the suffix matches, a model drafter elsewhere, chosen per step."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.decoders import AutoregressiveDecoder, ChainDecoder, DynamicTree, Sampling, TreeDecoder
from executor.drafters import EarlyExitDrafter, LookupFirstDrafter, ModelDrafter, PromptLookupDrafter
from executor.drafters import separate_model as separate_model_module
from executor.drafters.parse import (
    LOOKUP_MIN_NGRAM,
    LOOKUP_MODEL_TOKENS,
    drafter_parts,
    is_lookup_first,
    parse_drafter,
)
from executor.generate import generate
from tests.executor.test_decoders import (
    P_THRESHOLD,
    PROMPT,
    cache_of,
    exact_law,
    flat_tiny_model,
    fresh_prefill_cache,
    outcome_p_value,
    sample_outcomes,
)


def lookup_first(draft_model, **kwargs) -> LookupFirstDrafter:
    return LookupFirstDrafter(PromptLookupDrafter(min_ngram=2), ModelDrafter(draft_model), **kwargs)


def test_lookup_min_ngram_ignores_shorter_matches():
    lookup = PromptLookupDrafter(max_ngram=3, min_ngram=2)
    assert lookup.propose([5, 6, 7, 1, 5]) == []  # only a one-token match ("5")
    assert PromptLookupDrafter().propose([5, 6, 7, 1, 5]) == [6, 7, 1, 5]
    assert lookup.propose([5, 6, 7, 1, 5, 6]) == [7, 1, 5, 6]
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupDrafter(max_ngram=2, min_ngram=3)


def test_each_step_drafts_from_the_lookup_exactly_when_the_suffix_matches(tiny_model):
    target = tiny_model(21, vocab_size=16, max_seq_len=128)
    drafter = lookup_first(tiny_model(22, vocab_size=16, max_seq_len=128))
    decoder = ChainDecoder(target, drafter, gamma=3, log_distributions="full")
    prompt = [3, 4, 9, 1, 3, 4]  # "3 4" occurred before: the first step is the lookup's
    result = decoder.generate(prompt, 24)
    text = list(prompt)
    for step in result.steps:
        expected = PromptLookupDrafter(min_ngram=2).propose(text)
        assert step.deterministic_drafts == bool(expected)
        if expected:
            drafted = step.tokens[1:]  # a chain: node i is the i-th draft
            assert drafted == expected[: len(drafted)]
        text += step.emitted
    assert drafter.lookup_steps + drafter.model_steps == len(result.steps)
    assert drafter.lookup_steps > 0 and drafter.model_steps > 0


def test_model_tokens_caps_the_model_drafters_chain_but_not_the_lookups(tiny_model):
    target = tiny_model(21, vocab_size=16, max_seq_len=128)
    drafter = lookup_first(tiny_model(22, vocab_size=16, max_seq_len=128), model_tokens=1)
    result = ChainDecoder(target, drafter, gamma=4, log_distributions="full").generate([3, 4, 9, 1, 3, 4], 40)
    lengths = {step.deterministic_drafts: set() for step in result.steps}
    for step in result.steps:
        lengths[step.deterministic_drafts].add(len(step.tokens) - 1)
    assert lengths[False] == {1}
    assert max(lengths[True]) > 1


def test_every_greedy_decoder_with_lookup_first_equals_autoregressive_greedy(tiny_model):
    target = tiny_model(21, vocab_size=16, max_seq_len=160)
    draft_model = tiny_model(22, vocab_size=16, max_seq_len=160)
    decoders = {
        "chain-model": ChainDecoder(target, lookup_first(draft_model), gamma=4),
        "chain-early-exit": ChainDecoder(
            target, LookupFirstDrafter(PromptLookupDrafter(min_ngram=2), EarlyExitDrafter(target, 1)), gamma=4
        ),
        "tree-static": TreeDecoder(target, lookup_first(draft_model), tree=[-1, 0, 0, 1, 1, 2, 3]),
        "tree-dynamic": TreeDecoder(target, lookup_first(draft_model), tree=DynamicTree(8, 4, 2)),
    }
    for prompt in ([5], [1, 2, 3, 4], [7, 7, 1, 9, 7, 7]):
        reference = AutoregressiveDecoder(target).generate(prompt, 40).token_ids
        for name, decoder in decoders.items():
            assert decoder.generate(prompt, 40).token_ids == reference, name


@pytest.mark.slow
@pytest.mark.parametrize("tree", [None, [-1, 0, 0, 1, 1, 2]])
def test_lookup_first_reproduces_the_exact_target_law_of_the_next_three_tokens(tiny_model, tree):
    target, draft_model = flat_tiny_model(tiny_model, 3), flat_tiny_model(tiny_model, 4)
    sampling = Sampling(temperature=1.0)
    drafter = lookup_first(draft_model)
    if tree is None:
        decoder = ChainDecoder(target, drafter, gamma=2, sampling=sampling)
    else:
        decoder = TreeDecoder(target, drafter, tree=tree, sampling=sampling)
    law = exact_law(target, sampling)
    p_value = outcome_p_value(sample_outcomes(decoder, seed=12), law)
    assert p_value > P_THRESHOLD, f"G-test p = {p_value:.2e}"
    assert drafter.lookup_steps > 0  # PROMPT ends in a repeated 2-gram: the lookup drafted


def draft_cache_matches_a_fresh_prefill(
    tiny_model, seed: int, temperature: float, max_new_tokens: int = 10
) -> bool:
    target, draft_model = flat_tiny_model(tiny_model, 3), flat_tiny_model(tiny_model, 4)
    drafter = lookup_first(draft_model)
    decoder = ChainDecoder(target, drafter, gamma=3, sampling=Sampling(temperature=temperature))
    prompt = [*PROMPT, 7, 1, 2]
    result = decoder.generate(prompt, max_new_tokens, generator=torch.Generator().manual_seed(seed))
    text = prompt + [token for step in result.steps for token in step.emitted]
    length = drafter.model.length
    assert length <= len(text)
    actual, expected = cache_of(draft_model, length), fresh_prefill_cache(draft_model, text[:length])
    return all(torch.allclose(a, e, atol=1e-5, rtol=1e-4) for a, e in zip(actual, expected, strict=True))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), temperature=st.sampled_from([0.0, 1.0]))
def test_model_drafters_cache_after_lookup_steps_equals_a_fresh_prefill(tiny_model, seed, temperature):
    assert draft_cache_matches_a_fresh_prefill(tiny_model, seed, temperature)


def test_cache_check_catches_a_model_drafter_that_commits_steps_it_did_not_draft(tiny_model, monkeypatch):
    # Negative control: the commit before this drafter existed claimed every committed token as fed. Since the
    # model drafter reads the prompt in the prefill, that is wrong only after two lookup steps in a row: longer
    # generations make them likely.
    def old_commit(self, state, tree, accepted_path):
        kept = 0
        for node in accepted_path:
            if node not in self._fed:
                break
            kept += 1
        self.length = state.committed + kept
        self._fed = set()

    monkeypatch.setattr(separate_model_module.ModelDrafter, "commit", old_commit)
    caught = [not draft_cache_matches_a_fresh_prefill(tiny_model, seed, 1.0, 20) for seed in range(6)]
    assert any(caught)


def test_parse_builds_lookup_first_and_refuses_bad_combinations(tiny_model):
    target = tiny_model(21, vocab_size=16, max_seq_len=64)
    drafter = parse_drafter("ngram:4+early-exit:1", target)
    assert isinstance(drafter, LookupFirstDrafter)
    assert drafter.name == "ngram:4+early-exit:1"
    assert (drafter.lookup.max_ngram, drafter.lookup.min_ngram) == (4, LOOKUP_MIN_NGRAM)
    assert drafter.model_tokens == LOOKUP_MODEL_TOKENS
    assert isinstance(drafter.model, EarlyExitDrafter)
    assert not drafter.needs_target_hidden
    assert is_lookup_first("ngram+feature") and not is_lookup_first("model:/weights/a+b.gguf")
    assert drafter_parts("ngram:4+feature") == ["ngram:4", "feature"]
    assert drafter_parts("model:/weights/a+b.gguf") == ["model:/weights/a+b.gguf"]
    # generate() checks the drafter before any model loads: a combination passes on to the next check, a bad
    # part does not.
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate("def f():", decoder="chain", drafter="ngram+early-exit:3", max_new_tokens=-1)
    with pytest.raises(ValueError, match="unknown drafter 'ngram\\+nonsense'"):
        generate("def f():", decoder="chain", drafter="ngram+nonsense", max_new_tokens=-1)
    for spec, message in [
        ("early-exit:1+ngram", "integer exit layer"),  # a '+' outside 'ngram...+' is not a combination
        ("ngram+", "ngram\\[:N\\]\\+DRAFTER"),
        ("ngram+ngram", "model drafter"),
        ("ngram+nonsense", "unknown drafter"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_drafter(spec, target)


def test_lookup_first_forwards_the_feature_heads_need_for_target_hidden_states():
    class Head:
        name, deterministic, needs_target_hidden = "feature", False, True

    assert LookupFirstDrafter(PromptLookupDrafter(), Head()).needs_target_hidden
    with pytest.raises(ValueError, match="PromptLookupDrafter"):
        LookupFirstDrafter(Head(), Head())
