"""executor.methods.ppd: prompt tokens that make the target guess its own future tokens.

Oracles: a prompt token whose embedding is a real token's embedding must give exactly the logits of a plain
forward over that token (so the positions, the slots and the mask are right); the chain layout's mask is
enumerated by hand; the real rows of a PPD pass equal plain decoding's; training only moves the embeddings,
lowers the held-out distillation loss on a tiny model; greedy output is plain decoding's with trained prompt
tokens; the cache trains once.
"""

from __future__ import annotations

import random

import pytest
import torch

from executor.decoders import AutoregressiveDecoder
from executor.methods import ppd
from executor.methods.ppd import PPD, PromptTokens, _chain_layout, prompt_forward, train_prompt_tokens

VOCAB = 8


def tiny(tiny_model):
    return tiny_model(3, vocab_size=VOCAB, n_layers=4, max_seq_len=96)


def windows(model, count: int = 4, length: int = 40) -> list[list[int]]:
    """Greedy continuations of random 3-token prompts (the tiny model's own text)."""
    rng = random.Random(0)
    decoder = AutoregressiveDecoder(model)
    return [
        decoder.generate([rng.randrange(VOCAB) for _ in range(3)], length).token_ids for _ in range(count)
    ]


def test_a_prompt_token_equal_to_a_token_embedding_gives_that_tokens_logits(tiny_model):
    model = tiny(tiny_model)
    context, z1, z2 = [1, 5, 2, 7], 3, 6
    prompts = PromptTokens(model, 2)
    with torch.no_grad():
        prompts.embeddings.copy_(model.tok_embeddings.weight[[z1, z2]])
        model.setup_cache(16)
        plain = model(torch.tensor([context + [z1, z2]]), torch.arange(6))[0]
        model.setup_cache(16)
        model(torch.tensor([context[:-1]]), torch.arange(3))
        slots, positions, mask = _chain_layout(3, 1, 2)  # root = context[-1], then its two prompt tokens
        logits = prompt_forward(model, prompts, context[-1:], [0, 1], slots, positions, mask)
    torch.testing.assert_close(logits, plain[3:], rtol=1e-5, atol=1e-5)


def test_the_chain_layout_mask_is_prefix_path_and_the_nodes_earlier_prompt_tokens():
    slots, positions, mask = _chain_layout(committed=2, nodes=2, count=2)
    assert slots == list(range(2, 8))
    # rows: node 0, node 1, (node 0: e1, e2), (node 1: e1, e2); RoPE positions follow the chain.
    assert positions == [2, 3, 3, 4, 4, 5]
    expected = torch.tensor(
        [
            [1, 1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 1, 0, 0, 0],
            [1, 1, 1, 0, 1, 1, 0, 0],
            [1, 1, 1, 1, 0, 0, 1, 0],
            [1, 1, 1, 1, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)


def test_training_moves_only_the_embeddings_and_lowers_the_held_out_loss(tiny_model):
    model = tiny(tiny_model)
    data = windows(model, count=16)
    before = {name: p.clone() for name, p in model.state_dict().items()}
    prompts, card = train_prompt_tokens(model, data[2:], 2, held_out=data[:2], seconds=120, max_steps=100)
    assert card["steps"] == 100
    assert card["held_out"]["kl"] < card["held_out_initial"]["kl"] - 0.02, card
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert not torch.equal(prompts.embeddings, PromptTokens(model, 2).embeddings)


def test_greedy_output_with_trained_prompt_tokens_is_plain_decoding(tiny_model):
    model = tiny(tiny_model)
    trained, _ = train_prompt_tokens(model, windows(model), 2, seconds=60, max_steps=20)
    method = PPD(model, prompts=trained)
    rng = random.Random(5)
    for _ in range(4):
        prompt = [rng.randrange(VOCAB) for _ in range(5)]
        result = method.run(prompt, max_new_tokens=24)
        assert result.token_ids == AutoregressiveDecoder(model).generate(prompt, 24).token_ids
        assert result.steps <= 24 and result.extra["mean_verified_width"] > 1


def test_prompt_tokens_are_trained_once_then_read_from_the_cache(tiny_model, monkeypatch, tmp_path):
    model = tiny(tiny_model)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []
    data = windows(model)
    monkeypatch.setattr(ppd, "_training_windows", lambda *a, **k: calls.append(1) or (data, data[:1]))
    first, card = ppd.cached_prompt_tokens(model, None, 2, 3, window=40)
    second, again = ppd.cached_prompt_tokens(model, None, 2, 3, window=40)
    assert calls == [1] and not card["cached"] and again["cached"]
    assert torch.equal(first.embeddings, second.embeddings)


def test_ppd_without_prompt_tokens_or_tokenizer_says_what_it_needs(tiny_model):
    with pytest.raises(ValueError, match="tokenizer"):
        PPD(tiny(tiny_model)).build(0.0)


def test_training_without_a_step_count_or_time_budget_is_refused(tiny_model):
    model = tiny(tiny_model)
    with pytest.raises(ValueError, match="max_steps"):
        train_prompt_tokens(model, windows(model), 2)


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_a_resumed_training_ends_where_the_uninterrupted_one_does(
    tiny_model, tmp_path, monkeypatch, schedule
):
    model = tiny(tiny_model)
    data = windows(model)
    whole, card = train_prompt_tokens(model, data, 2, max_steps=4, schedule=schedule)
    state = tmp_path / "partial.pt"
    loss, calls = ppd._window_loss, []

    def stopped_at_the_third_step(*args):  # a job killed in its third training step
        calls.append(torch.is_grad_enabled())
        if sum(calls) == 3:
            raise KeyboardInterrupt
        return loss(*args)

    monkeypatch.setattr(ppd, "_window_loss", stopped_at_the_third_step)
    with pytest.raises(KeyboardInterrupt):
        train_prompt_tokens(model, data, 2, max_steps=4, schedule=schedule, resume=state, save_every=1)
    monkeypatch.setattr(ppd, "_window_loss", loss)
    assert torch.load(state, weights_only=False)["steps"] == 2
    resumed, again = train_prompt_tokens(model, data, 2, max_steps=4, schedule=schedule, resume=state)
    assert again["steps"] == 4 and again["held_out_initial"] == card["held_out_initial"]
    torch.testing.assert_close(resumed.embeddings, whole.embeddings, rtol=0, atol=0)
    # negative control: resuming from the untrained state is not the same run
    fresh, _ = train_prompt_tokens(model, data, 2, max_steps=2, schedule=schedule)
    assert not torch.equal(fresh.embeddings, whole.embeddings)


def test_an_unknown_schedule_or_a_cosine_without_a_length_is_refused(tiny_model):
    model = tiny(tiny_model)
    with pytest.raises(ValueError, match="schedule"):
        train_prompt_tokens(model, windows(model), 2, max_steps=2, schedule="linear")
    with pytest.raises(ValueError, match="max_steps"):
        train_prompt_tokens(model, windows(model), 2, seconds=1.0, schedule="cosine")
