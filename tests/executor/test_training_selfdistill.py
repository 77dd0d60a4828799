"""The self-distillation corpus: ``self:N`` parsing, chunking, and a resumable, reproducible generation cache."""

from __future__ import annotations

import itertools

import pytest
import torch

from executor.training.selfdistill import (
    PROSE_OPENERS,
    chunk_sequences,
    generate_continuations,
    merge_features,
    parse_self_corpus,
    self_distilled_features,
)


class CharTokenizer:
    """Characters to ids modulo a tiny vocabulary (enough to drive a tiny model)."""

    eos_id = 0

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def encode(self, text: str) -> list[int]:
        return [1 + ord(c) % (self.vocab - 1) for c in text]


def test_self_corpus_names_are_parsed_and_bad_ones_refused():
    assert parse_self_corpus("self:4096") == 4096
    assert parse_self_corpus(None) is None and parse_self_corpus("/some/dir") is None
    for bad in ("self:", "self:0", "self:-5", "self:1e3"):
        with pytest.raises(ValueError, match="positive integer number of tokens"):
            parse_self_corpus(bad)


def test_chunks_are_consecutive_windows_of_the_sequences_joined_by_eos():
    chunks = chunk_sequences([[1, 2, 3], [4, 5, 0], [6]], 0, 3)
    # Joined: 1 2 3 0 | 4 5 0 | 6 0 (a sequence already ending in EOS gets no second one).
    assert chunks == [[1, 2, 3], [0, 4, 5], [0, 6, 0]]
    assert chunk_sequences([[1, 2]], None, 3) == []


def test_code_starts_skip_documents_without_room_for_a_window(monkeypatch):
    # A document of exactly two windows once made the offset's modulus zero (ZeroDivisionError mid-run).
    from executor.training import corpus, selfdistill

    documents = [("short.py", "a" * 11), ("exact.py", "b" * 12), ("long.py", "c" * 13)]
    monkeypatch.setattr(corpus, "default_corpus", lambda: corpus.Corpus("test", documents, []))
    starts = list(itertools.islice(selfdistill._code_starts(CharTokenizer(16), 6), 3))
    assert [doc for doc, _ in starts] == ["code:long.py", "code:long.py#1", "code:long.py#2"]
    assert starts[0][1] == CharTokenizer(16).encode("c" * 6)


def test_code_starts_go_on_past_one_pass_with_other_windows(monkeypatch):
    # A request larger than one pass over the files once ended in StopIteration mid-generation.
    from executor.training import corpus, selfdistill

    text = "".join(chr(32 + i % 90) for i in range(400))
    documents = [(f"{name}.py", text[i * 7 :]) for i, name in enumerate("abc")]
    monkeypatch.setattr(corpus, "default_corpus", lambda: corpus.Corpus("test", documents, []))
    starts = list(itertools.islice(selfdistill._code_starts(CharTokenizer(97), 8), 12))
    assert [doc for doc, _ in starts[:3]] == ["code:a.py", "code:b.py", "code:c.py"]
    assert [doc for doc, _ in starts[3:6]] == ["code:a.py#1", "code:b.py#1", "code:c.py#1"]
    windows = [tuple(ids) for _, ids in starts]
    assert all(len(ids) == 8 for ids in windows)
    assert len(set(windows)) >= 10  # later passes take other windows of the same files, not the same again


def test_code_starts_refuse_a_corpus_without_a_long_enough_file(monkeypatch):
    from executor.training import corpus, selfdistill

    monkeypatch.setattr(corpus, "default_corpus", lambda: corpus.Corpus("test", [("a.py", "x" * 5)], []))
    with pytest.raises(ValueError, match="long enough for a 6-token start"):
        next(selfdistill._code_starts(CharTokenizer(16), 6))


def test_generation_resumes_exactly_where_an_uninterrupted_run_would_be(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a"))
    target = tiny_model(0, vocab_size=16, max_seq_len=64)
    tokenizer = CharTokenizer(16)
    options = {"code_prompt_tokens": 6, "prose_prompt_tokens": 4, "new_tokens": 5, "batch_size": 2}
    first, path = generate_continuations(target, tokenizer, 12, progress=False, **options)
    assert len(first) >= 3  # up to five new tokens per row: at least three rows for 12 tokens
    assert len(path.read_text().splitlines()) % 2 == 0  # the cache holds whole batches of two rows
    # Only the rows needed for 12 tokens are returned, so a larger cache serves a smaller request unchanged.
    generated = [len(ids) - 6 if len(ids) > 6 else 0 for ids in first]
    assert sum(generated[:-1]) < 12
    resumed, _ = generate_continuations(target, tokenizer, 40, progress=False, **options)
    assert resumed[: len(first)] == first and path.is_file()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "b"))
    fresh, _ = generate_continuations(target, tokenizer, 40, progress=False, **options)
    assert fresh == resumed
    assert len(resumed) >= 8 and resumed[6][:4] == tokenizer.encode(PROSE_OPENERS[0])[:4]  # batch 3: prose
    assert all(0 <= token < 16 for ids in resumed for token in ids)


def test_self_distilled_features_are_merged_oversampled_before_the_base(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = tiny_model(0, vocab_size=16, max_seq_len=64)
    from executor.training import selfdistill

    monkeypatch.setattr(
        selfdistill,
        "generate_continuations",
        lambda target, tokenizer, tokens, progress: ([[1, 2, 3, 4, 5, 6, 7]] * 4, tmp_path / "gen.jsonl"),
    )
    generated, info = self_distilled_features(target, CharTokenizer(16), 28, chunk_length=8, progress=False)
    assert generated.tokens.tolist() == [[1, 2, 3, 4, 5, 6, 7, 0]] * 4 and info["chunks"] == 4
    assert info["generation_key"] == "gen"  # the cache file's name: it enters the trained head's key
    merged = merge_features(generated, generated, repeat=3)
    assert merged.tokens.shape[0] == 16 and torch.equal(merged.hidden[:4], generated.hidden)


def test_a_different_self_n_gets_its_own_features_and_reuses_the_common_chunks(
    tiny_model, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = tiny_model(0, vocab_size=16, max_seq_len=64)
    from executor.training import selfdistill

    rows = [[1 + (i * 7 + j) % 15 for j in range(7)] for i in range(40)]
    monkeypatch.setattr(
        selfdistill,
        "generate_continuations",
        lambda target, tokenizer, tokens, progress: (rows[: tokens // 7], tmp_path / "gen.jsonl"),
    )
    small, info_small = self_distilled_features(
        target, CharTokenizer(16), 14 * 7, chunk_length=8, progress=False
    )
    large, info_large = self_distilled_features(
        target, CharTokenizer(16), 40 * 7, chunk_length=8, progress=False
    )
    assert info_small["chunks"] == 14 and info_large["chunks"] == 40  # the old bug: 14 chunks served both
    assert torch.equal(large.tokens[:14], small.tokens) and torch.equal(large.hidden[:14], small.hidden)
    assert sorted(p.name for p in tmp_path.glob("gen.features-8-*")) == [
        "gen.features-8-14",
        "gen.features-8-40",
    ]
