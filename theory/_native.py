"""The theory's hot loops in C++ (``theory/csrc``), built on first use with the machine's C++ compiler.

Five functions, each the twin of a numpy function that stays its specification and the oracle of its tests
(``tests/theory/test_native.py``):

* :func:`race_fit` -- :func:`theory._race.fit_log_weights`. A class of the optimal verifier's build has a few
  dozen units and ~100 quadrature nodes: one numpy evaluation of the race marginal and its Jacobian costs
  ~100 us, nearly all of it numpy's per-call cost, and the Newton loop around it as much again. The C++ runs
  the same loop on the same formulas (IEEE double, no fast-math) in one call; every case it does not take (a
  singular Newton system, log-weights wider than the clocks' direct form) goes back to numpy.
* :func:`bucketed` -- :func:`theory._buckets.bucketed`: ~70 numpy calls, most on a few hundred buckets, and
  eight passes over the vocabulary, as single loops; the items are bitwise numpy's.
* :func:`class_units` -- :func:`theory.optimal_verifier._class_units`: the units of a large class and their
  targets (~30 numpy calls). The partition is numpy's but where numpy's SIMD ``log`` or an unstable sort moves a
  unit boundary by an item (6 of 1,019 classes of logged pairs); exactness never depends on the units.
* :func:`build_items` -- :func:`theory.optimal_verifier._build_items_in_numpy` with its first unit fit: the ~100
  numpy calls around the three functions above and the token marginal's passes over the vocabulary, in one call
  that runs them directly. Its tables are numpy's to round-off (the C library's ``pow`` for numpy's); rows it
  does not finish (a refused fit, a first fit short of alpha* that numpy retries) go back to numpy.
* :func:`build_row` -- :func:`theory.optimal_verifier._build_row`'s grouped path: the draft's support, the row cut
  to it or its absent tokens listed, :func:`bucketed` and :func:`build_items`, and r and the token-to-item map
  scattered over the vocabulary, in one call; bitwise the tables of the two calls made from Python.

:func:`exp` exposes the fit's vectorised ``exp`` (eight lanes, within 1 ulp of the C library's) to its test.

The library is compiled once per source, compiler and machine (``c++ -O3 -march=native``, the sources side by
side, 5-10 s) into ``$XDG_CACHE_HOME/specbound/native/`` and loaded with :mod:`ctypes`, so ``theory`` needs
neither torch nor a build step at install. Before first use it must reproduce numpy on a probe of each
function; where there is no compiler, the build fails or a probe disagrees, one line on stderr says so and
numpy runs.
``SPECBOUND_NATIVE=0`` in the environment (read at import; :func:`enabled` in a running process) turns it off,
as it does the executor's native products.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

__all__ = [
    "NO_ROOM",
    "available",
    "bucketed",
    "build_items",
    "build_row",
    "class_units",
    "cpuinfo",
    "enabled",
    "exp",
    "race_fit",
]

_CSRC = Path(__file__).with_name("csrc")
SOURCES = tuple(_CSRC / name for name in ("race_fit.cpp", "buckets.cpp", "units.cpp", "build.cpp"))
HEADERS = (_CSRC / "numerics.h",)
#: No ``-ffast-math``: the marginal must be the exact one of the weights returned, to IEEE round-off.
#: ``-ffp-contract=off``: GCC fuses ``a * b + c`` into one rounding by default (even with ``-std=c++17``), which
#: numpy never does; fused, a nearly tight prefix's gap fell on the other side of TIGHT on a logged pair.
#: ``-march=native`` (the Hessian's products in AVX-512 where the CPU has it): the cache key holds the CPU's flags.
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-std=c++17", "-shared", "-fPIC")
#: Where the compiler refuses ``-march=native``.
PORTABLE_FLAGS = tuple(flag for flag in FLAGS if flag != "-march=native")

_ENABLED = os.environ.get("SPECBOUND_NATIVE", "1") != "0"
_LIBRARY = None  # the loaded library; False where it is not offered (tried once)
_LOCK = threading.Lock()


@contextlib.contextmanager
def enabled(flag: bool):
    """Context in which the native code is on (``True``) or off; the previous setting is restored on exit."""
    global _ENABLED
    previous, _ENABLED = _ENABLED, bool(flag)
    try:
        yield
    finally:
        _ENABLED = previous


def available() -> bool:
    """Whether the native functions run here (switched on, built and probed; tried once)."""
    return _active() is not None


def _active():
    """The library where the native code is switched on and offered, else ``None``."""
    return _library() if _ENABLED else None


def race_fit(lower: float, masses: np.ndarray, target: np.ndarray, n: int, constants: dict):
    """``(log_weights, r)`` of the native fit, or ``None`` where the numpy fit must run.

    Arguments as :func:`theory._race.fit_log_weights` (at least two units); ``constants`` holds the fit's
    constants by their names in :mod:`theory._race` (one source for both implementations).
    """
    library = _active()
    return (
        None
        if library is None
        else _fit_with(library.specbound_race_fit, lower, masses, target, n, constants)
    )


def _fit_with(function, lower, masses, target, n, constants):
    masses = np.ascontiguousarray(masses, dtype=np.float64)
    target = np.ascontiguousarray(target, dtype=np.float64)
    log_weights, r = np.empty_like(masses), np.empty_like(masses)
    status = function(
        lower,
        masses.ctypes.data,
        target.ctypes.data,
        masses.shape[0],
        n,
        constants["STEP"],
        constants["LOW"],
        constants["HIGH"],
        constants["TAIL_LOW"],
        constants["WIDE"],
        constants["FLOOR"],
        constants["MAX_STEP"],
        constants["TOLERANCE"],
        constants["MAX_ITERATIONS"],
        constants["MAX_HALVINGS"],
        log_weights.ctypes.data,
        r.ctypes.data,
    )
    return (log_weights, r) if status == 0 else None


def bucketed(ps, qs, n: int, group_below: float, tight: float, absent, constants: dict):
    """The arrays of :func:`theory._buckets.bucketed`'s items ``(p, q, low, high, single, count, item)``, or
    ``None`` where the numpy function must run. ``constants``: its module constants by name."""
    library = _active()
    if library is None:
        return None
    return _bucketed_with(library.specbound_bucketed, ps, qs, n, group_below, tight, absent, constants)


_OUTPUTS = threading.local()


def _bucketed_with(function, ps, qs, n, group_below, tight, absent, constants):
    size = ps.shape[0]
    # The per-item outputs land in buffers kept per thread (a fresh vocabulary-sized array costs ~100 page
    # faults) and leave as copies of their first `items` entries; the token map is the build's own array.
    buffers = getattr(_OUTPUTS, "buffers", None)
    if buffers is None or buffers[0].shape[0] < size:
        buffers = tuple(np.empty(size) for _ in range(4)) + (
            np.empty(size, np.uint8),
            np.empty(size, np.int64),
        )
        _OUTPUTS.buffers = buffers
    item = np.empty(size, dtype=np.int64)
    absent = np.zeros(0, dtype=np.int64) if absent is None else np.ascontiguousarray(absent, dtype=np.int64)
    # Named, so that a contiguous copy lives until the call returns (a pointer alone does not keep it).
    ps, qs = np.ascontiguousarray(ps, dtype=np.float64), np.ascontiguousarray(qs, dtype=np.float64)
    items = function(
        ps.ctypes.data,
        qs.ctypes.data,
        size,
        n,
        group_below,
        tight,
        constants["MARGIN"],
        absent.ctypes.data,
        absent.shape[0],
        constants["SHIFT"],
        constants["FINE_BITS"] - constants["COARSE_BITS"],
        *(buffer.ctypes.data for buffer in buffers),
        item.ctypes.data,
    )
    if items < 0:
        return None
    p, q, low, high, single, count = (buffer[:items].copy() for buffer in buffers)
    return p, q, low, high, single.view(bool), count, item


#: :func:`build_items`'s answer when 1 - alpha* is below ``min_room`` (the numpy function's ``None``).
NO_ROOM = "no room"
#: The constants :func:`build_items` reads, in the order of the C ``Constants`` (``theory/csrc/build.cpp``).
BUILD_CONSTANT_NAMES = (
    "TIGHT",
    "RETRY_SHORTFALL",
    "BINS",
    "MAX_OWN_UNITS",
    "MAX_UNITS",
    "UNIT_OWN_UNIT_MASS",
    "UNIT_MAX_OWN_UNITS",
    "UNIT_TIGHT",
    "STEP",
    "LOW",
    "HIGH",
    "TAIL_LOW",
    "WIDE",
    "FLOOR",
    "MAX_STEP",
    "TOLERANCE",
    "MAX_ITERATIONS",
    "MAX_HALVINGS",
)


def build_items(items, n: int, min_room: float, constants: dict):
    """``(r, classes, log_weights, item, accepted, alpha, minimiser)`` of
    :func:`theory.optimal_verifier._build_items_in_numpy` for ``items`` (:class:`theory._buckets.Items`),
    :data:`NO_ROOM`, or ``None`` where numpy must build the row. ``constants``: :data:`BUILD_CONSTANT_NAMES`."""
    library = _active()
    if library is None:
        return None
    return _build_items_with(library.specbound_build_items, items, n, min_room, constants)


def _build_items_with(function, items, n, min_room, constants):
    size, tokens = items.p.shape[0], items.item.shape[0]
    arrays = [
        np.ascontiguousarray(array, dtype=np.float64) for array in (items.p, items.q, items.low, items.high)
    ]
    single = np.ascontiguousarray(items.single, dtype=np.uint8)
    count, item = (np.ascontiguousarray(array, dtype=np.int64) for array in (items.count, items.item))
    p_tokens, q_tokens = (np.ascontiguousarray(x, dtype=np.float64) for x in (items.p_tokens, items.q_tokens))
    values = _values(constants, BUILD_CONSTANT_NAMES)
    r, classes, logs = np.empty(tokens), np.empty(size, np.int64), np.empty(size)
    scalars, minimiser = np.empty(2), np.empty(1, np.int64)
    status = function(
        *(array.ctypes.data for array in arrays),
        single.ctypes.data,
        count.ctypes.data,
        size,
        item.ctypes.data,
        p_tokens.ctypes.data,
        q_tokens.ctypes.data,
        tokens,
        n,
        min_room,
        values.ctypes.data,
        r.ctypes.data,
        classes.ctypes.data,
        logs.ctypes.data,
        scalars[0:].ctypes.data,
        scalars[1:].ctypes.data,
        minimiser.ctypes.data,
    )
    if status == 1:
        return NO_ROOM
    if status != 0:
        return None
    return r, classes, logs, items.item, float(scalars[0]), float(scalars[1]), int(minimiser[0])


def build_row(
    p: np.ndarray, q: np.ndarray, n: int, group_below: float, row: dict, buckets: dict, constants: dict
):
    """``(r, item_class, item_log_weight, acceptance, alpha, minimiser, item)`` of the grouped build of one row
    (:func:`theory.optimal_verifier._build_row` with ``group_below > 0``, ``n >= 2``), or ``None`` where Python
    builds it. ``row``: the build's :data:`ROW_CONSTANT_NAMES`; ``buckets``: the constants :func:`bucketed`
    takes; ``constants``: those :func:`build_items` takes."""
    library = _active()
    if library is None:
        return None
    return _build_row_with(library.specbound_build_row, p, q, n, group_below, row, buckets, constants)


#: The build's constants :func:`build_row` reads by name, in the order of ``specbound_build_row``'s ``row``
#: (the buckets' margin, shift and coarse shift follow them).
ROW_CONSTANT_NAMES = ("NEGLIGIBLE_Q", "CUT_SUPPORT_BELOW", "GROUPED_MIN_ROOM", "TIGHT")


def _values(constants: dict, names) -> np.ndarray:
    """``constants`` as the float64 array a native function reads, in the order of ``names``."""
    return np.array([constants[name] for name in names], dtype=np.float64)


def _build_row_with(function, p, q, n, group_below, row, buckets, constants):
    vocab = p.shape[0]
    shifts = buckets["SHIFT"], buckets["FINE_BITS"] - buckets["COARSE_BITS"]
    row = np.array(
        [*(row[name] for name in ROW_CONSTANT_NAMES), buckets["MARGIN"], *shifts], dtype=np.float64
    )
    constants = _values(constants, BUILD_CONSTANT_NAMES)
    # Item tables land in per-thread buffers and leave as copies of their first entries (as in _bucketed_with).
    buffers = getattr(_OUTPUTS, "row_buffers", None)
    if buffers is None or buffers[0].shape[0] <= vocab:
        buffers = (np.empty(vocab + 1, np.int64), np.empty(vocab + 1), np.empty(2), np.empty(1, np.int64))
        _OUTPUTS.row_buffers = buffers
    classes, logs, scalars, minimiser = buffers
    p, q = np.ascontiguousarray(p, dtype=np.float64), np.ascontiguousarray(q, dtype=np.float64)
    r, item = np.empty(vocab), np.empty(vocab, np.int64)
    items = function(
        p.ctypes.data,
        q.ctypes.data,
        vocab,
        n,
        group_below,
        row.ctypes.data,
        constants.ctypes.data,
        r.ctypes.data,
        item.ctypes.data,
        classes.ctypes.data,
        logs.ctypes.data,
        scalars.ctypes.data,
        minimiser.ctypes.data,
    )
    if items < 0:
        return None
    return (
        r,
        classes[:items].copy(),
        logs[:items].copy(),
        float(scalars[0]),
        float(scalars[1]),
        int(minimiser[0]),
        item,
    )


def class_units(
    capped, qs, ratio, slack, mass: float, above: bool, lower: float, n: int, bins: int, constants
):
    """``(labels, unit_q, unit_target)`` of :func:`theory.optimal_verifier._class_units` for a large class, or
    ``None`` where the native code is off. ``constants``: ``OWN_UNIT_MASS``, ``MAX_OWN_UNITS``, ``TIGHT``."""
    library = _active()
    if library is None:
        return None
    return _class_units_with(
        library.specbound_class_units, capped, qs, ratio, slack, mass, above, lower, n, bins, constants
    )


def _class_units_with(function, capped, qs, ratio, slack, mass, above, lower, n, bins, constants):
    inputs = [np.ascontiguousarray(array, dtype=np.float64) for array in (capped, qs, ratio, slack)]
    size = inputs[0].shape[0]
    labels, unit_q, unit_target = np.empty(size, np.int64), np.empty(size), np.empty(size)
    units = function(
        *(array.ctypes.data for array in inputs),
        size,
        mass,
        int(above),
        lower,
        n,
        bins,
        constants["OWN_UNIT_MASS"],
        constants["MAX_OWN_UNITS"],
        constants["TIGHT"],
        labels.ctypes.data,
        unit_q.ctypes.data,
        unit_target.ctypes.data,
    )
    return labels, unit_q[:units], unit_target[:units]


def exp(x) -> np.ndarray | None:
    """e^x by the race's vectorised exp (``exp8`` in ``race_fit.cpp``, within 1 ulp of the C library's), or
    ``None`` where the native code is off: how its accuracy is tested."""
    library = _active()
    return None if library is None else _exp_with(library.specbound_exp, x)


def _exp_with(function, x):
    x = np.ascontiguousarray(x, dtype=np.float64)
    out = np.empty_like(x)
    function(x.ctypes.data, out.ctypes.data, x.size)
    return out


def _library():
    global _LIBRARY
    if _LIBRARY is None:
        with _LOCK:
            if _LIBRARY is None:
                try:
                    _LIBRARY = _probe(_load())
                except (OSError, RuntimeError, subprocess.SubprocessError) as error:
                    print(
                        f"specbound: the native theory code is off ({error}); numpy runs instead",
                        file=sys.stderr,
                    )
                    _LIBRARY = False
    return _LIBRARY or None


def cpuinfo(path: str | os.PathLike = "/proc/cpuinfo") -> dict[str, str]:
    """The fields of ``/proc/cpuinfo`` (or ``path``), the first value of each: the first processor's, and the
    fields 32-bit ARM kernels list after the processors (``Features``); ``{}`` where there is none (not Linux).

    The one reader of the file: the native code's cache key and the executor's CPU checks
    (:func:`executor.device.cpu_flags`, :mod:`executor.products`) use it."""
    fields: dict[str, str] = {}
    try:
        with open(path) as lines:
            for line in lines:
                key, colon, value = line.partition(":")
                if colon:
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def _cache_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specbound" / "native"


def _load():
    """Compile the sources (once per source, compiler, flags and machine) and load the library.

    With :data:`FLAGS` first; where the compiler refuses them (``-march=native`` is not universal), once more
    with :data:`PORTABLE_FLAGS`, saying so."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX)")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60, check=True)
    try:
        library = _built(compiler, version.stdout, FLAGS)
    except RuntimeError as error:
        library = _built(compiler, version.stdout, PORTABLE_FLAGS)
        print(f"specbound: built the theory's native code without -march=native ({error})", file=sys.stderr)
    return _declared(ctypes.CDLL(str(library)))


