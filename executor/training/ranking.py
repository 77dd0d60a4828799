"""One yardstick for the cached heads: per-file scores on a common ranking set, compared on unread files.

A card's ``held_out`` figure is measured on its *own* corpus's held-out split, and only on its first 8,192
tokens, i.e. a handful of files in hash order. Two heads trained on different corpora are therefore scored on
different files, and even one head's figure says little: the 800-step standard-library head's card says
Σmin 0.590, while on 683 standard-library files it never read it scores 0.399 (docs/drafters.md).

The **ranking set** is the default corpus's held-out split (the standard-library files whose path hash puts
them there, :func:`executor.training.corpus.is_held_out`), each file's first :data:`TOKENS_PER_FILE` tokens
(the file, then the end-of-text token) cut into whole :data:`WINDOW`-token windows, so every file weighs about the
same and no window mixes two files; files shorter than one window are left out. Each head is scored on it once
per file: the sums of Σ_v min(p_v, q_v) and of [argmax q = argmax p] at T = 1 on the first drafted position,
teacher-forced on the target's exact features (what the card's ``held_out`` measures), stored in the card under
``ranking`` with the ranking files its training read.

Cached heads are then ranked (:func:`rank_checkpoints`) by Σmin over the files that *none* of the candidates
read: a paired comparison on common, unseen text. A corpus that holds a ranking file can only be told apart by
its text, so :func:`ranking_files_read` compares texts; for a corpus that is no longer on disk (or changed since
training) what was read is unknown and the card says ``null``.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from executor.files import write_bytes
from executor.training.checkpoint import CARD_NAME, model_fingerprint

__all__ = [
    "RANKED_KINDS",
    "TOKENS_PER_FILE",
    "WINDOW",
    "common_scores",
    "rank_checkpoints",
    "ranking_chunks",
    "ranking_features",
    "ranking_files_read",
    "ranking_fingerprint",
    "score_checkpoint",
]

#: Tokens taken from the start of each ranking file, and the window length they are cut into.
TOKENS_PER_FILE = 1024
WINDOW = 512
#: Drafter kinds scored on the ranking set (the heads that read the target's final features).
RANKED_KINDS = ("feature", "falcon")


@functools.lru_cache(maxsize=1)
def _ranking_documents() -> list[tuple[str, str]]:
    """The default corpus's held-out split, read once per process (every ranking needs its fingerprint)."""
    from executor.training.corpus import default_corpus

    return default_corpus().held_out


def ranking_fingerprint(documents=None) -> str:
    """sha256 over the ranking files (ids and texts) and the windowing settings."""
    documents = _ranking_documents() if documents is None else documents
    digest = hashlib.sha256(json.dumps({"window": WINDOW, "per_file": TOKENS_PER_FILE}).encode())
    for doc_id, text in documents:
        digest.update(doc_id.encode("utf-8") + b"\0" + text.encode("utf-8") + b"\0")
    return digest.hexdigest()


def ranking_chunks(encode, eos_id: int | None, documents=None) -> tuple[list[list[int]], list[str]]:
    """The ranking windows and, for each, the id of the file it comes from."""
    documents = _ranking_documents() if documents is None else documents
    chunks, files = [], []
    for doc_id, text in documents:
        tokens = (encode(text) + ([eos_id] if eos_id is not None else []))[:TOKENS_PER_FILE]
        for start in range(0, len(tokens) - WINDOW + 1, WINDOW):
            chunks.append(tokens[start : start + WINDOW])
            files.append(doc_id)
    if not chunks:
        raise ValueError(f"the ranking set has no file of {WINDOW} tokens or more")
    return chunks, files


def ranking_features(target, tokenizer, documents=None, progress: bool = True):
    """``(FeatureSet, file id per window)`` of the ranking set for ``target``, prefilled once and cached."""
    from executor.training.features import build_features, feature_cache_dir, load_features

    documents = _ranking_documents() if documents is None else documents
    chunks, files = ranking_chunks(tokenizer.encode, getattr(tokenizer, "eos_id", None), documents)
    settings = {"ranking": True, "target_dtype": str(target.tok_embeddings.weight.dtype)}
    directory = feature_cache_dir(model_fingerprint(target), ranking_fingerprint(documents), settings)
    build_features(target, {"held_out": chunks}, directory, progress=progress)
    return load_features(directory, "held_out"), files


def ranking_files_read(card: dict, encode, documents=None) -> list[str] | None:
    """The ranking files the head's training read, by text; ``None`` when its corpus cannot be re-read.

    A run reads its train split in the corpus's order until it holds ``train_tokens`` (each document followed by
    one end-of-text token); the default corpus never holds a ranking file in its train split.
    """
    from executor.training.corpus import documents_read, load_corpus

    documents = _ranking_documents() if documents is None else documents
    corpus_card = card.get("corpus", {})
    name = corpus_card.get("name", "")
    if name.startswith("stdlib-"):
        return []
    if not name:  # no corpus on the card (load_corpus("") would read the working directory)
        return None
    try:
        corpus = load_corpus(name)
    except ValueError:
        return None
    if corpus.fingerprint() != corpus_card.get("fingerprint"):
        return None
    texts = dict(corpus.train)
    read = {texts[doc] for doc in documents_read(corpus, encode, int(corpus_card.get("train_tokens", 0)))}
    return sorted(doc_id for doc_id, text in documents if text in read)


