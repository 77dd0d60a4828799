"""The feature-level draft head in every decoder: greedy equality, exact law at T > 0, its own KV cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from executor import products
from executor.decoders import (
    AutoregressiveDecoder,
    ChainDecoder,
    DynamicTree,
    MultiDraftDecoder,
    Sampling,
    TreeDecoder,
)
from executor.decoders import chain as chain_module
from executor.drafters import FeatureDrafter, FeatureHead, parse_drafter
from executor.model import Linear
from tests.executor.test_decoders import (
    P_THRESHOLD,
    PROMPT,
    VOCAB,
    _residual_from_target,
    assert_same_cache,
    exact_law,
    flat_tiny_model,
    outcome_p_value,
    sample_outcomes,
)


def random_head(target, seed: int, vocab=None) -> FeatureHead:
    """A head with every weight random (the output projections too, so its attention and cache matter)."""
    head = FeatureHead(target.config, vocab)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(1.0 + 0.2 * torch.randn(parameter.shape, generator=generator))
            elif parameter.ndim == 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / parameter.shape[1] ** 0.5)
            else:
                parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))
    return head


def drafter_for(target, seed: int = 1, vocab=None) -> FeatureDrafter:
    return FeatureDrafter(target, random_head(target, seed, vocab))


def greedy_decoders(target, vocab=None):
    return {
        "chain": ChainDecoder(target, drafter_for(target, vocab=vocab), gamma=4),
        "multidraft": MultiDraftDecoder(target, drafter_for(target, vocab=vocab), n=3),
        "tree-static": TreeDecoder(target, drafter_for(target, vocab=vocab), tree=[-1, 0, 0, 1, 1, 2, 3]),
        "tree-dynamic": TreeDecoder(target, drafter_for(target, vocab=vocab), tree=DynamicTree(10, 4, 3)),
    }


@pytest.mark.parametrize("vocab", [None, [0, 1, 2, 3, 5, 8, 13]])
def test_greedy_decoding_with_the_feature_head_equals_autoregressive_greedy(tiny_model, vocab):
    target = tiny_model(21, vocab_size=16, max_seq_len=128)
    for prompt in ([5], [1, 2, 3, 4], [7, 7, 1, 9, 7, 7]):
        reference = AutoregressiveDecoder(target).generate(prompt, 40).token_ids
        for name, decoder in greedy_decoders(target, vocab).items():
            result = decoder.generate(prompt, 40)
            assert result.token_ids == reference, name
            # The head really drafted (it is not silently stopping): some steps hold drafted nodes.
            assert any(len(step.tokens) > 1 for step in result.steps), name


SAMPLING = Sampling(temperature=1.0)


def law_decoders(target):
    return {
        "chain": ChainDecoder(target, drafter_for(target, 2), gamma=3, sampling=SAMPLING),
        "multidraft-rrs_wor": MultiDraftDecoder(
            target, drafter_for(target, 2), n=3, verifier="rrs_wor", sampling=SAMPLING
        ),
        "tree-static": TreeDecoder(
            target, drafter_for(target, 2), tree=[-1, 0, 0, 1, 1, 2], sampling=SAMPLING
        ),
        "chain-reduced-vocab": ChainDecoder(
            target, drafter_for(target, 2, vocab=[0, 2, 3, 5, 7]), gamma=2, sampling=SAMPLING
        ),
    }


@pytest.fixture(scope="module")
def target(tiny_model):
    return flat_tiny_model(tiny_model, 3)


@pytest.mark.slow  # like the other decoders' law tests: SAMPLES generations each
@pytest.mark.parametrize("kind", ["chain", "multidraft-rrs_wor", "tree-static", "chain-reduced-vocab"])
def test_feature_head_decoders_reproduce_the_exact_target_law_of_the_next_three_tokens(target, kind):
    decoder = law_decoders(target)[kind]
    law = exact_law(target, SAMPLING)
    assert np.max(law) < 0.5
    samples = sample_outcomes(decoder, seed=11)
    # The head drafted and was sometimes accepted and sometimes rejected: the verifier had work to do.
    p_value = outcome_p_value(samples, law)
    assert p_value > P_THRESHOLD, f"{kind}: G-test p = {p_value:.2e}"


@pytest.mark.slow
def test_law_test_rejects_a_broken_verifier_with_the_feature_head(target, monkeypatch):
    """Negative control: the same threshold, with 1200 samples, catches a verifier that resamples from p
    (p = 2e-7 on 2026-11-28; 5e-2 at 400 and 3e-3 at 800 samples: this control needs more than the law tests)."""
    decoder = law_decoders(target)["chain"]
    law = exact_law(target, SAMPLING)
    monkeypatch.setattr(chain_module, "verify_chain", _residual_from_target)
    p_value = outcome_p_value(sample_outcomes(decoder, seed=11, count=1200), law)
    assert p_value < P_THRESHOLD, f"the broken verifier went unnoticed: p = {p_value:.2e}"


def head_cache(drafter, slots):
    attention = drafter.head.layer.attention
    return [torch.cat([attention.kv_cache.k[:, :, :slots], attention.kv_cache.v[:, :, :slots]])]


def fresh_head_cache(target, head, text: list[int], length: int):
    """The head's cache after feeding entries (h_{s-1}, x_s), s = 1..length, from a fresh target prefill."""
    target.setup_cache(len(text))
    with torch.no_grad():
        _, hidden = target(torch.tensor([text[:length]]), torch.arange(length), return_hidden=True)
        head.setup_cache(length)
        slots = torch.arange(length)
        head(target, hidden, torch.tensor([text[1 : length + 1]]), slots, slots + 1, slots <= slots[:, None])
    attention = head.layer.attention
    return [torch.cat([attention.kv_cache.k[:, :, :length], attention.kv_cache.v[:, :, :length]])]


