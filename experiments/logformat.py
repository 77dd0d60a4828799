"""Reading and writing distribution logs: full ``(N, V)`` logs and top-k logs (``docs/logformat.md``).

Full log (``.npz``): ``p``, ``q`` float arrays ``(N, V)`` (rows are distributions), optional ``n`` (scalar) and
``temperature`` (scalar or ``(N,)``). Top-k log (``.npz``): ``format = "specbound-topk/1"``, ``vocab_size``,
``p_ids``/``q_ids`` int ``(N, k_p)``/``(N, k_q)`` padded with ``-1``, ``p_logprobs``/``q_logprobs`` float of the
same shapes padded with ``-inf``, optional ``p_rest``/``q_rest`` ``(N,)`` (unlogged mass), ``temperature`` and
``entropy`` ``(N,)`` (the target's entropy in nats, when the logger knew the full distribution).

:class:`LogShard` streams a shard in row chunks straight from the zip members (stored or deflated), so memory
stays bounded by the chunk size whatever the shard size.
"""

from __future__ import annotations

import os
import threading
import zipfile
from dataclasses import dataclass

import numpy as np

TOPK_FORMAT = "specbound-topk/1"
TOPK_ARRAYS = ("p_ids", "p_logprobs", "q_ids", "q_logprobs")
#: Default bytes of one streamed chunk (all arrays of the chunk together).
CHUNK_BYTES = 32 << 20
#: Serialises ``.npy`` header parsing across threads. numpy parses a header with ``ast.literal_eval``, and
#: CPython 3.11 keeps the AST constructor's recursion count per interpreter, not per thread: two threads
#: reading headers at once (the workers of a threaded Dask cluster, ``bound --logs``) can fail with
#: ``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905; seen in this project's CI).
#: A header is a few hundred bytes, so the lock costs nothing measurable.
_HEADER_LOCK = threading.Lock()


class LogError(ValueError):
    """A log file that cannot be used (unreadable, wrong shapes, NaN, sums above 1, ...)."""


def entropy(p: np.ndarray) -> np.ndarray:
    """Shannon entropy in nats along the last axis."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(p > 0, p * np.log(p), 0.0).sum(axis=-1)


def top_k_arrays(p: np.ndarray, q: np.ndarray, k: int, k_draft: int | None = None) -> dict:
    """The top-k log arrays of full rows ``p``, ``q`` ``(N, V)``: ids by descending probability (ties by id)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    out = {}
    for side, rows, count in (("p", p, k), ("q", q, k if k_draft is None else k_draft)):
        count = min(count, rows.shape[-1])
        part = np.argpartition(-rows, count - 1, axis=-1)[:, :count] if count < rows.shape[-1] else None
        if part is None:
            part = np.broadcast_to(np.arange(rows.shape[-1]), rows.shape)
        values = np.take_along_axis(rows, part, axis=-1)
        order = np.lexsort((part, -values), axis=-1)
        ids = np.take_along_axis(part, order, axis=-1)
        kept = np.take_along_axis(values, order, axis=-1)
        with np.errstate(divide="ignore"):
            out[f"{side}_ids"] = ids.astype(np.int32)
            out[f"{side}_logprobs"] = np.log(kept).astype(np.float32)
        out[f"{side}_rest"] = np.clip(1.0 - kept.sum(axis=-1), 0.0, None)
    out["entropy"] = entropy(p)
    return out


def _atomic_savez(path: str | os.PathLike, arrays: dict) -> None:
    from executor.files import atomic_path  # here, not at the top: this module stays free of torch at import

    with atomic_path(path, suffix=".npz") as temporary:
        np.savez(temporary, **arrays)


def write_full_log(path, p, q, *, n: int | None = None, temperature=None) -> None:
    """Write a full log (arrays ``p``, ``q`` ``(N, V)``, optional ``n`` and ``temperature``) atomically."""
    arrays = {"p": np.asarray(p, dtype=np.float32), "q": np.asarray(q, dtype=np.float32)}
    if n is not None:
        arrays["n"] = np.int64(n)
    if temperature is not None:
        arrays["temperature"] = np.asarray(temperature, dtype=np.float64)
    _atomic_savez(path, arrays)


def write_topk_log(path, arrays: dict, vocab_size: int, *, temperature=None) -> None:
    """Write a top-k log atomically from :func:`top_k_arrays`-style ``arrays``."""
    missing = [name for name in TOPK_ARRAYS if name not in arrays]
    if missing:
        raise ValueError(f"arrays lacks {', '.join(missing)}")
    out = {"format": np.array(TOPK_FORMAT), "vocab_size": np.int64(vocab_size), **arrays}
    if temperature is not None:
        out["temperature"] = np.broadcast_to(np.asarray(temperature, np.float64), arrays["p_ids"].shape[:1])
    _atomic_savez(path, out)


class _MemberStream:
    """Row chunks of one ``.npy`` member of a zip archive, read sequentially (stored or deflated)."""

    def __init__(self, archive: zipfile.ZipFile, name: str):
        self.stream = archive.open(name + ".npy")
        with _HEADER_LOCK:
            version = np.lib.format.read_magic(self.stream)
            reader = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            self.shape, fortran, self.dtype = reader(self.stream)
        if fortran and len(self.shape) > 1:
            raise LogError(f"array {name!r} is stored in Fortran order; write C-ordered arrays")
        if self.dtype.hasobject:
            raise LogError(f"array {name!r} holds Python objects")
        self.row_items = int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1

    def read(self, rows: int) -> np.ndarray:
        count = rows * self.row_items
        data = self.stream.read(count * self.dtype.itemsize)
        if len(data) != count * self.dtype.itemsize:
            raise LogError("truncated archive member")
        return np.frombuffer(data, dtype=self.dtype).reshape((rows, *self.shape[1:]))


