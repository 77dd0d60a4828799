"""The race fit in C++ (``theory/csrc/race_fit.cpp``), built on first use with the machine's C++ compiler.

A class of the optimal verifier's build has a few dozen units and ~100 quadrature nodes: one numpy evaluation of
the race marginal and its Jacobian costs ~100 us, nearly all of it numpy's per-call cost, and the Newton loop
around it as much again. The C++ file runs :func:`theory._race.newton_fit` on :func:`theory._race.race_marginal`
and :func:`theory._race.race_potential` in one call (the same formulas, IEEE double, no fast-math); the Python
functions stay the specification and the oracle of the tests, and the fit of every case the C++ does not take
(a singular Newton system, log-weights wider than the clocks' direct form) is the numpy one.

The library is compiled once per source, compiler and machine (``c++ -O3``, ~2 s) into
``$XDG_CACHE_HOME/specbound/native/`` and loaded with :mod:`ctypes`, so ``theory`` needs neither torch nor a
build step at install. Before first use it must reproduce numpy's marginal on a probe class; where there is no
compiler, the build fails or the probe disagrees, one line on stderr says so and the numpy fit runs.
``SPECBOUND_NATIVE=0`` in the environment (read at import; :func:`enable` in a running process) turns it off, as
it does the executor's native products.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

__all__ = ["available", "cpuinfo", "enabled", "race_fit"]

SOURCE = Path(__file__).with_name("csrc") / "race_fit.cpp"
#: No ``-ffast-math``: the marginal must be the exact one of the weights returned, to IEEE round-off.
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC")

_ENABLED = os.environ.get("SPECBOUND_NATIVE", "1") != "0"
_LIBRARY = None  # the loaded function; False where it is not offered (tried once)
_LOCK = threading.Lock()


@contextlib.contextmanager
def enabled(flag: bool):
    """Context in which the native fit is on (``True``) or off; the previous setting is restored on exit."""
    global _ENABLED
    previous, _ENABLED = _ENABLED, bool(flag)
    try:
        yield
    finally:
        _ENABLED = previous


def available() -> bool:
    """Whether :func:`race_fit` runs natively here (switched on, built and probed; tried once)."""
    return _ENABLED and _function() is not None


def race_fit(lower: float, masses: np.ndarray, target: np.ndarray, n: int, constants: dict):
    """``(log_weights, r)`` of the native fit, or ``None`` where the numpy fit must run.

    Arguments as :func:`theory._race.fit_log_weights` (at least two units); ``constants`` holds the fit's
    constants by their names in :mod:`theory._race` (one source for both implementations).
    """
    function = _function() if _ENABLED else None
    return None if function is None else _fit_with(function, lower, masses, target, n, constants)


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


def _function():
    global _LIBRARY
    if _LIBRARY is None:
        with _LOCK:
            if _LIBRARY is None:
                try:
                    _LIBRARY = _probe(_load())
                except (OSError, RuntimeError, subprocess.SubprocessError) as error:
                    print(
                        f"specbound: the native race fit is off ({error}); numpy fits the race",
                        file=sys.stderr,
                    )
                    _LIBRARY = False
    return _LIBRARY or None


def cpuinfo() -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (``{}`` where there is none: not Linux)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as lines:
            for line in lines:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def _cache_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specbound" / "native"


def _load():
    """Compile the source (once per source, compiler, flags and machine) and load its function."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX)")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60, check=True)
    cpu = cpuinfo()
    machine = f"{platform.machine()} {cpu.get('model name', '')} {cpu.get('flags', '')}"
    key = b"\0".join(
        [SOURCE.read_bytes(), version.stdout.encode(), " ".join(FLAGS).encode(), machine.encode()]
    )
    directory = _cache_directory()
    library = directory / f"race_fit-{hashlib.sha256(key).hexdigest()[:16]}.so"
    if not library.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        print("specbound: building the native race fit (once per machine, a few seconds)", file=sys.stderr)
        # Built under a temporary name and renamed: a concurrent process never loads a half-written file.
        handle, partial = tempfile.mkstemp(dir=directory, suffix=".so.partial")
        os.close(handle)
        try:
            built = subprocess.run(
                [compiler, *FLAGS, "-o", partial, str(SOURCE)], capture_output=True, text=True, timeout=300
            )
            if built.returncode != 0:
                raise RuntimeError(f"{compiler} failed: {built.stderr.strip()[-500:]}")
            os.replace(partial, library)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    function = ctypes.CDLL(str(library)).specbound_race_fit
    function.restype = ctypes.c_int
    double, integer, pointer = ctypes.c_double, ctypes.c_int, ctypes.c_void_p
    # lower, masses, target, units, n; the eight float constants; the two integer ones; the two outputs.
    function.argtypes = (
        [double, pointer, pointer, integer, integer] + [double] * 8 + [integer] * 2 + [pointer] * 2
    )
    return function


def _probe(function):
    """The function, once its marginal matches numpy's at the weights it returns on a fixed class (n = 2, 4)."""
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
    return function