def _built(compiler: str, version: str, flags: tuple[str, ...]) -> Path:
    """The cached library for these flags, compiled first if it is not there (written whole or not at all)."""
    cpu = cpuinfo()
    machine = f"{platform.machine()} {cpu.get('model name', '')} {cpu.get('flags', '')}"
    parts = [*(path.read_bytes() for path in SOURCES + HEADERS), version.encode(), " ".join(flags).encode()]
    key = b"\0".join([*parts, machine.encode()])
    directory = _cache_directory()
    library = directory / f"theory-{hashlib.sha256(key).hexdigest()[:16]}.so"
    refused = library.with_suffix(".refused")  # this compiler refused these flags once: not asked again
    if library.is_file():
        return library
    if refused.is_file():
        raise RuntimeError(refused.read_text().strip())
    directory.mkdir(parents=True, exist_ok=True)
    print("specbound: building the theory's native code (once per machine, ~5-10 s)", file=sys.stderr)
    # Built under a temporary name and renamed: a concurrent process never loads a half-written file.
    handle, partial = tempfile.mkstemp(dir=directory, suffix=".so.partial")
    os.close(handle)
    try:
        error = _compile(compiler, flags, partial)
        if error is not None:
            reason = f"{compiler} failed: {error.strip()[-500:]}"
            refused.write_text(reason + "\n")
            raise RuntimeError(reason)
        os.replace(partial, library)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return library


