"""The feature cache: exact target distributions from the stored hidden states, resumable atomic shards."""

from __future__ import annotations

import torch

from executor.training.features import build_features, load_features, target_logits


def chunks(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(vocab, (count, length), generator=generator).tolist()


def test_cached_hidden_states_give_the_target_distribution_through_the_frozen_head(tiny_model, tmp_path):
    model = tiny_model(3, vocab_size=16, max_seq_len=64)
    data = {"train": chunks(5, 12, 16, 0), "held_out": chunks(2, 12, 16, 1)}
    build_features(
        model, data, tmp_path, shard_chunks=2, batch_size=2, storage_dtype=torch.float32, progress=False
    )
    features = load_features(tmp_path, "train")
    assert features.tokens.tolist() == data["train"]
    model.setup_cache(12)
    with torch.no_grad():
        logits = model(torch.tensor([data["train"][3]]), torch.arange(12))[0]
        recomputed = target_logits(model, features.hidden[3])
    torch.testing.assert_close(recomputed, logits, atol=1e-5, rtol=1e-5)
    # top-k counts: every position contributes topk = 8 tokens.
    assert int(features.topk_counts.sum()) == 5 * 12 * 8


def test_an_interrupted_cache_resumes_and_equals_an_uninterrupted_one(tiny_model, tmp_path):
    model = tiny_model(3, vocab_size=16, max_seq_len=64)
    data = {"train": chunks(6, 8, 16, 0), "held_out": chunks(2, 8, 16, 1)}
    build_features(model, data, tmp_path / "full", shard_chunks=2, progress=False)
    build_features(model, data, tmp_path / "cut", shard_chunks=2, progress=False)
    # Simulate an interruption: the manifest and a shard are missing; a stray temporary file is left behind.
    (tmp_path / "cut" / "manifest.json").unlink()
    (tmp_path / "cut" / "train-00001.safetensors").unlink()
    (tmp_path / "cut" / ".train-00001.safetensors.x.tmp").write_bytes(b"partial")
    build_features(model, data, tmp_path / "cut", shard_chunks=2, progress=False)
    for split in data:
        full, cut = load_features(tmp_path / "full", split), load_features(tmp_path / "cut", split)
        assert torch.equal(full.hidden, cut.hidden) and torch.equal(full.tokens, cut.tokens)
    assert load_features(tmp_path / "full", "train").hidden.dtype == torch.bfloat16