@given(
    seed=st.integers(0, 2**16),
    shape=st.sampled_from([[-1, 0, 1, 2], [-1, 0, 0, 1, 1, 2], [-1, 0, 0, 0], [-1, 0, 1, 1, 2, 0]]),
    temperature=st.sampled_from([0.0, 1.0]),
)
def test_head_cache_after_random_accept_reject_patterns_equals_a_fresh_prefill(
    tiny_model, seed, shape, temperature
):
    target = flat_tiny_model(tiny_model, 3)
    drafter = drafter_for(target, 5)
    decoder = TreeDecoder(target, drafter, tree=shape, sampling=Sampling(temperature=temperature))
    result = decoder.generate(PROMPT, 8, generator=torch.Generator().manual_seed(seed))
    text = PROMPT + [token for step in result.steps for token in step.emitted]
    assert drafter.length >= len(PROMPT) - 1
    actual = head_cache(drafter, drafter.length)
    # A second head object with the same weights, prefilled from scratch on the committed text.
    expected = fresh_head_cache(target, random_head(target, 5), text, drafter.length)
    assert_same_cache(actual, expected)


def test_head_cache_check_catches_a_head_fed_its_own_features_after_acceptance(tiny_model):
    """Negative control: keeping the drafted entries (built from the head's own features) differs."""
    target = flat_tiny_model(tiny_model, 3)
    drafter = drafter_for(target, 5)
    original_commit = drafter.commit

    def keep_drafted_entries(state, tree, accepted_path):
        original_commit(state, tree, accepted_path)
        drafter.length = state.committed + len(accepted_path) - 1  # wrongly trusts the drafted K/V

    drafter.commit = keep_drafted_entries
    decoder = ChainDecoder(target, drafter, gamma=3)
    result = decoder.generate(PROMPT, 12)
    text = PROMPT + [token for step in result.steps for token in step.emitted]
    assert any(len(step.accepted_path) > 1 for step in result.steps)
    expected = fresh_head_cache(target, random_head(target, 5), text, drafter.length)
    with pytest.raises(AssertionError):
        assert_same_cache(head_cache(drafter, drafter.length), expected)


def test_reduced_vocabulary_gives_zero_draft_probability_outside_it(target):
    drafter = drafter_for(target, 2, vocab=[1, 4, 6])
    decoder = ChainDecoder(target, drafter, gamma=3, sampling=SAMPLING, log_distributions="full")
    result = decoder.generate(PROMPT, 10, generator=torch.Generator().manual_seed(0))
    for step in result.steps:
        for node, token in enumerate(step.tokens[1:], start=1):
            assert token in (1, 4, 6), f"drafted token {token} at node {node} is outside the draft vocabulary"


