"""Atomic file writes: a temporary file in the same directory, then :func:`os.replace`.

A run that is interrupted never leaves a half-written result file behind (the runs of ``specbound validate``,
the benchmarks and training write through these).
"""

from __future__ import annotations

import json
import os
import tempfile

__all__ = ["write_json", "write_text"]


def write_text(text: str, path: str | os.PathLike) -> None:
    """Write ``text`` to ``path`` atomically: a temporary file in the same directory, then ``os.replace``."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def write_json(data, path: str | os.PathLike) -> None:
    """Write ``data`` as indented JSON atomically (see :func:`write_text`)."""
    write_text(json.dumps(data, indent=2), path)
