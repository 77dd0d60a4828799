"""Keep glibc's malloc from handing every large numpy temporary back to the kernel while a shard is bounded.

Dask's nanny starts every worker with ``MALLOC_TRIM_THRESHOLD_=65536`` (``distributed.nanny.pre-spawn-environ``,
so that freed memory returns to the OS promptly). Setting that variable also freezes glibc's *mmap threshold*
at its 128 KiB default (``mallopt(3)``: an explicit threshold turns off the dynamic adjustment). Every numpy
array above 128 KiB is then a fresh ``mmap`` whose pages the kernel zero-fills on first touch and takes back
on ``free``. The top-k bounds allocate thousands of such temporaries per block of rows (the without-replacement
quadrature's grids, ``rows x (n - 1) x points``), so on a Dask worker a shard spent more CPU time in page
faults than in arithmetic. Measured on SmolLM2 top-20 rows, dust low: 1.4 M minor faults and 3.3 system
CPU-s beside 2.8 user CPU-s per 5 000 positions (docs/benchmarks/bound_logs.md, "The shard path").

:func:`retained_heap` raises the mmap threshold to 32 MiB and the trim threshold to 64 MiB (the values glibc's
own dynamic adjustment grows towards on 64-bit, ``DEFAULT_MMAP_THRESHOLD_MAX`` and twice it) for the duration
of a block, so the freed temporaries are reused from the heap. On leaving the outermost block it gives the free
memory back (``malloc_trim(0)``, which is what Dask's setting is for) and, when the process was started with
``MALLOC_TRIM_THRESHOLD_`` (or ``MALLOC_MMAP_THRESHOLD_``), restores those configured thresholds. A process
without them keeps the raised values (the dynamic ones it had cannot be restored; they tend to the same).
The thresholds only decide where memory comes from: no computed value depends on them. Elsewhere than glibc
(macOS, musl) the block does nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from contextlib import contextmanager

#: ``mallopt`` parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: glibc's default mmap and trim thresholds (128 KiB each), in force when an environment variable froze them.
GLIBC_DEFAULT_THRESHOLD = 128 << 10
#: Thresholds while a shard is bounded: glibc's dynamic maximum on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``)
#: and twice it, as the dynamic rule sets the trim threshold.
RETAINED_MMAP_THRESHOLD = 32 << 20
RETAINED_TRIM_THRESHOLD = 64 << 20

_lock = threading.Lock()
_depth = 0


def _glibc():
    """The C library's handle if it is glibc (``mallopt`` and ``malloc_trim`` usable), else ``None``."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.malloc_trim.argtypes = (ctypes.c_size_t,)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _glibc()


def _configured(name: str, default: int | None) -> int | None:
    """The threshold the process was started with (glibc reads ``NAME_`` at start), or ``default``."""
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


@contextmanager
def retained_heap():
    """Serve large temporaries from the heap inside the block (see the module docstring); re-entrant, threads too."""
    global _depth
    libc = _LIBC
    if libc is None:
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            libc.mallopt(M_MMAP_THRESHOLD, RETAINED_MMAP_THRESHOLD)
            libc.mallopt(M_TRIM_THRESHOLD, RETAINED_TRIM_THRESHOLD)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                trim = _configured("MALLOC_TRIM_THRESHOLD_", None)
                mmap = _configured("MALLOC_MMAP_THRESHOLD_", None)
                if trim is not None or mmap is not None:
                    libc.mallopt(M_MMAP_THRESHOLD, GLIBC_DEFAULT_THRESHOLD if mmap is None else mmap)
                    libc.mallopt(M_TRIM_THRESHOLD, GLIBC_DEFAULT_THRESHOLD if trim is None else trim)
                libc.malloc_trim(0)
