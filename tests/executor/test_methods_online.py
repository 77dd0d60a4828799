"""executor.methods.online: the drafter learns while serving, the output stays the target's.

Oracles: greedy output equal to plain decoding with updates on; the head's weights change after an update and
stay put with ``learn=False`` (the negative control); on a tiny model whose greedy continuations are learnable,
acceptance over the second half of a stream rises above the frozen drafter's on the same stream; the update's
seconds are part of the prompt's wall time; the replay buffer's windows end in the generated text.
"""

from __future__ import annotations

import random

import pytest
import torch

from executor.decoders import AutoregressiveDecoder
from executor.methods.online import OnlineSpeculative, ReplayBuffer

VOCAB = 8


def tiny(tiny_model):
    return tiny_model(3, vocab_size=VOCAB, n_layers=4, max_seq_len=96)


def stream(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(5)] for _ in range(count)]


def head_vector(method) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float() for p in method.drafter.head.parameters()])


def serve(method, prompts, tokens: int = 24) -> list[float]:
    acceptance = []
    for prompt in prompts:
        reference = AutoregressiveDecoder(method.target).generate(prompt, tokens).token_ids
        result = method.run(prompt, max_new_tokens=tokens)
        assert result.token_ids == reference  # exactness with updates on
        acceptance.append(result.extra["draft_acceptance"])
    return acceptance


def test_updates_change_the_drafter_and_greedy_output_stays_plain_decoding(tiny_model):
    model = tiny(tiny_model)
    method = OnlineSpeculative(model, gamma=3, steps=3, lr=1e-2, window=16)
    before = head_vector(method)
    serve(method, stream(3))
    assert method.served == 3 and len(method.buffer) == 3
    assert not torch.allclose(before, head_vector(method))


def test_a_warm_up_generates_without_serving_or_learning(tiny_model):
    model = tiny(tiny_model)
    method = OnlineSpeculative(model, gamma=3, steps=3, lr=1e-2, window=16, update_every=1)
    before = head_vector(method)
    method.warm_up(stream(1)[0], 0.0, 12)
    assert method.served == 0 and len(method.buffer) == 0 and not method.curve
    assert torch.equal(before, head_vector(method))
    serve(method, stream(1))  # a served prompt, by contrast, is learned from
    assert method.served == 1 and not torch.equal(before, head_vector(method))


def test_a_frozen_drafter_does_not_change_the_negative_control(tiny_model):
    model = tiny(tiny_model)
    method = OnlineSpeculative(model, gamma=3, steps=3, lr=1e-2, window=16, learn=False)
    before = head_vector(method)
    serve(method, stream(3))
    assert torch.equal(before, head_vector(method))
    assert all(point["update_seconds"] == 0.0 for point in method.curve)


def test_online_distillation_raises_acceptance_on_a_learnable_stream(tiny_model):
    """Same stream, same untrained start: learning must beat the frozen drafter by 0.2 on the second half."""
    prompts = stream(12, seed=1)
    results = {}
    for learn in (True, False):
        method = OnlineSpeculative(tiny(tiny_model), gamma=3, steps=8, lr=1e-2, window=24, learn=learn)
        results[learn] = serve(method, prompts)
    late = {learn: sum(a[6:]) / 6 for learn, a in results.items()}
    assert late[True] >= late[False] + 0.2, late


def test_the_update_time_is_counted_in_the_prompt_wall_time(tiny_model):
    method = OnlineSpeculative(tiny(tiny_model), gamma=2, steps=2, lr=1e-2, window=16)
    result = method.run([1, 2, 3, 1, 2], max_new_tokens=8)
    point = method.curve[-1]
    assert point["update_seconds"] > 0
    assert result.wall_time == pytest.approx(point["generate_seconds"] + point["update_seconds"])


def test_updates_happen_every_update_every_prompts(tiny_model):
    method = OnlineSpeculative(tiny(tiny_model), gamma=2, steps=1, lr=1e-2, window=16, update_every=2)
    serve(method, stream(4), tokens=8)
    assert [point["update_seconds"] > 0 for point in method.curve] == [False, True, False, True]


def test_the_replay_buffer_keeps_the_last_prompts_and_samples_generated_windows():
    buffer = ReplayBuffer(capacity=2, window=4)
    for offset in range(3):
        tokens = list(range(offset * 100, offset * 100 + 10))
        buffer.add(tokens, torch.arange(10.0)[:, None].repeat(1, 3) + 100 * offset, prompt_length=6)
    assert len(buffer) == 2 and int(buffer.items[0][0][0]) == 100  # the oldest prompt was dropped
    tokens, hidden = buffer.sample(16, torch.Generator().manual_seed(0))
    assert tokens.shape == (16, 4) and hidden.shape == (16, 4, 3)
    assert torch.all(tokens[:, -1] % 100 >= 6)  # every window ends after the prompt
    assert torch.equal(hidden[..., 0], (tokens % 100 + 100 * (tokens // 100)).float())  # rows stay aligned
    buffer.add([1, 2], torch.zeros(2, 3), prompt_length=1)
    assert len(buffer) == 2  # too short to hold a training pair: ignored


def test_the_prediction_serves_the_calibration_prompts_first(tiny_model):
    method = OnlineSpeculative(tiny(tiny_model), gamma=3, steps=1, lr=1e-2, window=16)
    prediction = method.predict(stream(2), 0.0, 12)
    assert method.served == 2 and 1.0 <= prediction.predicted_tau <= 4.0
    assert len(prediction.details["acceptance_vector"]) == 3 and prediction.train_seconds > 0