def test_bad_feature_head_input_is_rejected(tiny_model):
    target = tiny_model(0, vocab_size=VOCAB)
    other = tiny_model(0, vocab_size=16)
    with pytest.raises(ValueError, match="does not fit the target"):
        FeatureDrafter(target, FeatureHead(other.config))
    with pytest.raises(ValueError, match="vocab must be a non-empty"):
        FeatureHead(target.config, [0, VOCAB])
    with pytest.raises(ValueError, match="must be built on the target"):
        ChainDecoder(other, FeatureDrafter(target, FeatureHead(target.config)))
    with pytest.raises(ValueError, match="is not a directory"):
        parse_drafter("feature:/nonexistent/checkpoint", target)


def test_feature_names_the_cached_checkpoint_and_a_missing_one_is_trained_first(
    tiny_model, tmp_path, monkeypatch
):
    from executor.drafters import parse as parse_module
    from executor.training import checkpoint, trainer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = tiny_model(0, vocab_size=VOCAB)
    head = random_head(target, 3)
    fingerprint = checkpoint.model_fingerprint(target)
    messages, trained = [], []

    def fake_train(model, tokenizer, *, kind):
        trained.append(kind)
        directory = checkpoint.default_checkpoint_dir(kind, fingerprint, {"recipe": 1})
        card = {"kind": kind, "target": fingerprint, "steps": 12, "held_out": {"sum_min": 0.4567}}
        checkpoint.save_checkpoint(directory, head.state_dict(), card)
        return directory

    monkeypatch.setattr(trainer, "train_drafter", fake_train)
    assert parse_module.feature_checkpoint(target, train_if_missing=False) is None
    path = parse_module.feature_checkpoint(target, tokenizer=object(), log=messages.append)
    assert trained == ["feature"] and "training one now" in messages[0]
    # What was trained is said too: where it is cached, its steps and held-out acceptance.
    assert (
        messages[1]
        == f"feature drafter trained and cached at {path}: 12 steps, held-out sum-min(p, q) 0.457 at T = 1"
    )
    drafter = parse_drafter("feature", target)  # now found in the cache, not trained again
    assert trained == ["feature"] and drafter.name == "feature"
    assert parse_drafter(f"feature:{path}", target).name == f"feature:{path}"
    # Another model has no checkpoint in the cache.
    assert parse_module.feature_checkpoint(tiny_model(1, vocab_size=VOCAB), train_if_missing=False) is None


def test_the_default_is_the_trained_head_when_cached_and_the_fallback_otherwise(
    tiny_model, tmp_path, monkeypatch
):
    from executor.drafters import parse as parse_module
    from executor.training import checkpoint

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(parse_module, "_FALLBACK_SAID", set())
    target = tiny_model(0, vocab_size=VOCAB)
    messages = []
    # No checkpoint, and a tiny vocabulary: no training on first use, the fallback with a message (once).
    for _ in range(2):
        spec = parse_module.trained_default_drafter(
            target, "early-exit:1", train_if_missing=True, log=messages.append
        )
        assert spec == "early-exit:1"
    assert len(messages) == 1 and "drafting with early-exit:1" in messages[0]
    fingerprint = checkpoint.model_fingerprint(target)
    directory = checkpoint.default_checkpoint_dir("feature", fingerprint, {"recipe": 1})
    checkpoint.save_checkpoint(
        directory, random_head(target, 3).state_dict(), {"kind": "feature", "target": fingerprint}
    )
    assert parse_module.trained_default_drafter(target, "early-exit:1") == "feature"


@pytest.mark.skipif(not products.packing_available(), reason="this torch build has no oneDNN")
def test_building_the_drafter_packs_its_head_before_the_first_step(tiny_model, monkeypatch):
    monkeypatch.setattr(products, "MIN_PACKED_ELEMENTS", 16)  # the tiny model's weights count as large
    target = tiny_model(21, vocab_size=16, max_seq_len=64)
    drafter = drafter_for(target, vocab=[0, 1, 2, 3, 5, 8, 13])
    table = products._PACKED_NATIVE if products.native_available(torch.float32) else products._PACKED
    weights = [module.weight for module in drafter.head.modules() if isinstance(module, Linear)]
    assert weights and all(weight in table for weight in weights)
    assert drafter.head._weight_cache in table  # the reduced vocabulary's LM head rows
