"""Exit heads (exit:K) and Kangaroo's adapter (kangaroo:K) in every decoder: greedy equality, the exact law at
T > 0, the adapter's own KV cache after random accept/reject patterns, checkpoints and names."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.decoders import (
    AutoregressiveDecoder,
    ChainDecoder,
    ConfidenceStop,
    DynamicTree,
    MultiDraftDecoder,
    Sampling,
    TreeDecoder,
)
from executor.decoders import chain as chain_module
from executor.drafters import parse_drafter
from executor.drafters.exit_head import ExitDrafter, ExitHead, KangarooDrafter
from executor.training import checkpoint
from executor.training.layer_features import shallow_forward
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


def random_head(target, seed: int, *, attention: bool, layer: int = 1, vocab=None) -> ExitHead:
    """A head with every weight random (the attention's output projection too, so its cache matters)."""
    head = ExitHead(target.config, layer, vocab, attention=attention)
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


def drafter_for(target, kind: str, seed: int = 1, vocab=None):
    if kind == "exit":
        return ExitDrafter(target, random_head(target, seed, attention=False, vocab=vocab))
    return KangarooDrafter(target, random_head(target, seed, attention=True, vocab=vocab))


def greedy_decoders(target, kind, vocab=None):
    return {
        "chain": ChainDecoder(target, drafter_for(target, kind, vocab=vocab), gamma=4),
        "chain-confidence-stop": ChainDecoder(
            target, drafter_for(target, kind, vocab=vocab), gamma=6, stop_rule=ConfidenceStop(0.3)
        ),
        "multidraft": MultiDraftDecoder(target, drafter_for(target, kind, vocab=vocab), n=3),
        "tree-static": TreeDecoder(
            target, drafter_for(target, kind, vocab=vocab), tree=[-1, 0, 0, 1, 1, 2, 3]
        ),
        "tree-dynamic": TreeDecoder(
            target, drafter_for(target, kind, vocab=vocab), tree=DynamicTree(10, 4, 3)
        ),
    }


@pytest.mark.parametrize("kind", ["exit", "kangaroo"])
@pytest.mark.parametrize("vocab", [None, [0, 1, 2, 3, 5, 8, 13]])
def test_greedy_decoding_with_trained_head_kinds_equals_autoregressive_greedy(tiny_model, kind, vocab):
    target = tiny_model(21, vocab_size=16, max_seq_len=128)
    for prompt in ([5], [7, 7, 1, 9, 7, 7]):
        reference = AutoregressiveDecoder(target).generate(prompt, 30).token_ids
        for name, decoder in greedy_decoders(target, kind, vocab).items():
            result = decoder.generate(prompt, 30)
            assert result.token_ids == reference, f"{kind} {name}"
            assert any(len(step.tokens) > 1 for step in result.steps), f"{kind} {name} never drafted"


SAMPLING = Sampling(temperature=1.0)


def law_decoders(target):
    return {
        "exit-chain": ChainDecoder(target, drafter_for(target, "exit", 2), gamma=3, sampling=SAMPLING),
        "exit-tree-static": TreeDecoder(
            target, drafter_for(target, "exit", 2), tree=[-1, 0, 0, 1, 1, 2], sampling=SAMPLING
        ),
        "kangaroo-chain": ChainDecoder(
            target, drafter_for(target, "kangaroo", 2), gamma=3, sampling=SAMPLING
        ),
        "kangaroo-multidraft-rrs_wor": MultiDraftDecoder(
            target, drafter_for(target, "kangaroo", 2), n=3, verifier="rrs_wor", sampling=SAMPLING
        ),
        "kangaroo-tree-static": TreeDecoder(
            target, drafter_for(target, "kangaroo", 2), tree=[-1, 0, 0, 1, 1, 2], sampling=SAMPLING
        ),
    }


@pytest.fixture(scope="module")
def target(tiny_model):
    return flat_tiny_model(tiny_model, 3)


@pytest.mark.slow  # like the other decoders' law tests: SAMPLES generations each
@pytest.mark.parametrize(
    "kind",
    [
        "exit-chain",
        "exit-tree-static",
        "kangaroo-chain",
        "kangaroo-multidraft-rrs_wor",
        "kangaroo-tree-static",
    ],
)
def test_exit_and_kangaroo_decoders_reproduce_the_exact_target_law_of_the_next_three_tokens(target, kind):
    decoder = law_decoders(target)[kind]
    law = exact_law(target, SAMPLING)
    assert np.max(law) < 0.5
    p_value = outcome_p_value(sample_outcomes(decoder, seed=11), law)
    assert p_value > P_THRESHOLD, f"{kind}: G-test p = {p_value:.2e}"


@pytest.mark.slow
def test_law_test_rejects_a_broken_verifier_with_the_kangaroo_adapter(target, monkeypatch):
    """Negative control: the same threshold, with 1000 samples, catches a verifier that resamples from p
    (p = 4e-10 on 2026-11-28; 4e-3 at 400 samples: this control needs more than the law tests)."""
    decoder = law_decoders(target)["kangaroo-chain"]
    law = exact_law(target, SAMPLING)
    monkeypatch.setattr(chain_module, "verify_chain", _residual_from_target)
    p_value = outcome_p_value(sample_outcomes(decoder, seed=11, count=1000), law)
    assert p_value < P_THRESHOLD, f"the broken verifier went unnoticed: p = {p_value:.2e}"


# --------------------------------------------------------------------------------------------------------
# The Kangaroo adapter's own KV cache


def adapter_cache(drafter, slots):
    attention = drafter.head.attention
    return [torch.cat([attention.kv_cache.k[:, :, :slots], attention.kv_cache.v[:, :, :slots]])]


def fresh_adapter_cache(target, head, text: list[int], length: int):
    """The adapter's cache after a fresh causal prefill of ``text[:length]``'s layer-K states."""
    with torch.no_grad():
        hidden = shallow_forward(target, torch.tensor([text[:length]]), [head.layer])[head.layer]
        head.setup_cache(length)
        slots = torch.arange(length)
        head(target, hidden, slots, slots, slots <= slots[:, None])
    return [torch.cat([head.attention.kv_cache.k[:, :, :length], head.attention.kv_cache.v[:, :, :length]])]


TREES = [[-1, 0, 1, 2], [-1, 0, 0, 1, 1, 2], [-1, 0, 0, 0], [-1, 0, 1, 1, 2, 0]]


@settings(deadline=None, max_examples=20)
@given(seed=st.integers(0, 2**16), shape=st.sampled_from(TREES), temperature=st.sampled_from([0.0, 1.0]))
def test_adapter_cache_after_random_accept_reject_patterns_equals_a_fresh_prefill(
    tiny_model, seed, shape, temperature
):
    target = flat_tiny_model(tiny_model, 3)
    drafter = drafter_for(target, "kangaroo", 5)
    decoder = TreeDecoder(target, drafter, tree=shape, sampling=Sampling(temperature=temperature))
    result = decoder.generate(PROMPT, 8, generator=torch.Generator().manual_seed(seed))
    text = PROMPT + [token for step in result.steps for token in step.emitted]
    assert drafter.length >= len(PROMPT) - 1
    expected = fresh_adapter_cache(target, random_head(target, 5, attention=True), text, drafter.length)
    assert_same_cache(adapter_cache(drafter, drafter.length), expected)
    drafter.close()


def test_adapter_cache_check_catches_a_drafter_that_does_not_compact_the_accepted_path(tiny_model):
    """Negative control: without moving the accepted path's layer-K states into the committed slots, the
    next step feeds the adapter the states of rejected sibling nodes."""
    target = flat_tiny_model(tiny_model, 3)
    drafter = drafter_for(target, "kangaroo", 5)
    drafter.commit = lambda state, tree, path: setattr(
        drafter, "length", min(drafter.length, state.committed)
    )
    decoder = TreeDecoder(target, drafter, tree=[-1, 0, 0, 0], sampling=Sampling(temperature=0.0))
    result = decoder.generate(PROMPT, 12)
    assert any(step.accepted_path[1:2] not in ([], [1]) for step in result.steps), "no sibling was accepted"
    text = PROMPT + [token for step in result.steps for token in step.emitted]
    expected = fresh_adapter_cache(target, random_head(target, 5, attention=True), text, drafter.length)
    with pytest.raises(AssertionError):
        assert_same_cache(adapter_cache(drafter, drafter.length), expected)


def test_the_untrained_exit_head_drafts_exactly_the_early_exit(tiny_model):
    """W = I, b = 0, gain 1: the exit head's logits equal the target's early exit through its final norm."""
    from executor.decoders import DraftTree
    from executor.decoders.base import DecodingState
    from executor.drafters import EarlyExitDrafter

    target = tiny_model(4, vocab_size=16, max_seq_len=32)
    state = DecodingState(tokens=[3, 1, 4, 1, 5])
    target.setup_cache(32)
    with torch.no_grad():
        target(torch.tensor([state.tokens[:-1]]), torch.arange(4))
        tree = DraftTree(state.tokens[-1])
        trained = ExitDrafter(target, ExitHead(target.config, 1)).draft_logits(state, tree, [0])
        plain = EarlyExitDrafter(target, 1).draft_logits(state, tree, [0])
    torch.testing.assert_close(trained, plain, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------------------------------------
# Checkpoints, names, bad input


def save_head(directory, head, target, kind):
    fingerprint = checkpoint.model_fingerprint(target)
    return checkpoint.save_checkpoint(directory, head.state_dict(), {"kind": kind, "target": fingerprint})


@pytest.mark.parametrize("attention", [False, True])
def test_checkpoint_round_trip_is_bit_exact_and_wrong_kind_or_model_is_refused(
    tiny_model, tmp_path, attention
):
    target = tiny_model(0, vocab_size=VOCAB)
    family = "kangaroo" if attention else "exit"
    head = random_head(target, 3, attention=attention, vocab=[0, 2, 5])
    path = save_head(tmp_path / "ok", head, target, f"{family}:1")
    cls = KangarooDrafter if attention else ExitDrafter
    loaded = cls.from_checkpoint(target, path, 1)
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.head.state_dict()[name], tensor), name
    other = "exit" if attention else "kangaroo"
    with pytest.raises(ValueError, match=f"is a '{family}:1' drafter, not '{other}:1'"):
        (ExitDrafter if attention else KangarooDrafter).from_checkpoint(target, path, 1)
    with pytest.raises(ValueError, match="trained for another target model"):
        cls.from_checkpoint(tiny_model(1, vocab_size=VOCAB), path, 1)
    weights = path / checkpoint.WEIGHTS_NAME
    weights.write_bytes(weights.read_bytes()[:-9])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        cls.from_checkpoint(target, path, 1)


def test_exit_and_kangaroo_names_use_the_cached_checkpoint_and_a_missing_one_is_trained_first(
    tiny_model, tmp_path, monkeypatch
):
    from executor.drafters import parse as parse_module
    from executor.training import trainer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = tiny_model(0, vocab_size=VOCAB)
    fingerprint = checkpoint.model_fingerprint(target)
    trained, messages = [], []

    def fake_train(model, tokenizer, *, kind):
        trained.append(kind)
        head = random_head(target, 3, attention=kind.startswith("kangaroo"))
        return save_head(
            checkpoint.default_checkpoint_dir(kind, fingerprint, {"recipe": 1}), head, target, kind
        )

    monkeypatch.setattr(trainer, "train_drafter", fake_train)
    assert parse_module.kind_checkpoint(target, "exit:1", train_if_missing=False) is None
    path = parse_module.kind_checkpoint(target, "kangaroo:1", tokenizer=object(), log=messages.append)
    assert trained == ["kangaroo:1"] and "no trained kangaroo:1 drafter" in messages[0]
    assert messages[1].startswith(f"kangaroo:1 drafter trained and cached at {path}")  # a card without scores
    drafter = parse_drafter("kangaroo:1", target)  # found in the cache now, not trained again
    assert trained == ["kangaroo:1"] and isinstance(drafter, KangarooDrafter) and drafter.name == "kangaroo:1"
    assert parse_drafter(f"kangaroo:1:{path}", target).name == f"kangaroo:1:{path}"
    monkeypatch.setattr(parse_module, "kind_checkpoint", lambda *a, **k: pytest.fail("must not train"))
    with pytest.raises(ValueError, match="is a 'kangaroo:1' drafter, not 'exit:1'"):
        parse_drafter(f"exit:1:{path}", target)


def test_bad_exit_head_input_is_rejected(tiny_model):
    target = tiny_model(0, vocab_size=VOCAB)
    other = tiny_model(0, vocab_size=16)
    with pytest.raises(ValueError, match="layer must be an integer in"):
        ExitHead(target.config, 2)
    with pytest.raises(ValueError, match="does not fit the target"):
        ExitDrafter(target, ExitHead(other.config, 1))
    with pytest.raises(ValueError, match="needs a head with attention=True"):
        KangarooDrafter(target, ExitHead(target.config, 1))
    with pytest.raises(ValueError, match="must be built on the target"):
        ChainDecoder(other, ExitDrafter(target, ExitHead(target.config, 1)))
    for spec in ("exit", "exit:x", "exit:0", "kangaroo:2"):
        with pytest.raises(ValueError, match="needs a layer K"):
            parse_drafter(spec, target)
