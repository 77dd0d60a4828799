"""Layer-K hidden states added to a feature cache: equal to the target's own early exit, only the requested
layers are written, and layers already present are not recomputed."""

from __future__ import annotations

import pytest
import torch

from executor.training.features import build_features, load_features
from executor.training.layer_features import add_layer_features, load_layer_features, shallow_forward
from tests.tiny_models import build_tiny_model


@pytest.fixture
def cache(tmp_path):
    target = build_tiny_model(0, vocab_size=12, n_layers=4)
    generator = torch.Generator().manual_seed(0)
    chunks = {
        split: torch.randint(12, (n, 10), generator=generator).tolist()
        for split, n in [("train", 5), ("held_out", 2)]
    }
    build_features(target, chunks, tmp_path, shard_chunks=2, progress=False, storage_dtype=torch.float32)
    return target, tmp_path


def test_layer_states_equal_the_targets_hidden_state_after_k_layers(cache):
    target, directory = cache
    add_layer_features(target, directory, [1, 3], progress=False)
    tokens = load_features(directory, "train").tokens
    for layer in (1, 3):
        stored = load_layer_features(directory, "train", layer)
        target.setup_cache(10, batch_size=len(tokens))
        with torch.no_grad():
            _, hidden = target(tokens, torch.arange(10), exit_layer=layer, return_hidden=True)
        torch.testing.assert_close(stored, hidden, atol=1e-5, rtol=1e-5)
    assert shallow_forward(target, tokens[:1], [2])[2].shape == (1, 10, target.config.dim)
    with pytest.raises(ValueError, match="lacks layer-2 features"):
        load_layer_features(directory, "train", 2)  # only the requested layers were written


def test_layers_already_present_are_not_recomputed(cache, monkeypatch):
    from executor.training import layer_features

    target, directory = cache
    add_layer_features(target, directory, [2], progress=False)
    before = {p.name: p.stat().st_mtime_ns for p in directory.glob("*.layer-02.*")}
    seen = []
    original = layer_features.shallow_forward
    monkeypatch.setattr(
        layer_features,
        "shallow_forward",
        lambda t, x, layers: seen.append(list(layers)) or original(t, x, layers),
    )
    add_layer_features(target, directory, [2, 3], progress=False)
    assert seen and all(layers == [3] for layers in seen)
    assert before == {p.name: p.stat().st_mtime_ns for p in directory.glob("*.layer-02.*")}


def test_bad_layers_and_missing_caches_are_refused(cache, tmp_path_factory):
    target, directory = cache
    for layers in ([], [0], [4], [True]):
        with pytest.raises(ValueError, match=r"layers must be integers in \[1, 4\)"):
            add_layer_features(target, directory, layers, progress=False)
    with pytest.raises(ValueError, match="is incomplete"):
        add_layer_features(target, tmp_path_factory.mktemp("empty"), [1], progress=False)
