"""The target's features on a corpus, computed once and cached: what every trained head learns from.

One prefill of each ``chunk_length``-token chunk through the frozen target stores

* ``tokens`` ``(n, T)`` int64 -- the chunk;
* ``hidden`` ``(n, T, d)`` in bfloat16 (or float16) -- the target's final hidden state after each token, *before*
  the final norm (``Transformer.forward(..., return_hidden=True)``);
* ``topk_counts`` ``(V,)`` int64 -- how often each token is among the target's top ``topk`` predictions, for the
  reduced draft vocabulary.

No logits are stored: the target's distribution at position ``t`` is recomputed exactly from the cached hidden
state through the frozen final norm and LM head, :math:`p_t = \\mathrm{softmax}(W\\,\\mathrm{norm}(h_t))` (what
EAGLE's data generation stores too: Li et al., ICML 2024, arXiv 2401.15077, ``ge_data``), which costs one
matrix product instead of ``V`` floats per token on disk.

Shards of ``shard_chunks`` chunks are written atomically (``split-NNNNN.safetensors``); an interrupted run
resumes at the first missing shard, and ``manifest.json`` is written last. The cache directory is keyed by the
target's fingerprint, the corpus fingerprint and the settings (:func:`feature_cache_dir`). Chunking takes the
corpus in order, so a cache asked for more tokens starts with the same chunks as a smaller one: a shard whose
tokens equal a shard of a *sibling* cache (same target, corpus, chunk length and dtypes;
:func:`sibling_caches`) is copied from it instead of recomputed, so growing ``train_tokens`` only prefills the
new chunks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from executor.files import write_bytes
from executor.training.checkpoint import cache_root
from executor.training.corpus import tokenize_chunks

__all__ = [
    "FeatureSet",
    "build_features",
    "feature_cache_dir",
    "load_features",
    "prepare_features",
    "sibling_caches",
    "target_logits",
]

MANIFEST = "manifest.json"


def feature_cache_dir(fingerprint: dict, corpus_fingerprint: str, settings: dict) -> Path:
    key = json.dumps(
        {"target": fingerprint["hash"], "corpus": corpus_fingerprint, **settings}, sort_keys=True
    )
    return cache_root() / "features" / hashlib.sha256(key.encode()).hexdigest()[:16]


def target_logits(target, hidden: torch.Tensor, vocab: torch.Tensor | None = None) -> torch.Tensor:
    """The target's logits from its pre-norm final hidden states, optionally only at the ``vocab`` rows."""
    weight = target.tok_embeddings.weight if target.output is None else target.output.weight
    if vocab is not None:
        weight = weight[vocab]
    normed = target.norm(hidden.to(weight.dtype))
    return torch.nn.functional.linear(normed, weight).float()


@dataclass
class FeatureSet:
    """Cached features of one split, in memory: ``tokens (n, T)``, ``hidden (n, T, d)``, ``topk_counts (V,)``."""

    tokens: torch.Tensor
    hidden: torch.Tensor
    topk_counts: torch.Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]


def _shard_path(directory: Path, split: str, index: int) -> Path:
    return directory / f"{split}-{index:05d}.safetensors"


def _reuse_shard(path: Path, part: list[list[int]], reuse: list[Path]) -> bool:
    """Copy the shard of the same name from a ``reuse`` directory whose tokens equal ``part``; ``True`` if done."""
    from safetensors import safe_open

    expected = torch.tensor(part, dtype=torch.int64)
    for directory in reuse:
        source = directory / path.name
        if not source.is_file():
            continue
        with safe_open(str(source), framework="pt") as handle:
            if "tokens" not in handle.keys() or not torch.equal(handle.get_tensor("tokens"), expected):
                continue
        write_bytes(source.read_bytes(), path)
        return True
    return False


def sibling_caches(directory: Path, info: dict) -> list[Path]:
    """Finished feature caches next to ``directory`` whose ``corpus.json`` matches ``info`` on the target, the
    corpus fingerprint, the chunk length and both dtypes (their shards are candidates for reuse)."""
    keys = ("target", "corpus_fingerprint", "chunk_length", "storage_dtype", "target_dtype")
    found = []
    for other in sorted(Path(directory).parent.glob("*/corpus.json")):
        if other.parent == Path(directory) or not (other.parent / MANIFEST).is_file():
            continue
        try:
            theirs = json.loads(other.read_text())
        except (OSError, ValueError):
            continue
        if all(theirs.get(key) == info.get(key) for key in keys):
            found.append(other.parent)
    return found


