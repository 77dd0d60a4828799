"""The race fit in C++ (``theory._native``, ``theory/csrc/race_fit.cpp``): numpy's fit, in one call.

Oracles: numpy's :func:`theory._race.race_marginal` evaluated at the native fit's own log-weights (the marginal a
verifier uses must be its race's; losslessness needs nothing else), numpy's fit on the same class (the same
targets reached), and builds of the optimal verifier on logged SmolLM2 pairs with each fit. The enumeration tests
of ``test_optimal_verifier.py`` run on the native fit by default. The build's own safety: a library whose
marginal disagrees is refused, a missing compiler leaves numpy in charge and says so, and the cached library is
written whole.
"""

from __future__ import annotations

import ctypes
import importlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.native import require_native_fit
from theory.optimal_verifier import optimal_tables

race = importlib.import_module("theory._race")
native = importlib.import_module("theory._native")
PAIRS = Path(__file__).parent / "data" / "smollm2_pairs.npz"


@st.composite
def classes(draw):
    """(lower, masses, target, n): 2-60 units with masses over 10 decades; targets the marginal of log-weights
    within e^+-6 (feasible), or (``stretch``) of a wider spread the fit must push units far apart to reach."""
    n = draw(st.integers(2, 8))
    units = draw(st.integers(2, 60))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    masses = 10.0 ** rng.uniform(-10.0, 0.0, units)
    share = draw(st.floats(0.05, 1.0))
    masses = masses / masses.sum() * share
    lower = draw(st.sampled_from([0.0, 0.3])) * (1.0 - share)
    spread = draw(st.sampled_from([6.0, 30.0]))
    target = race.race_marginal(lower, masses, rng.uniform(-spread, spread, units), n)
    return lower, masses, target, n


def _scale(lower, masses, n):
    """n Q_u (x + Q_C)^(n-1): the size of r_u when u wins whenever drafted."""
    return n * masses * (lower + masses.sum()) ** (n - 1)


def _native_fit(lower, masses, target, n):
    require_native_fit()
    with native.enabled(True):
        fitted = native.race_fit(lower, masses, target, n, race.NATIVE_CONSTANTS)
    assert fitted is not None, "the native fit handed a plain class back to numpy"
    return fitted


@given(classes())
def test_native_marginal_is_the_race_marginal_of_its_own_weights(case):
    lower, masses, target, n = case
    log_weights, r = _native_fit(lower, masses, target, n)
    assert log_weights.max() == 0.0 and log_weights.min() >= -race.FLOOR
    expected = race.race_marginal(lower, masses, log_weights, n)
    assert np.all(np.abs(r - expected) <= 4e-15 * _scale(lower, masses, n))


@given(classes())
def test_native_fit_gets_as_close_to_the_target_as_numpys(case):
    lower, masses, target, n = case
    _, r = _native_fit(lower, masses, target, n)
    with native.enabled(False):
        _, numpy_r = race.fit_log_weights(lower, masses, target, n)
    native_error, numpy_error = np.abs(r - target).sum(), np.abs(numpy_r - target).sum()
    assert native_error <= max(10 * race.TOLERANCE, 2 * numpy_error)


def test_builds_on_logged_smollm2_pairs_agree_between_the_fits():
    """The verifier's tables on real pairs (V = 49,152; n = 2, 4, 8): the same marginal to round-off, the same
    acceptance; both reach alpha* within the build's tolerance."""
    require_native_fit()
    data = np.load(PAIRS)
    p, q = data["p"].astype(np.float64), data["q"].astype(np.float64)
    for row in range(0, p.shape[0], max(1, p.shape[0] // 4)):
        for n in (2, 4, 8):
            with native.enabled(True):
                fast = optimal_tables(p[row], q[row], n, item_fit=False)
            with native.enabled(False):
                slow = optimal_tables(p[row], q[row], n, item_fit=False)
            assert np.max(np.abs(fast.marginal - slow.marginal)) <= 1e-14
            assert abs(fast.acceptance - slow.acceptance) <= 1e-13
            assert fast.alpha_star - fast.acceptance <= 1e-9


def test_switched_off_or_on_the_fit_takes_the_implementation_asked(monkeypatch):
    require_native_fit()
    calls = []
    newton = race.newton_fit
    monkeypatch.setattr(
        race, "newton_fit", lambda *args, **kwargs: calls.append(1) or newton(*args, **kwargs)
    )
    masses = np.array([0.5, 0.3, 0.2])
    target = race.race_marginal(0.0, masses, np.array([0.0, 1.0, -1.0]), 3)
    with native.enabled(False):
        race.fit_log_weights(0.0, masses, target, 3)
    assert calls == [1]
    with native.enabled(True):
        race.fit_log_weights(0.0, masses, target, 3)
    assert calls == [1]


def test_a_library_whose_marginal_disagrees_is_refused():
    """Negative control of the probe: the real function with its marginal moved by 1e-9 relative."""
    require_native_fit()
    function = native._function()

    def off(*args):
        status = function(*args)
        units, r = args[3], args[-1]
        view = np.ctypeslib.as_array(ctypes.cast(r, ctypes.POINTER(ctypes.c_double)), shape=(units,))
        view *= 1.0 + 1e-9
        return status

    assert native._probe(function) is function
    with pytest.raises(RuntimeError, match="disagrees with numpy"):
        native._probe(off)


def test_without_a_compiler_numpy_fits_and_one_line_says_why(monkeypatch, capsys):
    monkeypatch.setattr(native, "_LIBRARY", None)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    masses = np.array([0.5, 0.3, 0.2])
    target = race.race_marginal(0.0, masses, np.array([0.0, 1.0, -1.0]), 3)
    with native.enabled(True):
        assert not native.available()
        _, r = race.fit_log_weights(0.0, masses, target, 3)
    assert np.abs(r - target).sum() <= race.TOLERANCE
    assert "native race fit is off" in capsys.readouterr().err


def test_the_library_is_built_once_whole_and_reused(monkeypatch, tmp_path, capsys):
    require_native_fit()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native, "_LIBRARY", None)
    assert native.available()
    built = sorted((tmp_path / "specbound" / "native").iterdir())
    assert [path.suffix for path in built] == [".so"]  # no partial file left behind
    assert "building the native race fit" in capsys.readouterr().err
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(native, "_LIBRARY", None)
    assert native.available()
    assert built[0].stat().st_mtime_ns == stamp and capsys.readouterr().err == ""
