"""Falcon's semi-autoregressive head in every decoder: greedy equality, exact law at T > 0, two levels per
head pass equal to the training layout, and its own KV cache after random accept/reject patterns."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.decoders import (
    AutoregressiveDecoder,
    ChainDecoder,
    DynamicTree,
    MultiDraftDecoder,
    Sampling,
    TreeDecoder,
    default_tree,
    falcon_tree,
)
from executor.decoders import tree as tree_module
from executor.drafters import EarlyExitDrafter, FalconDrafter, FalconHead, parse_drafter
from executor.generate import build_decoder
from executor.training.falcon import _forward, coupled_inputs
from tests.executor.test_decoders import (
    P_THRESHOLD,
    PROMPT,
    _target_instead_of_residual,
    assert_same_cache,
    exact_law,
    flat_tiny_model,
    outcome_p_value,
    sample_outcomes,
)
from tests.executor.test_drafters_feature import fresh_head_cache, head_cache, random_head


def falcon_head(target, seed: int, vocab=None) -> FalconHead:
    head = FalconHead(target.config, vocab)
    head.load_state_dict(random_head(target, seed, vocab).state_dict())
    return head


def drafter_for(target, seed: int = 1, vocab=None) -> FalconDrafter:
    return FalconDrafter(target, falcon_head(target, seed, vocab))


def test_falcon_tree_is_built_pass_by_pass():
    assert falcon_tree(1, 1) == [-1, 0, 1]
    # Pass 1: root -> 1, 2; 1 -> 3, 4; 2 -> 5. Pass 2 from node 3: 3 -> 6, 7; 6 -> 8, 9; 7 -> 10.
    assert falcon_tree(2, 2) == [-1, 0, 0, 1, 1, 2, 3, 3, 6, 6, 7]
    assert len(falcon_tree(3, 3)) == 1 + 3 * 7
    with pytest.raises(ValueError, match="passes"):
        falcon_tree(0, 2)


def greedy_decoders(target, vocab=None):
    return {
        "chain": ChainDecoder(target, drafter_for(target, vocab=vocab), gamma=5),
        "multidraft": MultiDraftDecoder(target, drafter_for(target, vocab=vocab), n=3),
        "tree-falcon": TreeDecoder(target, drafter_for(target, vocab=vocab), tree=falcon_tree(3, 2)),
        "tree-dynamic": TreeDecoder(target, drafter_for(target, vocab=vocab), tree=DynamicTree(10, 4, 3)),
    }


@pytest.mark.parametrize("vocab", [None, [0, 1, 2, 3, 5, 8, 13]])
def test_greedy_decoding_with_the_falcon_head_equals_autoregressive_greedy(tiny_model, vocab):
    target = tiny_model(21, vocab_size=16, max_seq_len=128)
    for prompt in ([5], [1, 2], [1, 2, 3, 4], [7, 7, 1, 9, 7, 7]):
        reference = AutoregressiveDecoder(target).generate(prompt, 40).token_ids
        for name, decoder in greedy_decoders(target, vocab).items():
            result = decoder.generate(prompt, 40)
            assert result.token_ids == reference, name
            if name != "multidraft":  # the head drafted deeper than one pass gives
                assert any(max(step_depths(step)) > 2 for step in result.steps), name


def step_depths(step) -> list[int]:
    depths = [0]
    for parent in step.parents[1:]:
        depths.append(depths[parent] + 1)
    return depths


def test_two_tree_levels_cost_one_head_pass(tiny_model):
    target = tiny_model(21, vocab_size=16, max_seq_len=128)
    drafter = drafter_for(target)
    calls = []
    original = drafter.head.forward
    drafter.head.forward = lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)
    decoder = TreeDecoder(target, drafter, tree=falcon_tree(3, 2))
    result = decoder.generate([1, 2, 3, 4], 1)
    # One pass reads the prompt in the prefill; the step's six levels take three.
    assert max(step_depths(result.steps[0])) == 6 and len(calls) == 1 + 3


def test_drafted_levels_equal_the_training_layout_with_coupled_inputs(tiny_model):
    """Depths 1-2 (first pass) and 3-4 (second pass, own features) equal the head run on the training layout."""
    target = tiny_model(4, vocab_size=16, max_seq_len=64)
    drafter = drafter_for(target, 3)
    seen = {}
    original = drafter.draft_logits

    def record(state, tree, nodes):
        logits = original(state, tree, nodes)
        seen[tree.depths[nodes[0]]] = logits[0].clone()
        return logits

    drafter.draft_logits = record
    prompt = [1, 2, 3, 4, 5, 6, 7]
    result = ChainDecoder(target, drafter, gamma=4).generate(prompt, 1)
    chain = result.steps[0].tokens  # root, then depths 1..4
    text = prompt + chain[1:]
    length = len(prompt) - 1  # committed entries e_1 .. e_L, L = 6
    with torch.no_grad():
        target.setup_cache(len(text))
        _, hidden = target(torch.tensor([text[: length + 2]]), torch.arange(length + 2), return_hidden=True)
        head = falcon_head(target, 3)
        tokens = torch.tensor([text[1 : length + 3]])  # x_1 .. x_{L+2}
        inputs = hidden[:, : length + 2].clone()  # h_0 .. h_{L+1}; the last two are replaced below
        offset = (length - 2) % 2  # the block (e_{L-1}, e_L) starts at column L - 2
        first = _forward(head, target, inputs, tokens, offset)
        blocks = torch.zeros(1, (length + 2) // 2 + 1, dtype=torch.bool)
        blocks[0, (length - offset) // 2] = True  # the block at columns L, L + 1
        second = _forward(head, target, coupled_inputs(inputs, first, blocks, offset), tokens, offset)
        expected = {
            0: first[0, length - 2],
            1: first[0, length - 1],
            2: second[0, length],
            3: second[0, length + 1],
        }
    for depth, feature in expected.items():
        direct = head.logits(target, feature[None])[0]
        torch.testing.assert_close(seen[depth], direct, rtol=1e-5, atol=1e-5)


SAMPLING = Sampling(temperature=1.0)


def law_decoders(target):
    return {
        "chain": ChainDecoder(target, drafter_for(target, 2), gamma=4, sampling=SAMPLING),
        "tree-falcon": TreeDecoder(target, drafter_for(target, 2), tree=falcon_tree(2, 2), sampling=SAMPLING),
        "chain-reduced-vocab": ChainDecoder(
            target, drafter_for(target, 2, vocab=[0, 2, 3, 5, 7]), gamma=3, sampling=SAMPLING
        ),
    }


@pytest.fixture(scope="module")
def target(tiny_model):
    return flat_tiny_model(tiny_model, 3)


@pytest.mark.slow  # like the other decoders' law tests: SAMPLES generations each
@pytest.mark.parametrize("kind", ["chain", "tree-falcon", "chain-reduced-vocab"])
def test_falcon_decoders_reproduce_the_exact_target_law_of_the_next_three_tokens(target, kind):
    decoder = law_decoders(target)[kind]
    law = exact_law(target, SAMPLING)
    assert np.max(law) < 0.5
    samples = sample_outcomes(decoder, seed=11)
    p_value = outcome_p_value(samples, law)
    assert p_value > P_THRESHOLD, f"{kind}: G-test p = {p_value:.2e}"


@pytest.mark.slow
def test_law_test_rejects_a_broken_tree_verifier_with_the_falcon_head(target, monkeypatch):
    """Negative control: a node verifier that draws the correction from p instead of the residual is caught."""
    decoder = law_decoders(target)["tree-falcon"]
    law = exact_law(target, SAMPLING)
    monkeypatch.setattr(tree_module, "verify_multidraft_unchecked", _target_instead_of_residual)
    p_value = outcome_p_value(sample_outcomes(decoder, seed=11, count=800), law)
    assert p_value < P_THRESHOLD, f"the broken verifier went unnoticed: p = {p_value:.2e}"


@settings(deadline=None, max_examples=40)
@given(
    seed=st.integers(0, 2**16),
    shape=st.sampled_from(
        [falcon_tree(2, 2), falcon_tree(1, 3), [-1, 0, 1, 2, 3, 4], [-1, 0, 0, 1, 2, 3, 3]]
    ),
    temperature=st.sampled_from([0.0, 1.0]),
)
def test_head_cache_after_random_accept_reject_patterns_equals_a_fresh_prefill(
    tiny_model, seed, shape, temperature
):
    target = flat_tiny_model(tiny_model, 3)
    drafter = drafter_for(target, 5)
    decoder = TreeDecoder(target, drafter, tree=shape, sampling=Sampling(temperature=temperature))
    result = decoder.generate(PROMPT, 10, generator=torch.Generator().manual_seed(seed))
    text = PROMPT + [token for step in result.steps for token in step.emitted]
    assert drafter.length >= len(PROMPT) - 1
    expected = fresh_head_cache(target, random_head(target, 5), text, drafter.length)
    assert_same_cache(head_cache(drafter, drafter.length), expected)


def test_head_cache_check_catches_a_drafter_that_keeps_its_drafted_blocks(tiny_model):
    """Negative control: trusting the drafted K/V of an accepted path differs from a fresh prefill."""
    target = flat_tiny_model(tiny_model, 3)
    drafter = drafter_for(target, 5)
    original_commit = drafter.commit

    def keep_drafted_entries(state, tree, accepted_path):
        original_commit(state, tree, accepted_path)
        drafter.length = state.committed + len(accepted_path) - 1

    drafter.commit = keep_drafted_entries
    result = ChainDecoder(target, drafter, gamma=4).generate(PROMPT, 12)
    text = PROMPT + [token for step in result.steps for token in step.emitted]
    assert any(len(step.accepted_path) > 2 for step in result.steps)
    expected = fresh_head_cache(target, random_head(target, 5), text, drafter.length)
    with pytest.raises(AssertionError):
        assert_same_cache(head_cache(drafter, drafter.length), expected)


def test_falcon_names_and_the_tree_decoder_default(tiny_model, tmp_path, monkeypatch):
    from executor.drafters import parse as parse_module
    from executor.training import checkpoint, trainer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = tiny_model(0, vocab_size=16)
    fingerprint = checkpoint.model_fingerprint(target)
    messages, trained = [], []

    def fake_train(model, tokenizer, *, kind):
        trained.append(kind)
        directory = checkpoint.default_checkpoint_dir(kind, fingerprint, {"recipe": 1})
        checkpoint.save_checkpoint(
            directory, falcon_head(target, 3).state_dict(), {"kind": kind, "target": fingerprint}
        )
        return directory

    monkeypatch.setattr(trainer, "train_drafter", fake_train)
    assert parse_module.kind_checkpoint(target, "falcon", train_if_missing=False) is None
    parse_module.kind_checkpoint(target, "falcon", tokenizer=object(), log=messages.append)
    assert trained == ["falcon"] and "no trained falcon drafter" in messages[0]
    drafter = parse_drafter("falcon", target)  # found in the cache now
    assert isinstance(drafter, FalconDrafter) and trained == ["falcon"]
    decoder = build_decoder("tree", target, drafter="falcon", gamma=4, n=2)
    assert decoder.shape == falcon_tree(2, 2)
    with pytest.raises(ValueError, match="is not a directory"):
        parse_drafter("falcon:/nonexistent/checkpoint", target)


def test_default_tree_is_falcons_pass_by_pass_tree_for_a_falcon_drafter_only(tiny_model):
    target = tiny_model(5, vocab_size=16, max_seq_len=64)
    assert default_tree(drafter_for(target), 3, 2) == falcon_tree(passes=2, width=2)
    assert default_tree(drafter_for(target), 4, 3) == falcon_tree(passes=2, width=3)
    assert default_tree(EarlyExitDrafter(target, 1), 3, 2) == DynamicTree(budget=7, max_depth=3, branching=2)
