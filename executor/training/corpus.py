"""Training text for drafters: the running interpreter's standard library, or a user's files, split by file.

**Default corpus.** Every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]``, excluding test code (any path
component named ``test``, ``tests``, ``idle_test`` or starting with ``test_``) and ``site-packages``. Any
machine with Python has it, it is code (the validation prompts are code), and nobody here chose it.

**Split rule (fixed, documented).** A file is *held out* iff the first 8 bytes of
``sha256(relative path, UTF-8)``, read as a big-endian integer, are ``0 mod 20`` (about 5% of files); all other
files are *train*. The rule depends only on the path, so it is the same on every machine and for every target.
Files are visited in the order of that hash, so capping the token count takes a reproducible pseudo-random
subset of files rather than the alphabetically first ones.

**User corpus** (``--corpus PATH``): a directory (every regular file that decodes as UTF-8, recursively, same
split rule on the path relative to the directory) or a ``.jsonl`` file whose lines are JSON strings or objects
with a ``"text"`` field (split rule on the line number written as a string).

HumanEval prompts are evaluation data only: nothing here reads them.

Chunks are consecutive windows of ``chunk_length`` tokens of the concatenated files (each file followed by the
end-of-sequence token), so every position of a chunk has a real left context inside the chunk.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Corpus",
    "default_corpus",
    "documents_read",
    "is_held_out",
    "is_test_path",
    "load_corpus",
    "tokenize_chunks",
]

HELD_OUT_MODULUS = 20
_TEST_PARTS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


def is_held_out(relative_path: str) -> bool:
    """The split rule: ``int(sha256(path)[:8]) % 20 == 0`` means held out."""
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % HELD_OUT_MODULUS == 0


def _order_key(relative_path: str) -> bytes:
    return hashlib.sha256(b"order:" + relative_path.encode("utf-8")).digest()


@dataclass(frozen=True)
class Corpus:
    """Named documents split into train and held-out.

    ``name`` identifies the corpus in checkpoint cards (``"stdlib-3.11"`` or the resolved path);
    ``train``/``held_out`` are lists of ``(document id, text)`` in the fixed hash order.
    """

    name: str
    train: list[tuple[str, str]]
    held_out: list[tuple[str, str]]

    def fingerprint(self) -> str:
        """sha256 over the document ids and texts (changes when any file changes)."""
        digest = hashlib.sha256()
        for split in (self.train, self.held_out):
            for doc_id, text in split:
                digest.update(doc_id.encode("utf-8") + b"\0" + text.encode("utf-8") + b"\0")
        return digest.hexdigest()


def _split(documents: list[tuple[str, str]], name: str) -> Corpus:
    documents = sorted(documents, key=lambda doc: _order_key(doc[0]))
    train = [doc for doc in documents if not is_held_out(doc[0])]
    held_out = [doc for doc in documents if is_held_out(doc[0])]
    if not train or not held_out:
        raise ValueError(
            f"corpus {name!r} needs documents in both splits (held out = 1 in {HELD_OUT_MODULUS} by path "
            f"hash); it has {len(train)} train and {len(held_out)} held-out documents"
        )
    return Corpus(name, train, held_out)


def is_test_path(relative: Path) -> bool:
    """Whether the default corpus leaves out a path relative to its root: test code (a part named ``test``,
    ``tests``, ``idle_test`` or starting with ``test_``), caches and anything under ``site-packages``."""
    return any(part in _TEST_PARTS or part.startswith("test_") for part in relative.parts)


def default_corpus() -> Corpus:
    """The interpreter's standard library, tests excluded, split by :func:`is_held_out`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    documents = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if is_test_path(relative) or not path.is_file():
            continue
        try:
            documents.append((relative.as_posix(), path.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    version = sysconfig.get_python_version()
    return _split(documents, f"stdlib-{version}")


def load_corpus(path: str | Path | None = None) -> Corpus:
    """:func:`default_corpus` for ``None``; else a directory of text files or a JSONL file of texts."""
    if path is None:
        return default_corpus()
    path = Path(path)
    if not path.exists():
        raise ValueError(f"corpus {str(path)!r} does not exist (give a directory or a .jsonl file)")
    documents = []
    if path.is_dir():
        for file in sorted(path.rglob("*")):
            if not file.is_file() or "__pycache__" in file.parts:
                continue
            try:
                documents.append((file.relative_to(path).as_posix(), file.read_text(encoding="utf-8")))
            except (UnicodeDecodeError, OSError):
                continue
    elif path.suffix == ".jsonl":
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"corpus {str(path)!r} line {number + 1} is not JSON: {error}") from None
            text = item.get("text") if isinstance(item, dict) else item
            if not isinstance(text, str):
                raise ValueError(
                    f"corpus {str(path)!r} line {number + 1} must be a JSON string or an object with 'text'"
                )
            documents.append((str(number), text))
    else:
        raise ValueError(f"corpus {str(path)!r} must be a directory or a .jsonl file")
    if not documents:
        raise ValueError(f"corpus {str(path)!r} holds no UTF-8 text")
    return _split(documents, str(path.resolve()))


def tokenize_chunks(
    documents: list[tuple[str, str]], encode, eos_id: int | None, chunk_length: int, max_tokens: int
) -> list[list[int]]:
    """Windows of ``chunk_length`` tokens over the documents (each followed by ``eos_id``), at most
    ``max_tokens`` tokens in all; the incomplete last window is dropped."""
    if chunk_length < 2:
        raise ValueError(f"chunk_length must be at least 2, got {chunk_length}")
    chunks: list[list[int]] = []
    buffer: list[int] = []
    limit = max_tokens // chunk_length
    for _, text in documents:
        if len(chunks) >= limit:
            break
        buffer += encode(text) + ([eos_id] if eos_id is not None else [])
        while len(buffer) >= chunk_length and len(chunks) < limit:
            chunks.append(buffer[:chunk_length])
            buffer = buffer[chunk_length:]
    return chunks


def documents_read(corpus: Corpus, encode, train_tokens: int) -> set[str]:
    """The ids of the train documents a run read to fill ``train_tokens`` (:func:`tokenize_chunks` takes them
    in order, each followed by one end-of-text token, and stops once it holds that many tokens; exact when
    ``train_tokens`` is a multiple of the chunk length, as the ``train_tokens`` a card records always is)."""
    read, total = set(), 0
    for doc_id, text in corpus.train:
        if total >= train_tokens:
            break
        read.add(doc_id)
        total += len(encode(text)) + 1
    return read