@dataclass
class LogShard:
    """One log file, opened lazily: ``kind`` is ``"full"`` or ``"topk"``; :meth:`chunks` streams its rows."""

    path: str
    kind: str
    rows: int
    vocab_size: int
    n: int | None
    row_bytes: int
    arrays: tuple[str, ...]
    scalars: dict

    @classmethod
    def open(cls, path: str | os.PathLike) -> LogShard:
        """Read the headers (and the scalars) of a log; ``LogError`` if it is not a usable log."""
        path = str(path)
        try:
            with zipfile.ZipFile(path) as archive:
                members = {
                    name[:-4]: _MemberStream(archive, name[:-4])
                    for name in archive.namelist()
                    if name.endswith(".npy")
                }
                shapes = {name: member.shape for name, member in members.items()}
                scalars = {name: member.read(1)[0] for name, member in members.items() if member.shape == ()}
                items = {name: member.row_items * member.dtype.itemsize for name, member in members.items()}
        except LogError:
            raise
        except (OSError, zipfile.BadZipFile, ValueError, EOFError, KeyError) as error:
            raise LogError(f"unreadable ({error})") from None
        if {"p", "q"} <= shapes.keys():
            kind, arrays = "full", ("p", "q")
            if len(shapes["p"]) != 2 or shapes["p"] != shapes["q"]:
                raise LogError(
                    f"p and q must be (N, V) arrays of one shape, got {shapes['p']} and {shapes['q']}"
                )
            rows, vocab = shapes["p"]
        elif set(TOPK_ARRAYS) <= shapes.keys():
            kind, arrays = "topk", TOPK_ARRAYS
            if str(scalars.get("format")) != TOPK_FORMAT:
                raise LogError(f"format must be {TOPK_FORMAT!r}, got {scalars.get('format')!r}")
            if "vocab_size" not in scalars:
                raise LogError("a top-k log needs the scalar vocab_size")
            vocab = int(scalars["vocab_size"])
            rows = shapes["p_ids"][0] if shapes["p_ids"] else 0
            for side in ("p", "q"):
                if len(shapes[f"{side}_ids"]) != 2 or shapes[f"{side}_ids"] != shapes[f"{side}_logprobs"]:
                    raise LogError(f"{side}_ids and {side}_logprobs must be (N, k) arrays of one shape")
                if shapes[f"{side}_ids"][0] != rows:
                    raise LogError("p_ids and q_ids must have the same number of rows")
        else:
            raise LogError(
                f"holds {sorted(shapes)}: neither a full log (p, q) nor a top-k log ({', '.join(TOPK_ARRAYS)})"
            )
        per_row = []
        for name in ("temperature", "entropy", "p_rest", "q_rest"):
            if name in shapes and shapes[name] not in ((), (rows,)):
                raise LogError(f"{name} must be a scalar or have shape ({rows},), got {shapes[name]}")
            if name in shapes and shapes[name] == (rows,):
                per_row.append(name)
        n = int(scalars["n"]) if "n" in scalars else None
        row_bytes = sum(items[name] for name in (*arrays, *per_row))
        kept = {
            name: float(scalars[name])
            for name in ("temperature", "entropy", "p_rest", "q_rest")
            if name in scalars
        }
        return cls(path, kind, int(rows), int(vocab), n, row_bytes, (*arrays, *per_row), kept)

    def chunks(self, max_bytes: int = CHUNK_BYTES):
        """Yield dicts of arrays for consecutive row blocks (float64 probabilities for full logs)."""
        block = max(1, max_bytes // max(self.row_bytes, 1))
        with zipfile.ZipFile(self.path) as archive:
            members = {name: _MemberStream(archive, name) for name in self.arrays}
            for start in range(0, self.rows, block):
                count = min(block, self.rows - start)
                chunk = {name: member.read(count) for name, member in members.items()}
                for name in ("temperature", "entropy", "p_rest", "q_rest"):
                    if name in self.scalars:
                        chunk[name] = np.full(count, self.scalars[name])
                yield start, chunk


def generation_distributions(results) -> tuple[np.ndarray, np.ndarray]:
    """Stack the full ``(p, q)`` rows of every drafted position of executor results (``log_distributions="full"``)."""
    ps, qs = [], []
    for result in results:
        for step in result.steps:
            log = step.distributions
            if log is None and not step.expanded:  # a step that drafted nothing (a lookup without a match)
                continue
            if log is None or log.kind != "full":
                raise ValueError(
                    "--log-out needs the executor's full distribution logs (log_distributions='full')"
                )
            ps.append(log.p.double().numpy())
            qs.append(log.q.double().numpy())
    if not ps:
        raise ValueError(
            "--log-out: the decoder drafted no position (the autoregressive decoder has nothing to log)"
        )
    p, q = np.concatenate(ps), np.concatenate(qs)
    return p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)


def write_generation_log(results, path, *, top_k: int | None = None, temperature=None) -> int:
    """Write the drafted positions of executor results as a full log, or a top-k log if ``top_k``; returns rows."""
    if top_k is not None and top_k < 1:
        raise ValueError(f"--log-top-k must be at least 1, got {top_k}")
    p, q = generation_distributions(results)
    if top_k is None:
        write_full_log(path, p, q, temperature=temperature)
    else:
        write_topk_log(path, top_k_arrays(p, q, top_k), p.shape[-1], temperature=temperature)
    return len(p)
