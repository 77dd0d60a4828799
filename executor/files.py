"""Atomic file writes: a temporary file in the same directory, then :func:`os.replace`.

A run that is interrupted never leaves a half-written file behind: the runs of ``specbound validate``, the
benchmarks, the logs, the plots and training all write through :func:`atomic_path` (or its helpers). The file
gets the mode of an ordinary new file, ``0o666`` less the process's umask, not the private ``0o600`` that
:func:`tempfile.mkstemp` gives its temporaries: results and caches are as readable as the umask allows.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "write_bytes", "write_json", "write_text"]


def _new_file_mode() -> int:
    # The umask can only be read by setting it; done once, at import, before any thread of ours runs.
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


NEW_FILE_MODE = _new_file_mode()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, suffix: str = ".tmp", durable: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary path next to ``path``; when the block ends normally it replaces ``path``.

    The parent directory is created. ``suffix`` ends the temporary's name (writers that infer a format from
    it: ``".npz"`` for :func:`numpy.savez`, ``".png"`` for matplotlib). ``durable``: flush the file to disk
    before the rename (caches that a crash must not leave empty). On an exception the temporary is removed
    and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        os.chmod(temporary, NEW_FILE_MODE)
        if durable:
            descriptor = os.open(temporary, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_bytes(data: bytes, path: str | os.PathLike, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` atomically, flushed to disk before the rename unless ``durable=False``."""
    with atomic_path(path, durable=durable) as temporary:
        temporary.write_bytes(data)


def write_text(text: str, path: str | os.PathLike) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as temporary:
        temporary.write_text(text, encoding="utf-8")


def write_json(data, path: str | os.PathLike, *, indent: int | None = 2) -> None:
    """Write ``data`` as JSON (indented unless ``indent=None``) to ``path`` atomically."""
    write_text(json.dumps(data, indent=indent), path)