def _compile(compiler: str, flags: tuple[str, ...], output: str) -> str | None:
    """Compile the sources into the shared library ``output``, each in its own process, then link them; the
    compiler's messages where a step failed, else ``None``. (One after another they took ~11 s; side by side the
    longest one sets the time.)"""
    object_flags = [flag for flag in flags if flag != "-shared"]
    with tempfile.TemporaryDirectory(dir=Path(output).parent) as scratch:
        objects = [str(Path(scratch) / f"{source.stem}.o") for source in SOURCES]
        jobs = [
            subprocess.Popen(
                [compiler, *object_flags, "-c", "-o", target, str(source)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for source, target in zip(SOURCES, objects, strict=True)
        ]
        errors = []
        try:
            for job in jobs:
                _, messages = job.communicate(timeout=300)
                if job.returncode != 0:
                    errors.append(messages)
        finally:  # a timeout (raised to the caller) leaves no compiler running
            for job in jobs:
                if job.poll() is None:
                    job.kill()
                    job.wait()
        if errors:
            return errors[0]
        linked = subprocess.run(
            [compiler, *flags, "-o", output, *objects], capture_output=True, text=True, timeout=300
        )
        return linked.stderr if linked.returncode != 0 else None


def _declared(loaded):
    """The loaded library with its functions' C signatures declared."""
    double, integer, pointer, wide = ctypes.c_double, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64
    fit = loaded.specbound_race_fit
    fit.restype = integer
    # lower, masses, target, units, n; the eight float constants; the two integer ones; the two outputs.
    fit.argtypes = [double, pointer, pointer, integer, integer] + [double] * 8 + [integer] * 2 + [pointer] * 2
    buckets = loaded.specbound_bucketed
    buckets.restype = wide
    # ps, qs, size, n, group_below, tight, margin, absent, absent count, shift, coarse shift; seven outputs.
    buckets.argtypes = [pointer, pointer, wide, integer] + [double] * 3 + [pointer, wide, integer, integer]
    buckets.argtypes += [pointer] * 7
    units = loaded.specbound_class_units
    units.restype = wide
    # capped, qs, ratio, slack, size, mass, above, lower, n, bins, own unit mass, max own units, tight; 3 outputs.
    units.argtypes = [pointer] * 4 + [wide, double, integer, double, integer, integer, double, wide, double]
    units.argtypes += [pointer] * 3
    build = loaded.specbound_build_items
    build.restype = integer
    # p, q, low, high, single, count, items; token item, p, q, tokens; n, min room, constants; six outputs.
    build.argtypes = [pointer] * 6 + [wide] + [pointer] * 3 + [wide, integer, double] + [pointer] * 7
    row = loaded.specbound_build_row
    row.restype = wide
    # p, q, vocab, n, group below, row constants, build constants; six outputs.
    row.argtypes = [pointer, pointer, wide, integer, double] + [pointer] * 8
    loaded.specbound_exp.restype = None
    loaded.specbound_exp.argtypes = [pointer, pointer, wide]
    return loaded


def _probe(library):
    """The library, once each function reproduces numpy on a fixed input."""
    _probe_exp(library.specbound_exp)
    _probe_race_fit(library.specbound_race_fit)
    _probe_bucketed(library.specbound_bucketed)
    _probe_class_units(library.specbound_class_units)
    _probe_build_items(library.specbound_build_items)
    _probe_build_row(library.specbound_build_row)
    return library


def _probe_build_row(function):
    """On a fixed 4,096-token row with every token drafted, a tenth left out (passed whole) and seven tenths
    left out (cut to the support), n = 2: numpy's token-to-item map, classes, alpha* and acceptance, r = 0 off
    the support, and per class the marginal's sum (as :func:`_probe_build_items`, which checks the build at
    n = 2 and 4; what is new here, the support and the scatters, does not depend on n; each numpy build of the
    oracle costs ~7 ms of the process's first native call)."""
    from theory import _buckets

    builder = importlib.import_module("theory.optimal_verifier")
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.full(4096, 0.5)), rng.dirichlet(np.full(4096, 0.5))
    for left_out in (0.0, 0.1, 0.7):
        drafted = np.where(rng.random(4096) < left_out, 0.0, q)
        drafted /= drafted.sum()
        constants = builder._build_row_constants(), _buckets.NATIVE_CONSTANTS, builder._build_constants()
        built = _build_row_with(function, p, drafted, 2, builder.GROUP_BELOW, *constants)
        with enabled(False):  # numpy alone (the lock is held: no native call may load the library)
            expected = builder._build_row(p, drafted, 2, builder.GROUP_BELOW, False)
        if not isinstance(built, tuple) or not _same_row(built, expected, drafted):
            raise RuntimeError("its probe row build disagrees with numpy's")


def _same_row(built, expected, q) -> bool:
    """The native row's tables against numpy's :class:`theory.optimal_verifier._Tables` of the same row."""
    r, classes, _, accepted, alpha, minimiser, item = built
    if not (np.array_equal(item, expected.item) and np.array_equal(classes, expected.item_class)):
        return False
    if minimiser != expected.minimiser_size or abs(alpha - expected.alpha_star) > 1e-15:
        return False
    if abs(accepted - expected.acceptance) > 1e-14 or r.min() < 0 or np.any(r[q == 0] != 0.0):
        return False
    # Classes from -1 (the absent tokens' item) up, counted from 0.
    sums, expected_sums = (np.bincount(classes[item] + 1, weights=x) for x in (r, expected.marginal))
    return bool(np.allclose(sums, expected_sums, rtol=1e-12, atol=1e-16))


def _probe_build_items(function):
    """On a fixed 4,096-token row's grouped items (n = 2, 4): numpy's classes, alpha* and acceptance, and per
    class the marginal's sum (the class's selection probability, whatever its units)."""
    from theory import _buckets

    builder = importlib.import_module("theory.optimal_verifier")
    rng = np.random.default_rng(2)
    p, q = rng.dirichlet(np.full(4096, 0.5)), rng.dirichlet(np.full(4096, 0.5))
    for n in (2, 4):
        items = _buckets._bucketed(p, q, n, 1e-4, 1e-13)
        built = _build_items_with(function, items, n, 0.0, builder._build_constants())
        with enabled(False):  # numpy alone (the lock is held: no native call may load the library)
            expected = builder._build_items_in_numpy(items, n, 0.0, item_fit=False)
        if not isinstance(built, tuple) or not _same_build(built, expected):
            raise RuntimeError("its probe build disagrees with numpy's")


def _same_build(built, expected) -> bool:
    r, classes, _, item, accepted, alpha, minimiser = built
    if not (np.array_equal(classes, expected[1]) and minimiser == expected[6]):
        return False
    if abs(alpha - expected[5]) > 1e-15 or abs(accepted - expected[4]) > 1e-14 or r.min() < 0:
        return False
    class_of_token = classes[item]
    sums, expected_sums = (np.bincount(class_of_token, weights=x) for x in (r, expected[0]))
    return bool(np.allclose(sums, expected_sums, rtol=1e-12, atol=1e-16))


def _probe_class_units(function):
    """On a fixed class of 2,000 items (above and below the minimiser): unit masses that are the sums of their
    items' (what exactness needs), and numpy's partition on at least 99% of the items (not all: numpy's SIMD
    ``log`` and unstable sorts may move a unit boundary by an item)."""
    # The module (the package's name ``optimal_verifier`` is the function).
    builder = importlib.import_module("theory.optimal_verifier")
    rng = np.random.default_rng(1)
    qs, ps = rng.dirichlet(np.full(2000, 0.5)) * 0.4, rng.dirichlet(np.full(2000, 0.5)) * 0.5
    ratio = ps / qs
    slack = 10.0 ** rng.uniform(-13.0, -3.0, 2000)
    for above, mass in ((True, 0.3), (False, 0.45)):
        capped = np.minimum(ps, 2.0 * qs) if above else np.maximum(ps, 0.5 * qs)
        args = (capped, qs, ratio, slack, mass, above, 0.1, 3, 96)
        native = _class_units_with(function, *args, builder.UNIT_CONSTANTS)
        expected = builder._class_units(*args)
        if not _same_units(native, expected, qs):
            raise RuntimeError("its probe units disagree with numpy's")


def _same_units(native, expected, qs) -> bool:
    """Unit masses are the sums of their items' q, and the partition is numpy's on >= 99% of the items."""
    labels, unit_q, _ = native
    if labels.min() < 0 or labels.max() >= unit_q.shape[0]:
        return False
    if not np.allclose(
        unit_q, np.bincount(labels, weights=qs, minlength=unit_q.shape[0]), rtol=1e-12, atol=0
    ):
        return False
    # Each native unit's items, mapped to the numpy unit most of them are in.
    joint = np.zeros((unit_q.shape[0], expected[1].shape[0]), dtype=np.int64)
    np.add.at(joint, (labels, expected[0]), 1)
    return joint.max(axis=1).sum() >= 0.99 * labels.shape[0]


def _probe_bucketed(function):
    """Items bitwise numpy's on a 4,096-token row whose light tokens are grouped (n = 2, 4)."""
    from theory import _buckets

    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.full(4096, 0.5)), rng.dirichlet(np.full(4096, 0.5))
    for n in (2, 4):
        native = _bucketed_with(function, p, q, n, 1e-4, 1e-13, None, _buckets.NATIVE_CONSTANTS)
        expected = _buckets._bucketed(p, q, n, 1e-4, 1e-13)
        if native is None or not all(
            np.array_equal(a, b) for a, b in zip(native, _buckets.item_arrays(expected), strict=True)
        ):
            raise RuntimeError("its probe buckets disagree with numpy's")