def _head(path: Path, target, kind: str):
    from executor.drafters.falcon import FalconDrafter
    from executor.drafters.feature import FeatureDrafter

    drafter_class = FalconDrafter if kind == "falcon" else FeatureDrafter
    return drafter_class.from_checkpoint(target, path).head.float().eval()


def _window_sums(head, kind: str, target, features, index: int) -> dict:
    from executor.training.features import FeatureSet

    if kind == "falcon":
        from executor.training.falcon import evaluate_falcon_head

        window = FeatureSet(features.tokens[index : index + 1], features.hidden[index : index + 1], None)
        first = evaluate_falcon_head(head, target, window)["token1"]
        return {key: first[key] * first["tokens"] for key in ("sum_min", "top1")} | {
            "tokens": first["tokens"]
        }
    from executor.training.trainer import chunk_agreement

    return chunk_agreement(head, target, features, index)


def score_checkpoint(path, target, tokenizer, documents=None, progress: bool = True) -> dict:
    """Score the head at ``path`` on the ranking set and store the result in its card (``ranking``); a card
    already scored on the current ranking set is returned as it is (each head is scored once).

    Returns the entry ``{"set": fingerprint, "files": {file: [Σ sum_min, Σ top1, tokens]}, "read": [...] | None}``.
    """
    from tqdm import tqdm

    path = Path(path)
    card = json.loads((path / CARD_NAME).read_text())
    documents = _ranking_documents() if documents is None else documents
    current = ranking_fingerprint(documents)
    if isinstance(card.get("ranking"), dict) and card["ranking"].get("set") == current:
        return card["ranking"]
    kind = card.get("kind")
    if kind not in RANKED_KINDS:
        raise ValueError(
            f"checkpoint {str(path)!r} is a {kind!r} head; the ranking set scores {RANKED_KINDS}"
        )
    features, files = ranking_features(target, tokenizer, documents, progress=progress)
    head = _head(path, target, kind)
    per_file: dict[str, list[float]] = {}
    with torch.no_grad():
        for index in tqdm(range(len(files)), desc=f"ranking {path.name}", disable=not progress):
            sums = _window_sums(head, kind, target, features, index)
            totals = per_file.setdefault(files[index], [0.0, 0.0, 0])
            totals[0] += sums["sum_min"]
            totals[1] += sums["top1"]
            totals[2] += int(sums["tokens"])
    entry = {
        "set": current,
        "files": per_file,
        "read": ranking_files_read(card, tokenizer.encode, documents),
    }
    card["ranking"] = entry
    write_bytes(json.dumps(card, indent=2, sort_keys=True).encode(), path / CARD_NAME)
    return entry


def common_scores(entries: dict[str, dict]) -> tuple[dict[str, dict], list[str]]:
    """Σmin and top-1 of each entry over the files none of them read, and those files.

    ``sum_min_ci`` is a 95% bootstrap interval over the files (2,000 resamples, seed 0): windows of one file are
    correlated, so the file is the unit.

    ``entries`` maps a name to a card's ``ranking`` entry (all of one ranking set); an entry whose ``read`` is
    ``None`` excludes nothing (what it read is unknown).
    """
    files = set.intersection(*(set(entry["files"]) for entry in entries.values())) if entries else set()
    for entry in entries.values():
        files -= set(entry["read"] or [])
    common = sorted(files)
    resample = np.random.default_rng(0).integers(0, max(len(common), 1), size=(2000, len(common)))
    scores = {}
    for name, entry in entries.items():
        rows = np.array([entry["files"][f] for f in common], dtype=np.float64).reshape(-1, 3)
        sum_min, top1, tokens = rows.sum(0)
        interval = [float("nan")] * 2
        if tokens:
            sums, counts = rows[resample, 0].sum(-1), rows[resample, 2].sum(-1)
            interval = np.percentile(sums / np.maximum(counts, 1), [2.5, 97.5]).tolist()
        scores[name] = {
            "sum_min": sum_min / tokens if tokens else float("nan"),
            "sum_min_ci": interval,
            "top1": top1 / tokens if tokens else float("nan"),
            "tokens": int(tokens),
        }
    return scores, common


def rank_checkpoints(paths: list[Path], documents=None) -> tuple[list[Path], dict]:
    """``paths`` best first: heads scored on the current ranking set first, by Σmin on the files none of
    them read (ties: the most recently written), then the others in their given order.

    Returns the order and ``{"scores": {name: ...}, "files": [common files], "unscored": [names]}``.
    """
    current = ranking_fingerprint(documents)
    entries, unscored = {}, []
    for path in paths:
        try:
            entry = json.loads((Path(path) / CARD_NAME).read_text()).get("ranking")
        except (OSError, ValueError):
            entry = None
        if isinstance(entry, dict) and entry.get("set") == current:
            entries[Path(path)] = entry
        else:
            unscored.append(Path(path))
    scores, common = common_scores({path.name: entry for path, entry in entries.items()})
    scored = sorted(
        entries,
        key=lambda p: (
            scores[p.name]["sum_min"] if scores[p.name]["tokens"] else -1.0,
            (p / CARD_NAME).stat().st_mtime,
        ),
        reverse=True,
    )
    return scored + unscored, {"scores": scores, "files": common, "unscored": [p.name for p in unscored]}
