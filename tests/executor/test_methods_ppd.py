"""executor.methods.ppd: prompt tokens that make the target guess its own future tokens.

Oracles: a prompt token whose embedding is a real token's embedding must give exactly the logits of a plain
forward over that token (so the positions, the slots and the mask are right); the layout's mask is enumerated
by hand for a chain and for a branching tree; the real rows of a PPD pass equal plain decoding's; training
only moves the embeddings, lowers the held-out distillation loss on a tiny model; greedy output is plain
decoding's with trained prompt tokens; the cache trains once.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from executor.decoders import AutoregressiveDecoder
from executor.decoders.base import DraftTree
from executor.methods import ppd
from executor.methods.ppd import PPD, PromptTokens, _tree_layout, prompt_forward, train_prompt_tokens
from theory import Tree, optimal_tree, tree_expected_tokens

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
        # root = context[-1], then its two prompt tokens
        slots, positions, mask = _tree_layout(3, DraftTree(context[-1]), 2)
        logits = prompt_forward(model, prompts, context[-1:], [0, 1], slots, positions, mask)
    torch.testing.assert_close(logits, plain[3:], rtol=1e-5, atol=1e-5)


def tree(parents: list[int]) -> DraftTree:
    draft = DraftTree(0)
    for parent in parents[1:]:
        draft.add_child(parent, 1)
    return draft


def test_the_chain_layout_mask_is_prefix_path_and_the_nodes_earlier_prompt_tokens():
    slots, positions, mask = _tree_layout(2, tree([-1, 0]), count=2)
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


def test_the_tree_layout_gives_each_prompt_token_its_nodes_path_not_the_siblings():
    slots, positions, mask = _tree_layout(1, tree([-1, 0, 0]), count=1)
    assert slots == list(range(1, 7))
    # rows: root, child a, child b, then one prompt token per node at its node's depth + 1.
    assert positions == [1, 2, 2, 2, 3, 3]
    expected = torch.tensor(
        [
            [1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0],
            [1, 1, 0, 1, 0, 0, 0],
            [1, 1, 0, 0, 1, 0, 0],
            [1, 1, 1, 0, 0, 1, 0],
            [1, 1, 0, 1, 0, 0, 1],
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


def test_the_planned_tree_comes_from_the_measured_acceptance_and_step_costs(tiny_model, monkeypatch):
    model = tiny(tiny_model)
    trained, _ = train_prompt_tokens(model, windows(model), 2, seconds=60, max_steps=20)
    method = PPD(model, prompts=trained, width=2, budget=5)
    assert method.parents == [-1, 0, 1]  # the chain until a calibration plans the tree
    calibration = [[1, 2, 3, 4, 5], [6, 5, 4], [0, 7, 2, 2]]
    # Every extra position costs a lot: the root alone with one prompt token, and its 1 token per step.
    monkeypatch.setattr("executor.methods.calibration.forward_time_ratio", lambda m, e, tokens: tokens**3)
    prediction = method.predict(calibration, 0.0, 16)
    assert (method.guesses, method.parents, prediction.predicted_tau) == (1, [-1], 1.0)
    # Free positions: the tree with the most expected tokens for the measured table, and it is what runs.
    monkeypatch.setattr("executor.methods.calibration.forward_time_ratio", lambda m, e, tokens: 1.0)
    prediction = method.predict(calibration, 0.0, 16)
    table = np.array(prediction.details["acceptance_table"])
    best = optimal_tree(table, 5, max_depth=2, max_width=2)
    assert table[0, 0] > 0 and len(method.parents) > 1
    assert prediction.predicted_tau == pytest.approx(best.expected_tokens)
    decoder = method.build(0.0)
    assert decoder.shape == method.parents and decoder.guesses == method.guesses
    assert prediction.predicted_tau == pytest.approx(tree_expected_tokens(Tree(method.parents), table))
    # Positions cost what they cost up to 4 of them, then 10 times more: one guess on a root-and-child
    # chain (4 positions) beats any use of two guesses (3 positions per node).
    monkeypatch.setattr(
        "executor.methods.calibration.forward_time_ratio", lambda m, e, tokens: 1.0 if tokens <= 4 else 10.0
    )
    prediction = method.predict(calibration, 0.0, 16)
    assert (
        method.guesses == 1 and method.parents == [-1, 0] and set(prediction.details["planned"]) == {"1", "2"}
    )
    fixed = PPD(model, prompts=trained, guesses=2, budget=5)
    fixed.predict(calibration, 0.0, 16)
    assert fixed.guesses == 2 and set(fixed.options()) >= {"guesses", "parents"}
    assert PPD(model, prompts=trained, tree="chain").options()["parents"] == [-1, 0, 1]
    assert PPD(model, prompts=trained, tree="chain", guesses=1).options()["parents"] == [-1, 0]


def test_prompt_tokens_beyond_the_guesses_do_not_change_the_guesses(tiny_model):
    model = tiny(tiny_model)
    trained, _ = train_prompt_tokens(model, windows(model), 2, seconds=60, max_steps=20)
    outputs = []
    for guesses in (1, 2):
        decoder = ppd.PPDDecoder(model, trained, tree=[-1, 0], guesses=guesses)
        decoder.generate([1, 2, 3, 4], 5)
        outputs.append(decoder.drafter.logits)
    torch.testing.assert_close(outputs[0], outputs[1][:1], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="guesses must be at most"):
        ppd.PPDDecoder(model, trained, guesses=3)
    with pytest.raises(ValueError, match="deeper than the 1 guesses"):
        ppd.PPDDecoder(model, trained, tree=[-1, 0, 1], guesses=1)


@pytest.mark.parametrize("parents", [[-1, 0, 0], [-1, 0, 0, 1, 1, 2]])
def test_greedy_output_with_a_tree_of_guesses_is_plain_decoding(tiny_model, parents):
    model = tiny(tiny_model)
    trained, _ = train_prompt_tokens(model, windows(model), 2, seconds=60, max_steps=20)
    method = PPD(model, prompts=trained, tree=parents)
    for prompt in ([1, 2, 3, 1, 2], [7, 7, 0, 3]):
        result = method.run(prompt, max_new_tokens=24)
        assert result.token_ids == AutoregressiveDecoder(model).generate(prompt, 24).token_ids


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