def _probe_exp(function):
    """Its vectorised exp is within 2 ulp of numpy's from e^-745 (the race's clocks reach it) to e^709. Why a
    probe of its own: an exp off by 1e-13 relative at large arguments passed the marginal's probe and the
    enumeration tests, yet made fits 2-4 times slower."""
    x = np.concatenate([np.linspace(-745.0, 709.0, 4099), np.linspace(-1.0, 1.0, 1025)])
    value = _exp_with(function, x)
    expected = np.exp(x)
    if not np.all(np.abs(value - expected) <= 2.0 * np.spacing(expected)):
        raise RuntimeError("its exp disagrees with numpy's")


def _probe_race_fit(function):
    """Its marginal matches numpy's at the weights it returns on a fixed class (n = 2, 4)."""
    from theory import _race

    rng = np.random.default_rng(0)
    masses = rng.dirichlet(np.ones(12)) * 0.6
    for n in (2, 4):
        total = (0.3 + masses.sum()) ** n - 0.3**n
        target = rng.dirichlet(np.ones(12)) * 0.2 + masses * 0.8
        target *= total / target.sum()
        fitted = _fit_with(function, 0.3, masses, target, n, _race.NATIVE_CONSTANTS)
        if fitted is None:
            raise RuntimeError("its probe fit did not finish")
        expected = _race.race_marginal(0.3, masses, fitted[0], n)
        if not np.allclose(fitted[1], expected, rtol=1e-12, atol=0.0):
            raise RuntimeError("its probe marginal disagrees with numpy's")
