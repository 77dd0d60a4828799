"""The common ranking set: per-file windows, per-file scores equal to a direct evaluation, ranking on unread files."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.training import ranking
from executor.training.checkpoint import model_fingerprint, save_checkpoint
from executor.training.corpus import documents_read, load_corpus
from executor.training.features import FeatureSet
from executor.training.trainer import cached_checkpoints, evaluate_head
from tests.executor.test_drafters_feature import random_head

VOCAB = 16


class CharTokenizer:
    """Characters modulo the tiny vocabulary; end of text is token 0."""

    eos_id = 0

    def encode(self, text: str) -> list[int]:
        return [1 + ord(c) % (VOCAB - 1) for c in text]


DOCS = [
    ("a.py", "x" * 30),
    ("b.py", "abcdefghij" * 9),
    ("c.py", "short"),
    ("d.py", "def f(): return 1\n" * 4),
]


def test_windows_never_mix_files_and_take_at_most_the_per_file_budget(monkeypatch):
    monkeypatch.setattr(ranking, "TOKENS_PER_FILE", 40)
    monkeypatch.setattr(ranking, "WINDOW", 16)
    chunks, files = ranking.ranking_chunks(CharTokenizer().encode, 0, DOCS)
    # a: 31 tokens -> 1 window; b: 91 tokens, capped at 40 -> 2; c: 6 tokens -> none; d: 73, capped -> 2.
    assert files == ["a.py", "b.py", "b.py", "d.py", "d.py"]
    encode = CharTokenizer().encode
    for doc_id, text in DOCS:
        mine = [chunk for chunk, f in zip(chunks, files, strict=True) if f == doc_id]
        assert sum(mine, []) == (encode(text) + [0])[: 16 * len(mine)]
    monkeypatch.setattr(ranking, "WINDOW", 64)
    with pytest.raises(ValueError, match="no file of 64 tokens"):
        ranking.ranking_chunks(encode, 0, DOCS)


def test_per_file_scores_equal_a_direct_evaluation_and_the_card_still_loads(tmp_path, monkeypatch):
    from executor.drafters import FeatureDrafter
    from tests.tiny_models import build_tiny_model

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(ranking, "TOKENS_PER_FILE", 40)
    monkeypatch.setattr(ranking, "WINDOW", 16)
    target = build_tiny_model(0, vocab_size=VOCAB, dim=32, n_heads=4, n_kv_heads=2, hidden_dim=64)
    head = random_head(target, 3)
    path = tmp_path / "head"
    card = {"kind": "feature", "target": model_fingerprint(target), "corpus": {"name": "stdlib-test"}}
    save_checkpoint(path, head.state_dict(), card)
    tokenizer = CharTokenizer()
    entry = ranking.score_checkpoint(path, target, tokenizer, documents=DOCS, progress=False)
    assert entry["read"] == [] and entry["set"] == ranking.ranking_fingerprint(DOCS)
    assert json.loads((path / "card.json").read_text())["ranking"] == json.loads(json.dumps(entry))
    features, files = ranking.ranking_features(target, tokenizer, DOCS, progress=False)
    loaded = FeatureDrafter.from_checkpoint(target, path).head.float()  # the weights' checksum still holds
    for doc_id in ("a.py", "b.py", "d.py"):
        rows = [i for i, f in enumerate(files) if f == doc_id]
        subset = FeatureSet(features.tokens[rows], features.hidden[rows], features.topk_counts)
        direct = evaluate_head(loaded, target, subset)
        sum_min, top1, tokens = entry["files"][doc_id]
        assert tokens == direct["tokens"] == 15 * len(rows)
        assert sum_min / tokens == pytest.approx(direct["sum_min"], rel=1e-6)
        assert top1 / tokens == pytest.approx(direct["top1"], rel=1e-6)
    assert set(entry["files"]) == {"a.py", "b.py", "d.py"}
    # Once per head: a card scored on the current set is returned without scoring again; another set rescores.
    calls = []
    original = ranking.ranking_features
    monkeypatch.setattr(ranking, "ranking_features", lambda *a, **k: calls.append(1) or original(*a, **k))
    assert ranking.score_checkpoint(path, target, tokenizer, documents=DOCS, progress=False) == entry
    assert calls == []
    other = ranking.score_checkpoint(path, target, tokenizer, documents=DOCS[:2], progress=False)
    assert (
        calls == [1]
        and other["set"] == ranking.ranking_fingerprint(DOCS[:2])
        and set(other["files"]) == {"a.py", "b.py"}
    )


def entry(scores: dict[str, tuple[float, int]], read, documents=DOCS) -> dict:
    """A ranking entry with per-file (Σmin, tokens); top-1 = Σmin / 2."""
    files = {name: [value * tokens, value * tokens / 2, tokens] for name, (value, tokens) in scores.items()}
    return {"set": ranking.ranking_fingerprint(documents), "files": files, "read": read}


def test_common_scores_leave_out_every_file_any_candidate_read():
    # "cheat" read b.py and scores high on it; on the files neither read the honest head is better.
    honest = entry({"a.py": (0.5, 10), "b.py": (0.4, 10), "d.py": (0.5, 10)}, [])
    cheat = entry({"a.py": (0.4, 10), "b.py": (0.99, 10), "d.py": (0.4, 10)}, ["b.py"])
    scores, common = ranking.common_scores({"honest": honest, "cheat": cheat})
    assert common == ["a.py", "d.py"]
    assert {k: scores["honest"][k] for k in ("sum_min", "top1", "tokens")} == {
        "sum_min": 0.5,
        "top1": 0.25,
        "tokens": 20,
    }
    assert scores["honest"]["sum_min_ci"] == [0.5, 0.5]  # equal files: every resample gives 0.5
    assert scores["cheat"]["sum_min"] == pytest.approx(0.4)
    # Unknown reading (None) excludes nothing: with it alone, every file counts.
    unknown = dict(cheat, read=None)
    scores, common = ranking.common_scores({"unknown": unknown})
    assert common == ["a.py", "b.py", "d.py"] and scores["unknown"]["sum_min"] == pytest.approx(1.79 / 3)


@given(st.lists(st.tuples(st.floats(0, 1), st.integers(1, 50)), min_size=3, max_size=3), st.booleans())
def test_common_score_is_the_token_weighted_mean_over_the_common_files(values, read_one):
    names = ["a.py", "b.py", "d.py"]
    one = entry(dict(zip(names, values, strict=True)), ["a.py"] if read_one else [])
    scores, common = ranking.common_scores({"one": one})
    kept = values[1:] if read_one else values
    assert scores["one"]["sum_min"] == pytest.approx(sum(v * n for v, n in kept) / sum(n for _, n in kept))
    assert scores["one"]["tokens"] == sum(n for _, n in kept)


def test_scored_heads_rank_first_by_their_common_score_and_stale_or_missing_ones_follow(tmp_path):
    cards = {
        "old-unscored": None,
        "cheat": entry({"a.py": (0.4, 10), "b.py": (0.99, 10), "d.py": (0.4, 10)}, ["b.py"]),
        "honest": entry({"a.py": (0.5, 10), "b.py": (0.4, 10), "d.py": (0.5, 10)}, []),
        "stale-set": entry({"a.py": (0.9, 10)}, [], documents=DOCS[:1]),
    }
    paths = []
    for age, (name, value) in enumerate(cards.items()):
        (tmp_path / name).mkdir()
        card = tmp_path / name / "card.json"
        card.write_text(json.dumps({} if value is None else {"ranking": value}))
        os.utime(card, (1000 + age, 1000 + age))
        paths.append(tmp_path / name)
    order, table = ranking.rank_checkpoints(paths, documents=DOCS)
    assert [p.name for p in order] == ["honest", "cheat", "old-unscored", "stale-set"]
    assert table["files"] == ["a.py", "d.py"] and table["unscored"] == ["old-unscored", "stale-set"]


def test_the_ranking_files_a_directory_corpus_read_are_found_by_text(tmp_path):
    directory = tmp_path / "corpus"
    directory.mkdir()
    texts = {f"f{i}.py": f"text number {i}\n" * 3 for i in range(60)}
    texts["copy_of_b.py"] = DOCS[1][1]
    for name, text in texts.items():
        (directory / name).write_text(text)
    corpus = load_corpus(directory)
    encode = CharTokenizer().encode
    train_tokens = 512
    card = {
        "corpus": {"name": corpus.name, "fingerprint": corpus.fingerprint(), "train_tokens": train_tokens}
    }
    read = documents_read(corpus, encode, train_tokens)
    expected = ["b.py"] if "copy_of_b.py" in read else []
    assert ranking.ranking_files_read(card, encode, DOCS) == expected
    # Read everything: the copy (in the train split by its path hash) is found.
    everything = dict(card, corpus=dict(card["corpus"], train_tokens=10**6))
    assert any(doc == "copy_of_b.py" for doc, _ in corpus.train)
    assert ranking.ranking_files_read(everything, encode, DOCS) == ["b.py"]
    (directory / "f0.py").write_text("changed")  # the corpus changed since training: unknown
    assert ranking.ranking_files_read(card, encode, DOCS) is None
    assert ranking.ranking_files_read({"corpus": {"name": "stdlib-3.11"}}, encode, DOCS) == []
    assert ranking.ranking_files_read({}, encode, DOCS) is None  # no corpus named: unknown


def test_cached_checkpoints_put_the_head_better_on_unread_files_first(tmp_path, monkeypatch):
    from tests.tiny_models import build_tiny_model

    target = build_tiny_model(0, vocab_size=VOCAB, dim=32, n_heads=4, n_kv_heads=2, hidden_dim=64)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(ranking, "_ranking_documents", lambda: DOCS)
    prefix = f"feature-{model_fingerprint(target)['hash'][:12]}-"
    root = tmp_path / "specbound" / "drafters"
    cards = {
        # the card's own held-out figure prefers "cheat"; the common set prefers "honest"
        "cheat": {
            "held_out": {"sum_min": 0.9},
            "ranking": entry({"a.py": (0.4, 10), "b.py": (1, 10)}, ["b.py"]),
        },
        "honest": {
            "held_out": {"sum_min": 0.5},
            "ranking": entry({"a.py": (0.5, 10), "b.py": (0.3, 10)}, []),
        },
    }
    for name, card in cards.items():
        (root / (prefix + name)).mkdir(parents=True)
        (root / (prefix + name) / "card.json").write_text(json.dumps(card))
    assert [p.name.removeprefix(prefix) for p in cached_checkpoints(target, "feature")] == ["honest", "cheat"]
