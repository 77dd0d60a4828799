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


def test_a_larger_cache_copies_the_shards_of_a_smaller_one_with_the_same_chunks(tiny_model, tmp_path):
    from executor.training import features as module

    model = tiny_model(3, vocab_size=16, max_seq_len=64)
    data = chunks(6, 8, 16, 0)
    build_features(model, {"train": data[:4]}, tmp_path / "small", shard_chunks=2, progress=False)
    calls = []
    original = module._reuse_shard
    module._reuse_shard = lambda *args: calls.append(original(*args)) or calls[-1]
    try:
        build_features(
            model,
            {"train": data},
            tmp_path / "big",
            shard_chunks=2,
            progress=False,
            reuse=[tmp_path / "small"],
        )
    finally:
        module._reuse_shard = original
    assert calls == [True, True, False]  # two shards copied, the third computed
    build_features(model, {"train": data}, tmp_path / "fresh", shard_chunks=2, progress=False)
    big, fresh = load_features(tmp_path / "big", "train"), load_features(tmp_path / "fresh", "train")
    assert torch.equal(big.hidden, fresh.hidden) and torch.equal(big.topk_counts, fresh.topk_counts)
    # Negative control: a sibling with other tokens under the same shard name is not copied.
    other = chunks(6, 8, 16, 9)
    build_features(
        model,
        {"train": other},
        tmp_path / "other",
        shard_chunks=2,
        progress=False,
        reuse=[tmp_path / "small"],
    )
    assert torch.equal(load_features(tmp_path / "other", "train").tokens, torch.tensor(other))


def test_sibling_caches_match_on_target_corpus_and_settings(tmp_path):
    import json

    from executor.training.features import MANIFEST, sibling_caches

    info = {
        "target": "t",
        "corpus_fingerprint": "c",
        "chunk_length": 8,
        "storage_dtype": "b",
        "target_dtype": "f",
    }
    for name, change in (("same", {}), ("model", {"target": "u"}), ("length", {"chunk_length": 9})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "corpus.json").write_text(json.dumps({**info, **change, "train_tokens": 1}))
        (tmp_path / name / MANIFEST).write_text("{}")
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "corpus.json").write_text(json.dumps(info))
    assert sibling_caches(tmp_path / "new", info) == [tmp_path / "same"]
