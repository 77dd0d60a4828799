"""Checkpoints: bit-exact round trip; another model, a truncated or a corrupt file is refused."""

from __future__ import annotations

import json

import pytest
import torch

from executor.drafters import FeatureDrafter, FeatureHead
from executor.training.checkpoint import (
    cache_root,
    checkpoint_key,
    load_checkpoint,
    model_fingerprint,
    save_checkpoint,
)


@pytest.fixture
def saved(tiny_model, tmp_path):
    target = tiny_model(0, vocab_size=16)
    head = FeatureHead(target.config, torch.tensor([1, 3, 5, 7]))
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(torch.randn(parameter.shape))
    card = {"kind": "feature", "target": model_fingerprint(target), "held_out": {"sum_min": 0.5}}
    save_checkpoint(tmp_path, head.state_dict(), card)
    return target, head, tmp_path


def test_save_load_round_trip_is_bit_exact(saved):
    target, head, path = saved
    drafter = FeatureDrafter.from_checkpoint(target, path)
    for name, value in head.state_dict().items():
        assert torch.equal(drafter.head.state_dict()[name], value), name
    assert drafter.card["held_out"] == {"sum_min": 0.5}
    assert drafter.name == f"feature:{path}"


def test_fingerprint_ignores_dtype_but_not_weights(tiny_model):
    model = tiny_model(0, vocab_size=16)
    assert model_fingerprint(model) == model_fingerprint(tiny_model(0, vocab_size=16).to(torch.bfloat16))
    assert model_fingerprint(model) != model_fingerprint(tiny_model(1, vocab_size=16))
    key = checkpoint_key("feature", model_fingerprint(model), {"lr": 1e-3})
    assert key.startswith("feature-" + model_fingerprint(model)["hash"][:12])


def test_the_fingerprint_is_computed_once_per_model_until_its_weights_change(tiny_model, monkeypatch):
    model = tiny_model(0, vocab_size=16)
    reads = []
    real_state_dict = type(model).state_dict
    monkeypatch.setattr(
        type(model), "state_dict", lambda self, *a, **k: reads.append(1) or real_state_dict(self, *a, **k)
    )
    first = model_fingerprint(model)
    assert model_fingerprint(model) == first and len(reads) == 1
    with torch.no_grad():  # in place: the tensor's version moves
        next(model.parameters()).mul_(2.0)
    changed = model_fingerprint(model)
    assert changed != first and len(reads) == 2
    with torch.no_grad():  # a replaced tensor: the data pointer moves
        parameter = next(model.parameters())
        parameter.data = parameter.data / 2.0
    assert model_fingerprint(model) == first and len(reads) == 3
    assert (
        model_fingerprint(tiny_model(0, vocab_size=16)) == first
    )  # a fresh copy agrees with the cached value
    model_fingerprint(model)["hash"] = "edited"  # callers get copies
    assert model_fingerprint(model) == first


def test_a_model_made_under_inference_mode_has_the_fingerprint_of_its_weights(tiny_model):
    # Inference tensors have no version counter; the cache key must not ask them for one.
    with torch.inference_mode():
        model = tiny_model(0, vocab_size=16)
        assert next(model.parameters()).is_inference()
        assert (
            model_fingerprint(model)
            == model_fingerprint(model)
            == model_fingerprint(tiny_model(0, vocab_size=16))
        )


def test_a_checkpoint_for_another_model_or_vocabulary_is_refused(saved, tiny_model):
    _, _, path = saved
    with pytest.raises(ValueError, match="trained for another target model"):
        load_checkpoint(path, target=tiny_model(1, vocab_size=16))
    with pytest.raises(ValueError, match="vocabulary of 16 tokens but the target has 12"):
        load_checkpoint(path, target=tiny_model(0, vocab_size=12))
    with pytest.raises(ValueError, match="not 'falcon'"):
        load_checkpoint(path, kind="falcon")


def test_truncated_or_corrupt_checkpoints_are_refused(saved):
    target, _, path = saved
    weights = path / "weights.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        FeatureDrafter.from_checkpoint(target, path)
    corrupt = bytearray(data)
    corrupt[-3] ^= 0xFF
    weights.write_bytes(bytes(corrupt))
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_checkpoint(path, target=target)
    weights.write_bytes(data)
    load_checkpoint(path, target=target)  # intact again
    (path / "card.json").write_text((path / "card.json").read_text()[:-10])
    with pytest.raises(ValueError, match="card .* is corrupt"):
        load_checkpoint(path)
    (path / "card.json").unlink()
    with pytest.raises(ValueError, match="has no card.json"):
        load_checkpoint(path)


def test_cache_root_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == tmp_path / "specbound"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root().parts[-2:] == (".cache", "specbound")
    assert json.dumps({"ok": True})
