"""Training a tiny Falcon head with CSGD: held-out KL falls and sum-min rises at both tokens of a pass; the
coupled inputs and block roles match hand-built oracles; checkpoints round-trip bit-exactly and bad ones fail."""

from __future__ import annotations

import pytest
import torch

from executor.drafters import FalconDrafter, FalconHead, FeatureDrafter, parse_drafter
from executor.drafters.falcon import block_mask
from executor.training.checkpoint import WEIGHTS_NAME, model_fingerprint, save_checkpoint
from executor.training.falcon import (
    coupled_inputs,
    evaluate_falcon_head,
    first_in_block,
    train_falcon_head,
)
from executor.training.features import build_features, load_features, target_logits
from executor.training.trainer import TrainConfig
from tests.executor.test_training_trainer import VOCAB, markov_chunks


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from tests.tiny_models import build_tiny_model

    target = build_tiny_model(0, vocab_size=VOCAB, dim=32, n_heads=4, n_kv_heads=2, hidden_dim=64)
    directory = tmp_path_factory.mktemp("features")
    data = {"train": markov_chunks(48, 24, 0), "held_out": markov_chunks(6, 24, 1)}
    build_features(target, data, directory, progress=False)
    return target, load_features(directory, "train"), load_features(directory, "held_out")


CONFIG = TrainConfig(minutes=0.12, lr=3e-3, batch_size=4, vocab="full", eval_seconds=1.0)


@pytest.fixture(scope="module")
def trained(setup, tmp_path_factory):
    target, train, held_out = setup
    directory = tmp_path_factory.mktemp("falcon")
    return train_falcon_head(target, train, held_out, directory, CONFIG, progress=False), directory


def test_training_for_seconds_lowers_held_out_kl_and_raises_sum_min_at_both_tokens(trained):
    card, _ = trained
    assert card["kind"] == "falcon" and card["block"] == 2 and card["steps"] > 5
    for before, after in (
        (card["held_out_initial"], card["held_out"]),
        (card["held_out_initial_token2"], card["held_out_token2"]),
    ):
        assert after["kl"] < 0.6 * before["kl"]
        assert after["sum_min"] > before["sum_min"] + 0.15
    # The target's law of the Markov corpus makes token 1 (one coin) easier than token 2 (two coins).
    assert card["held_out"]["sum_min"] > 0.5
    assert card["held_out"]["sum_min"] > card["held_out_token2"]["sum_min"]
    assert card["held_out_pass2"]["token3"]["sum_min"] > card["held_out_initial"]["sum_min"]


def test_block_mask_and_roles_match_a_hand_built_oracle():
    # offset 0: blocks [0, 1], [2, 3], [4]; offset 1: [0], [1, 2], [3, 4].
    expected = {
        0: [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]],
        1: [[1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]],
    }
    for offset, rows in expected.items():
        assert block_mask(5, offset).int().tolist() == rows
    assert first_in_block(5, 0).tolist() == [True, False, True, False, False]
    assert first_in_block(5, 1).tolist() == [False, True, False, True, False]


def test_coupled_inputs_feed_each_replaced_block_the_predictions_two_entries_back():
    inputs = torch.arange(6.0).reshape(1, 6, 1)
    predicted = 100 + torch.arange(6.0).reshape(1, 6, 1)
    # offset 0: blocks [0,1] (no prediction to take), [2,3], [4,5]; replace blocks 0 and 2.
    out = coupled_inputs(inputs, predicted, torch.tensor([[True, False, True, False]]), 0)
    assert out.reshape(-1).tolist() == [0, 1, 2, 3, 102, 103]
    # offset 1: blocks [0], [1,2], [3,4], [5]; replace all: block [1,2] starts before entry 2 and stays.
    out = coupled_inputs(inputs, predicted, torch.ones(1, 4, dtype=torch.bool), 1)
    assert out.reshape(-1).tolist() == [0, 1, 2, 101, 102, 103]


def test_evaluation_of_token_two_matches_a_direct_computation(setup):
    target, _, held_out = setup
    head = FalconHead(target.config)
    metrics = evaluate_falcon_head(head, target, held_out, max_chunks=1)
    hidden, tokens = held_out.hidden[0].float(), held_out.tokens[0]
    with torch.no_grad():
        head.setup_cache(22)
        slots = torch.arange(22)
        g = head(target, hidden[None, :-2], tokens[None, 1:-1], slots, slots + 1, block_mask(22))[0]
        p = target_logits(target, hidden[2:]).double().softmax(-1)
        q = head.logits(target, g).double().softmax(-1)
    odd = slots % 2 == 1
    assert metrics["token2"]["tokens"] == 11 and metrics["token1"]["tokens"] == 11
    direct = float(torch.minimum(p[odd], q[odd]).sum(-1).mean())
    assert metrics["token2"]["sum_min"] == pytest.approx(direct, abs=1e-5)


def test_checkpoint_round_trip_is_bit_exact_and_bad_checkpoints_are_refused(trained, setup, tiny_model):
    card, directory = trained
    target = setup[0]
    drafter = parse_drafter(f"falcon:{directory}", target)
    assert isinstance(drafter, FalconDrafter) and drafter.card["held_out"] == card["held_out"]
    saved = FalconDrafter.from_checkpoint(target, directory).head.state_dict()
    for name, value in drafter.head.state_dict().items():
        assert torch.equal(saved[name], value), name
    with pytest.raises(ValueError, match="is a 'falcon' drafter, not 'feature'"):
        FeatureDrafter.from_checkpoint(target, directory)
    other = tiny_model(3, vocab_size=VOCAB, dim=32, n_heads=4, n_kv_heads=2, hidden_dim=64)
    with pytest.raises(ValueError, match="another target model"):
        FalconDrafter.from_checkpoint(other, directory)


def test_truncated_corrupt_and_wrong_kind_checkpoints_are_refused(tiny_model, tmp_path):
    target = tiny_model(0, vocab_size=VOCAB)
    head = FalconHead(target.config)
    fingerprint = model_fingerprint(target)
    save_checkpoint(tmp_path / "feature", head.state_dict(), {"kind": "feature", "target": fingerprint})
    with pytest.raises(ValueError, match="is a 'feature' drafter, not 'falcon'"):
        FalconDrafter.from_checkpoint(target, tmp_path / "feature")
    for name, damage in (
        ("truncated", lambda b: b[: len(b) // 2]),
        ("corrupt", lambda b: b[:-8] + b"\0" * 8),
    ):
        save_checkpoint(tmp_path / name, head.state_dict(), {"kind": "falcon", "target": fingerprint})
        weights = tmp_path / name / WEIGHTS_NAME
        weights.write_bytes(damage(weights.read_bytes()))
        with pytest.raises(ValueError, match="truncated or corrupt"):
            FalconDrafter.from_checkpoint(target, tmp_path / name)
    with pytest.raises(ValueError, match="trained drafter kinds"):
        from executor.training.trainer import train_drafter

        train_drafter(target, None, kind="medusa")