def build_features(
    target,
    splits: dict[str, list[list[int]]],
    directory: str | Path,
    *,
    storage_dtype: torch.dtype = torch.bfloat16,
    shard_chunks: int = 16,
    batch_size: int = 4,
    topk: int = 8,
    progress: bool = True,
    reuse: list[Path] = (),
) -> Path:
    """Prefill every chunk of every split through ``target`` and write the shards (skipping existing ones).

    ``splits`` maps a split name (``"train"``, ``"held_out"``) to its chunks, all of one length ``T``.
    Returns ``directory``. Resumable: shards already on disk are complete (atomic writes) and not recomputed.
    A shard found in one of the ``reuse`` directories under the same name and with the same tokens is copied
    (the caller guarantees they were built by the same target with the same settings).
    """
    from safetensors.torch import save
    from tqdm import tqdm

    if storage_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"storage_dtype must be bfloat16, float16 or float32, got {storage_dtype!r}")
    directory = Path(directory)
    if (directory / MANIFEST).is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    lengths = {len(chunk) for chunks in splits.values() for chunk in chunks}
    if len(lengths) != 1:
        raise ValueError(f"every chunk must have one length; got lengths {sorted(lengths)}")
    length = lengths.pop()
    device = target.tok_embeddings.weight.device
    total = sum(len(chunks) for chunks in splits.values())
    manifest = {"chunk_length": length, "storage_dtype": str(storage_dtype), "splits": {}}
    with tqdm(total=total * length, unit="tok", desc="target features", disable=not progress) as bar:
        for split, chunks in splits.items():
            shards = (len(chunks) + shard_chunks - 1) // shard_chunks
            manifest["splits"][split] = {"chunks": len(chunks), "shards": shards}
            for index in range(shards):
                part = chunks[index * shard_chunks : (index + 1) * shard_chunks]
                path = _shard_path(directory, split, index)
                if path.is_file() or _reuse_shard(path, part, list(reuse)):
                    bar.update(len(part) * length)
                    continue
                hidden_rows = []
                counts = torch.zeros(target.config.vocab_size, dtype=torch.int64)
                with torch.no_grad():
                    for start in range(0, len(part), batch_size):
                        batch = torch.tensor(part[start : start + batch_size], device=device)
                        target.setup_cache(length, batch_size=batch.shape[0])
                        logits, hidden = target(
                            batch, torch.arange(length, device=device), return_hidden=True
                        )
                        top = logits.topk(topk, dim=-1).indices.reshape(-1).cpu()
                        counts += torch.bincount(top, minlength=counts.numel())
                        hidden_rows.append(hidden.to("cpu", storage_dtype))
                        bar.update(batch.numel())
                tensors = {
                    "tokens": torch.tensor(part, dtype=torch.int64),
                    "hidden": torch.cat(hidden_rows).contiguous(),
                    "topk_counts": counts,
                }
                write_bytes(save(tensors), path)
    write_bytes(json.dumps(manifest, indent=2).encode(), directory / MANIFEST)
    return directory


def load_features(directory: str | Path, split: str) -> FeatureSet:
    """All shards of ``split`` from a finished cache directory, concatenated in memory."""
    from safetensors.torch import load_file

    directory = Path(directory)
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        raise ValueError(f"feature cache {str(directory)!r} is incomplete (no {MANIFEST}); build it first")
    manifest = json.loads(manifest_path.read_text())
    if split not in manifest["splits"]:
        raise ValueError(f"feature cache {str(directory)!r} has no split {split!r}")
    parts = [
        load_file(str(_shard_path(directory, split, i))) for i in range(manifest["splits"][split]["shards"])
    ]
    return FeatureSet(
        tokens=torch.cat([p["tokens"] for p in parts]),
        hidden=torch.cat([p["hidden"] for p in parts]),
        topk_counts=sum(p["topk_counts"] for p in parts),
    )


def prepare_features(
    target,
    tokenizer,
    corpus=None,
    *,
    chunk_length: int = 512,
    train_tokens: int = 65_536,
    held_out_tokens: int = 8_192,
    storage_dtype: torch.dtype = torch.bfloat16,
    progress: bool = True,
) -> Path:
    """Tokenize ``corpus`` (default: the standard library), then build (or reuse) its feature cache.

    Returns the cache directory (under ``$XDG_CACHE_HOME/specbound/features/``), keyed by the target, the
    corpus contents and these settings, so a second call with the same arguments only reads it.
    """
    from executor.training.checkpoint import model_fingerprint
    from executor.training.corpus import Corpus, load_corpus

    corpus = corpus if isinstance(corpus, Corpus) else load_corpus(corpus)
    settings = {
        "chunk_length": chunk_length,
        "train_tokens": train_tokens,
        "held_out_tokens": held_out_tokens,
        "storage_dtype": str(storage_dtype),
        "target_dtype": str(target.tok_embeddings.weight.dtype),
    }
    directory = feature_cache_dir(model_fingerprint(target), corpus.fingerprint(), settings)
    if (directory / MANIFEST).is_file():
        return directory
    eos = getattr(tokenizer, "eos_id", None)
    splits = {
        "train": tokenize_chunks(corpus.train, tokenizer.encode, eos, chunk_length, train_tokens),
        "held_out": tokenize_chunks(corpus.held_out, tokenizer.encode, eos, chunk_length, held_out_tokens),
    }
    for split, chunks in splits.items():
        if not chunks:
            raise ValueError(f"corpus {corpus.name!r} has fewer than {chunk_length} {split} tokens")
    info = {
        "corpus": corpus.name,
        "corpus_fingerprint": corpus.fingerprint(),
        "target": model_fingerprint(target)["hash"],
        **settings,
    }
    reuse = sibling_caches(directory, info)
    build_features(target, splits, directory, storage_dtype=storage_dtype, progress=progress, reuse=reuse)
    write_bytes(json.dumps(info, indent=2).encode(), directory / "corpus.json")
    return directory
