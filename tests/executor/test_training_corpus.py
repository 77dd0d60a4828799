"""The training corpus: the fixed split rule, test files excluded, user corpora, chunking."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.training.corpus import (
    Corpus,
    default_corpus,
    documents_read,
    is_held_out,
    load_corpus,
    tokenize_chunks,
)


def test_split_rule_is_the_documented_hash_of_the_relative_path():
    for path in ("json/decoder.py", "email/parser.py", "a", "x/y/z.txt", "0"):
        digest = hashlib.sha256(path.encode()).digest()
        assert is_held_out(path) == (int.from_bytes(digest[:8], "big") % 20 == 0)
    held = sum(is_held_out(f"file{i}.py") for i in range(4000))
    assert 140 < held < 260  # about 1 in 20


def test_default_corpus_is_the_stdlib_without_tests_and_splits_by_file():
    corpus = default_corpus()
    assert corpus.name.startswith("stdlib-")
    train_ids = {doc_id for doc_id, _ in corpus.train}
    held_ids = {doc_id for doc_id, _ in corpus.held_out}
    assert not train_ids & held_ids
    assert all(is_held_out(doc_id) for doc_id in held_ids)
    assert not any(is_held_out(doc_id) for doc_id in train_ids)
    everything = train_ids | held_ids
    assert "json/decoder.py" in everything
    assert not any(part in ("test", "tests") for doc_id in everything for part in doc_id.split("/"))
    assert corpus.fingerprint() == default_corpus().fingerprint()


def test_user_corpus_from_a_directory_and_from_jsonl(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for i in range(60):
        (folder / f"doc{i}.txt").write_text(f"text number {i}\n")
    (folder / "binary.bin").write_bytes(b"\xff\xfe\x00")
    corpus = load_corpus(folder)
    assert len(corpus.train) + len(corpus.held_out) == 60  # the non-UTF-8 file is skipped
    lines = tmp_path / "texts.jsonl"
    lines.write_text(
        "\n".join(json.dumps({"text": f"line {i}"} if i % 2 else f"line {i}") for i in range(80))
    )
    corpus = load_corpus(lines)
    assert sorted(text for _, text in corpus.train + corpus.held_out) == sorted(
        f"line {i}" for i in range(80)
    )


def test_bad_corpora_are_rejected_with_the_reason(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_corpus(tmp_path / "missing")
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "a.txt").write_text("x")
    with pytest.raises(ValueError, match="needs documents in both splits"):
        load_corpus(tmp_path / "one")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": 1}\n')
    with pytest.raises(ValueError, match="line 1 must be a JSON string"):
        load_corpus(bad)
    (tmp_path / "c.csv").write_text("a,b")
    with pytest.raises(ValueError, match="must be a directory or a .jsonl file"):
        load_corpus(tmp_path / "c.csv")


def test_chunks_are_consecutive_windows_with_eos_between_documents():
    documents = [("a", "ab"), ("b", "cde"), ("c", "f")]
    chunks = tokenize_chunks(documents, lambda text: [ord(c) for c in text], 0, 3, 100)
    assert chunks == [[97, 98, 0], [99, 100, 101], [0, 102, 0]]
    assert tokenize_chunks(documents, lambda text: [ord(c) for c in text], 0, 3, 6) == chunks[:2]
    with pytest.raises(ValueError, match="chunk_length must be at least 2"):
        tokenize_chunks(documents, list, 0, 1, 10)


def test_a_run_reads_train_documents_in_order_until_the_budget_is_filled():
    corpus = Corpus("c", [("a", "one two three"), ("b", "four five"), ("c", "six")], [("h", "held out")])
    encode = lambda text: [len(word) for word in text.split()]  # noqa: E731
    assert documents_read(corpus, encode, 0) == set()
    assert documents_read(corpus, encode, 4) == {"a"}  # 3 tokens + end of text
    assert documents_read(corpus, encode, 5) == {"a", "b"}
    assert documents_read(corpus, encode, 100) == {"a", "b", "c"}  # never the held-out split


@given(st.lists(st.integers(0, 40), min_size=1, max_size=12), st.integers(1, 12))
def test_documents_read_are_the_documents_tokenize_chunks_encodes(lengths, windows):
    chunk_length = 4
    documents = [(f"d{i}", "x" * n) for i, n in enumerate(lengths)]
    corpus = Corpus("test", documents, documents[:1])
    encoded = []

    def encode(text):
        encoded.append(len(encoded))
        return [1] * len(text)

    tokenize_chunks(documents, encode, 0, chunk_length, windows * chunk_length)
    assert documents_read(corpus, lambda text: [1] * len(text), windows * chunk_length) == {
        f"d{i}" for i in range(len(encoded))
    }
