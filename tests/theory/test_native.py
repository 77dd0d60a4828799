"""The theory's native code (``theory._native``, ``theory/csrc``): numpy's race fit, ratio buckets, class units
and the build around them, in C++.

Oracles: numpy's :func:`theory._race.race_marginal` evaluated at the native fit's own log-weights (the marginal a
verifier uses must be its race's; losslessness needs nothing else), numpy's fit on the same class (the same
targets reached), numpy's :func:`theory._buckets._bucketed` (the same items, bitwise), numpy's unit partition,
numpy's build of a row's tables from its items (:func:`theory.optimal_verifier._build_items_in_numpy`, around
the same native units and fits), the buckets and the build called one after the other (the one-call row build,
bitwise), and builds of the optimal verifier with the native code on and off on logged SmolLM2 pairs and LM-like
rows. The enumeration tests of ``test_optimal_verifier.py`` run on both. The build's own safety: a library whose
marginal, buckets, units, build or row build disagree is refused, a missing compiler leaves
numpy in charge and says so, and the cached library is written whole."""

from __future__ import annotations

import ctypes
import importlib
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.native import require_native_code
from tests.theory.test_optimal_verifier import degenerate_pairs
from theory._class_units import TIGHT
from theory.optimal_verifier import optimal_tables

buckets = importlib.import_module("theory._buckets")
verifier = importlib.import_module("theory.optimal_verifier")
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
    require_native_code()
    with native.enabled(True):
        fitted = native.race_fit(lower, masses, target, n, race.NATIVE_CONSTANTS)
    assert fitted is not None, "the native fit handed a plain class back to numpy"
    return fitted


def _exp_reference(x: np.ndarray) -> np.ndarray:
    """The C library's exp (Python's ``math.exp``), element by element; inf where it overflows."""
    top = math.log(np.finfo(np.float64).max)
    return np.array([math.exp(v) if not v > top else math.inf for v in x.tolist()])


def _assert_within_one_ulp(x, value):
    expected = _exp_reference(x)
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(value[~finite], expected[~finite])
    with np.errstate(invalid="ignore"):  # inf - inf where the reference overflows (checked above)
        outside = np.flatnonzero(finite & ~(np.abs(value - expected) <= np.spacing(expected)))
    assert outside.size == 0, (
        f"exp({x[outside[0]]!r}) = {value[outside[0]]!r}, the C library's {expected[outside[0]]!r}"
    )


def test_native_exp_is_within_one_ulp_of_the_c_librarys():
    """The race's vectorised exp on 420,000 arguments: the race's range (e^-clock, clocks up to 10^300), the
    subnormal results below -708.4, the overflow threshold near 709.78, and the special values."""
    require_native_code()
    rng = np.random.default_rng(7)
    x = np.concatenate(
        [
            rng.uniform(-1.0, 1.0, 100_000),
            rng.uniform(-50.0, 10.0, 100_000),
            rng.uniform(-746.0, -700.0, 100_000),
            -(10.0 ** rng.uniform(-20.0, 300.0, 100_000)),
            rng.uniform(700.0, 709.9, 20_000),
            [0.0, -0.0, 1.0, -1.0, 1e-300, -1e-17, 709.78, 709.79, -708.4, -745.13, -745.14, -1e308],
            [np.inf, -np.inf, np.nan, np.log(2.0), -np.log(2.0) / 2, np.log(2.0) / 2],
        ]
    )
    with native.enabled(True):
        value = native.exp(x)
    _assert_within_one_ulp(x, value)
    assert np.isnan(value[-4]) and value[-5] == 0.0 and value[-6] == np.inf


@given(st.lists(st.floats(-750.0, 712.0), min_size=1, max_size=40))
def test_native_exp_of_any_argument_is_within_one_ulp_whatever_the_array_length(arguments):
    require_native_code()
    x = np.array(arguments)
    with native.enabled(True):
        _assert_within_one_ulp(x, native.exp(x))


@given(classes())
def test_native_marginal_is_the_race_marginal_of_its_own_weights(case):
    lower, masses, target, n = case
    log_weights, r = _native_fit(lower, masses, target, n)
    assert log_weights.max() == 0.0 and log_weights.min() >= -race.FLOOR
    expected = race.race_marginal(lower, masses, log_weights, n)
    assert np.all(np.abs(r - expected) <= 4e-15 * _scale(lower, masses, n))


def test_native_fit_gets_as_close_to_the_target_as_numpys():
    """On 600 random classes (2-60 units, masses over 10 decades, n = 2-8, targets of weights within e^+-6 or
    e^+-30) the two fits reach the same distance to the target, up to the rare class where Newton crawls for
    dozens of iterations on a tiny unit and one of them escapes before the 60-iteration cap and the other does
    not (round-off decides which: 3 and 2 of 3,000 such classes, each way). Threshold: at most 1% of classes
    where one is more than twice as far as the other and above 10 tolerances, either way."""
    require_native_code()
    rng = np.random.default_rng(20261129)
    worse = {"native": 0, "numpy": 0}
    for _ in range(600):
        lower, masses, target, n = _random_class(rng)
        _, r = _native_fit(lower, masses, target, n)
        with native.enabled(False):
            _, numpy_r = race.fit_log_weights(lower, masses, target, n)
        native_error, numpy_error = np.abs(r - target).sum(), np.abs(numpy_r - target).sum()
        worse["native"] += native_error > max(10 * race.TOLERANCE, 2 * numpy_error)
        worse["numpy"] += numpy_error > max(10 * race.TOLERANCE, 2 * native_error)
    assert worse["native"] <= 6 and worse["numpy"] <= 6, worse


def _random_class(rng):
    n, units = int(rng.integers(2, 9)), int(rng.integers(2, 61))
    masses = 10.0 ** rng.uniform(-10.0, 0.0, units)
    share = rng.uniform(0.05, 1.0)
    masses = masses / masses.sum() * share
    lower = rng.choice([0.0, 0.3]) * (1.0 - share)
    target = race.race_marginal(lower, masses, rng.uniform(-1.0, 1.0, units) * rng.choice([6.0, 30.0]), n)
    return lower, masses, target, n


def lm_like_rows(seed: int, count: int, vocab: int = 8192, zero_share: float = 0.0):
    """(p, q) rows like a language model's: Gaussian logits of scale 3 at T = 0.7 or 1, the draft's logits the
    target's plus noise of scale 1.5 (the benchmark's synthetic pairs); ``zero_share`` of the draft's tokens
    get q = 0 (a reduced draft vocabulary)."""
    rng = np.random.default_rng(seed)
    for index in range(count):
        temperature = (0.7, 1.0)[index % 2]
        logits = 3.0 * rng.standard_normal(vocab)
        draft = logits + 1.5 * rng.standard_normal(vocab)
        p = np.exp((logits - logits.max()) / temperature)
        q = np.exp((draft - draft.max()) / temperature)
        q[rng.random(vocab) < zero_share] = 0.0
        yield p / p.sum(), q / q.sum()


def _tables_both_ways(p, q, n):
    require_native_code()
    with native.enabled(True):
        fast = optimal_tables(p, q, n, item_fit=False)
    with native.enabled(False):
        slow = optimal_tables(p, q, n, item_fit=False)
    return fast, slow


def test_builds_agree_between_native_and_numpy_on_logged_and_lm_like_pairs():
    """The verifier's tables, native code on and off: the same marginal to round-off and the same acceptance,
    both within 1e-9 of alpha*, on logged SmolLM2 pairs (their top 64 tokens) and on LM-like rows of 8,192
    tokens (grouped into ratio buckets; one in three with 30% of the draft's tokens at q = 0), n = 2, 4, 8."""
    data = np.load(PAIRS)
    pairs = list(zip(data["p"].astype(np.float64), data["q"].astype(np.float64), strict=True))[::2]
    pairs += list(lm_like_rows(1, 4)) + list(lm_like_rows(2, 2, zero_share=0.3))
    for p, q in pairs:
        for n in (2, 4, 8):
            fast, slow = _tables_both_ways(p, q, n)
            assert np.max(np.abs(fast.marginal - slow.marginal)) <= 1e-14
            assert abs(fast.acceptance - slow.acceptance) <= 1e-13
            assert fast.alpha_star - fast.acceptance <= 1e-9


@given(st.integers(0, 2**32 - 1), st.sampled_from([2, 3, 4, 8]), st.sampled_from([1e-4, 1e-3, 1e-2]))
def test_native_buckets_are_numpys_bitwise(seed, n, group_below):
    """Every array of the items, on LM-like rows of 500-6,000 tokens, with and without absent tokens (q = 0,
    passed whole with their indices, as a row with a nearly full draft support is)."""
    assert_native_buckets_are_numpys(seed, n, group_below)


@pytest.mark.parametrize(
    ("seed", "n", "group_below"), [(3, 2, 1e-3), (10, 4, 1e-3), (65, 8, 1e-2), (97, 2, 1e-4)]
)
def test_native_buckets_are_numpys_where_a_whole_coarse_bucket_fails_the_second_test(seed, n, group_below):
    """Rows on which a coarse bucket kept whole by the first grouping test fails the second (its tokens all
    single: the singles are then found by a pass over the vocabulary, not from the heavy and split tokens);
    under 1% of random rows, so named here (found by instrumenting numpy's branch over seeds 0-299)."""
    assert_native_buckets_are_numpys(seed, n, group_below)


def assert_native_buckets_are_numpys(seed: int, n: int, group_below: float):
    require_native_code()
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(500, 6000))
    p, q = next(lm_like_rows(seed, 1, vocab, zero_share=float(rng.choice([0.0, 0.05, 0.4]))))
    absent = np.flatnonzero(q == 0)
    keep = q > 0
    cases = [(p, q, absent)] if absent.size else []
    cases.append((p[keep] / p[keep].sum(), q[keep], None))
    for ps, qs, left_out in cases:
        with native.enabled(True):
            items = native.bucketed(ps, qs, n, group_below, TIGHT, left_out, buckets.NATIVE_CONSTANTS)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # p / 0 on the absent tokens
            expected = buckets._bucketed(ps, qs, n, group_below, TIGHT, left_out)
        assert items is not None
        for got, want in zip(items, buckets.item_arrays(expected), strict=True):
            assert got.dtype == want.dtype and np.array_equal(got, want)


def test_switched_off_or_on_the_fit_takes_the_implementation_asked(monkeypatch):
    require_native_code()
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
    require_native_code()
    function = native._library().specbound_race_fit

    def off(*args):
        status = function(*args)
        units, r = args[3], args[-1]
        view = np.ctypeslib.as_array(ctypes.cast(r, ctypes.POINTER(ctypes.c_double)), shape=(units,))
        view *= 1.0 + 1e-9
        return status

    native._probe_race_fit(function)
    with pytest.raises(RuntimeError, match="disagrees with numpy"):
        native._probe_race_fit(off)


def test_a_library_whose_exp_is_off_by_1e_13_is_refused():
    """Negative control of the exp's probe: the real function with its values moved by 1e-13 relative (as
    dropping ln 2's low part moves them near e^700)."""
    require_native_code()
    function = native._library().specbound_exp

    def off(x, out, size):
        function(x, out, size)
        np.ctypeslib.as_array(ctypes.cast(out, ctypes.POINTER(ctypes.c_double)), shape=(size,))[:] *= (
            1.0 + 1e-13
        )

    native._probe_exp(function)
    with pytest.raises(RuntimeError, match="exp disagrees"):
        native._probe_exp(off)


def test_a_library_whose_buckets_disagree_is_refused():
    """Negative control of the buckets' probe: the real function with one item's q moved by one ulp."""
    require_native_code()
    function = native._library().specbound_bucketed

    def off(*args):
        items = function(*args)
        q = np.ctypeslib.as_array(ctypes.cast(args[12], ctypes.POINTER(ctypes.c_double)), shape=(items,))
        q[items // 2] = np.nextafter(q[items // 2], 1.0)
        return items

    native._probe_bucketed(function)
    with pytest.raises(RuntimeError, match="buckets disagree"):
        native._probe_bucketed(off)


def test_without_a_compiler_numpy_fits_and_one_line_says_why(monkeypatch, capsys):
    monkeypatch.setattr(native, "_LIBRARY", None)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    masses = np.array([0.5, 0.3, 0.2])
    target = race.race_marginal(0.0, masses, np.array([0.0, 1.0, -1.0]), 3)
    with native.enabled(True):
        assert not native.available()
        _, r = race.fit_log_weights(0.0, masses, target, 3)
    assert np.abs(r - target).sum() <= race.TOLERANCE
    assert "native theory code is off" in capsys.readouterr().err


def test_the_library_is_built_once_whole_and_reused_and_portably_where_native_flags_are_refused(
    monkeypatch, tmp_path, capsys
):
    """A first build that fails (here: an unknown flag in place of -march=native) is retried without it and says
    so; the library it leaves is the only library in the cache (no partial file), passes the probes, and is
    loaded again without a rebuild or a second try of the refused flags. (One compilation: each takes ~10 s, and
    every test run compiles once anyway.)"""
    require_native_code()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native, "_LIBRARY", None)
    monkeypatch.setattr(native, "FLAGS", (*native.PORTABLE_FLAGS, "-fno-such-flag-for-specbound"))
    assert native.available()
    err = capsys.readouterr().err
    assert "without -march=native" in err and "building the theory's native code" in err
    built = sorted((tmp_path / "specbound" / "native").glob("*.so*"))
    assert [path.suffix for path in built] == [".so"]  # and no partial file
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(native, "_LIBRARY", None)
    assert native.available()  # the refused flags are not tried again: no compilation, one line on why
    assert built[0].stat().st_mtime_ns == stamp and "building" not in capsys.readouterr().err


def _recorded_class_units(monkeypatch, pairs):
    """The arguments of every large class's unit construction in builds of ``pairs`` (n = 2, 4, 8), the builds
    run by numpy's code around the native units (the native build calls them from C++)."""
    builder = importlib.import_module("theory.optimal_verifier")
    calls, make = [], native.class_units
    monkeypatch.setattr(native, "class_units", lambda *args: calls.append(args) or make(*args))
    monkeypatch.setattr(native, "build_items", lambda *args: None)
    monkeypatch.setattr(native, "build_row", lambda *args: None)
    for p, q in pairs:
        for n in (2, 4, 8):
            optimal_tables(p, q, n, item_fit=False)
    monkeypatch.undo()
    return builder, calls


def test_native_units_are_numpys_partition_with_its_masses_and_targets(monkeypatch):
    """On the large classes of builds of LM-like rows: the same partition as numpy's in at least 95% of the
    classes (measured: 1,013 of 1,019 on logged SmolLM2 pairs; the rest differ by one unit, where numpy's
    SIMD log or unstable sort moves a boundary), with the same unit masses (1e-12) and targets (1e-9) up to the
    units' numbering; in every class, unit masses that are their items' sums and numpy's partition on >= 99%
    of the items."""
    require_native_code()
    builder, calls = _recorded_class_units(
        monkeypatch, list(lm_like_rows(3, 4)) + list(lm_like_rows(4, 2, zero_share=0.3))
    )
    assert len(calls) >= 20
    same = 0
    for args in calls:
        made = native.class_units(*args)
        expected = builder._class_units(*args[:-1])
        assert native._same_units(made, expected, args[1])
        pairs = np.unique(np.stack([made[0], expected[0]]), axis=1)
        if pairs.shape[1] == made[1].shape[0] == expected[1].shape[0]:
            same += 1
            numbering = dict(zip(pairs[0].tolist(), pairs[1].tolist(), strict=True))
            match = np.array([numbering[unit] for unit in range(made[1].shape[0])])
            np.testing.assert_allclose(made[1], expected[1][match], rtol=1e-12, atol=0)
            np.testing.assert_allclose(made[2], expected[2][match], rtol=1e-9, atol=1e-300)
    assert same >= 0.95 * len(calls), (same, len(calls))


def _build_cases():
    """Items of logged SmolLM2 pairs (their top 64 tokens, token by token) and of grouped LM-like rows of 8,192
    tokens (a third with 30% of the draft's tokens left out and passed as absent)."""
    data = np.load(PAIRS)
    for p, q in list(zip(data["p"].astype(np.float64), data["q"].astype(np.float64), strict=True))[::3]:
        yield buckets.singletons(p[q > 0], q[q > 0])
    for seed, zero_share in ((1, 0.0), (2, 0.3), (3, 0.0)):
        for p, q in lm_like_rows(seed, 2, zero_share=zero_share):
            absent = np.flatnonzero(q == 0)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                yield buckets._bucketed(p, q, 4, verifier.GROUP_BELOW, TIGHT, absent if absent.size else None)


@pytest.mark.parametrize(("max_units", "retry_shortfall"), [(512, None), (40, np.inf), (4, np.inf)])
def test_native_build_is_numpys_to_round_off(monkeypatch, max_units, retry_shortfall):
    """The native build of a row's tables from its items against numpy's first unit fit (the specification, run
    on the same native units and race fits), n = 2, 3, 4, 8: the same classes and minimiser, alpha* and
    acceptance to 1e-15 / 2e-15, the marginal to 1e-13 and the log-weights to 1e-6 (the fits stop at slightly
    different Newton iterates: the targets differ by the C library's pow against numpy's). At the default cap
    no logged or LM-like class has more than 512 units; at 40 and 4 (retries off on both sides, since capped
    fits fall short) classes of 41-295 units go through the cap's merging, and at 40 its last round must choose
    the cheapest of its candidate merges."""
    require_native_code()
    monkeypatch.setattr(verifier, "MAX_UNITS", max_units)
    if retry_shortfall is not None:
        monkeypatch.setattr(verifier, "RETRY_SHORTFALL", retry_shortfall)
    constants = verifier._build_constants()  # as patched
    finished = total = 0
    for items in _build_cases():
        for n in (2, 3, 4, 8):
            total += 1
            built = native.build_items(items, n, 0.0, constants)
            # numpy's code around the same native units and fits (numpy's own units may split a class otherwise)
            expected = verifier._build_items_in_numpy(items, n, 0.0, item_fit=False)
            if built is None:  # handed back: a fit the native code refuses, or numpy's retries (tested below)
                continue
            finished += 1
            r, classes, logs, _, accepted, alpha, minimiser = built
            np.testing.assert_array_equal(classes, expected[1])
            assert minimiser == expected[6]
            assert abs(alpha - expected[5]) <= 1e-15 and abs(accepted - expected[4]) <= 2e-15
            np.testing.assert_allclose(r, expected[0], rtol=0, atol=1e-13)
            np.testing.assert_allclose(logs, expected[2], rtol=0, atol=1e-6)
    assert finished >= total // 3, (finished, total)  # not vacuous


def test_native_build_leaves_a_row_short_of_alpha_star_to_numpys_retries():
    """Close full-vocabulary drafts, where the first unit fit stops short of alpha* (the benchmark's close
    drafts): the native build hands the row back and the dispatching build is numpy's, retries included."""
    require_native_code()
    rng = np.random.default_rng(5)
    logits = 3.0 * rng.standard_normal(6000)
    p = np.exp(logits - logits.max())
    q = p * np.exp(0.05 * rng.standard_normal(6000))
    p, q = p / p.sum(), q / q.sum()
    items = buckets._bucketed(p, q, 8, verifier.GROUP_BELOW, TIGHT)
    with native.enabled(False):
        first = verifier._build_items_in_numpy(items, 8, 0.0, item_fit=False)
    assert first[5] - first[4] > verifier.RETRY_SHORTFALL  # the case: numpy's first fit is short
    assert native.build_items(items, 8, 0.0, verifier._build_constants()) is None
    expected = verifier._build_items_in_numpy(items, 8, 0.0, item_fit=True)  # with the native units and fits
    got = verifier._build_items(items, 8, 0.0, item_fit=True)
    assert got[4] == expected[4] and np.array_equal(got[0], expected[0])


def test_native_build_reports_no_room_as_numpy_does():
    """1 - alpha* below ``min_room``: numpy's None, through the dispatching build."""
    require_native_code()
    p, q = next(lm_like_rows(4, 1))
    items = buckets._bucketed(p, q, 2, verifier.GROUP_BELOW, TIGHT)
    assert native.build_items(items, 2, 1.5, verifier._build_constants()) is native.NO_ROOM
    assert verifier._build_items(items, 2, 1.5) is None
    with native.enabled(False):
        assert verifier._build_items_in_numpy(items, 2, 1.5) is None


def test_a_library_whose_build_disagrees_is_refused():
    """Negative control of the build's probe: the real function with the acceptance moved by 1e-13."""
    require_native_code()
    function = native._library().specbound_build_items

    def off(*args):
        status = function(*args)
        accepted = np.ctypeslib.as_array(ctypes.cast(args[-3], ctypes.POINTER(ctypes.c_double)), shape=(1,))
        accepted[0] += 1e-13
        return status

    native._probe_build_items(function)
    with pytest.raises(RuntimeError, match="build disagrees"):
        native._probe_build_items(off)


def test_a_library_whose_units_disagree_is_refused():
    """Negative control of the units' probe: the real function with one unit's mass moved by 1e-9 relative
    (a unit mass that is not its items' sum would make the marginal wrong)."""
    require_native_code()
    function = native._library().specbound_class_units

    def off(*args):
        units = function(*args)
        unit_q = np.ctypeslib.as_array(ctypes.cast(args[-2], ctypes.POINTER(ctypes.c_double)), shape=(units,))
        unit_q[0] *= 1.0 + 1e-9
        return units

    native._probe_class_units(function)
    with pytest.raises(RuntimeError, match="units disagree"):
        native._probe_class_units(off)


def _tables_with_and_without_the_row_build(p, q, n):
    """``optimal_tables`` (grouped, the native code on) through the one-call row build and through the two
    native calls it replaces, and whether the row build answered."""
    require_native_code()
    answered = []
    row_build = native.build_row

    def recording(*args):
        built = row_build(*args)
        answered.append(built is not None)
        return built

    with native.enabled(True), pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(native, "build_row", recording)
        one_call = optimal_tables(p, q, n, group_below=verifier.GROUP_BELOW, item_fit=False)
        monkeypatch.setattr(native, "build_row", lambda *args: None)
        two_calls = optimal_tables(p, q, n, group_below=verifier.GROUP_BELOW, item_fit=False)
    return one_call, two_calls, answered == [True]


def _assert_same_tables(got, expected):
    for name in ("marginal", "item_class", "item_log_weight", "item"):
        a, b = getattr(got, name), getattr(expected, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert (got.acceptance, got.alpha_star, got.minimiser_size) == (
        expected.acceptance,
        expected.alpha_star,
        expected.minimiser_size,
    )


@given(st.integers(0, 2**32 - 1), st.sampled_from([2, 3, 5, 8]), st.sampled_from([0.0, 0.2, 0.7]))
def test_the_one_call_row_build_is_the_two_native_calls_bitwise(seed, n, zero_share):
    """Every table of a grouped build, whether the draft covers the vocabulary, leaves a fifth of it out (the row
    passed whole) or seven tenths (cut to its support), on LM-like rows of 500-6,000 tokens: bitwise the same
    as the buckets and the build called one after the other."""
    rng = np.random.default_rng(seed)
    p, q = next(lm_like_rows(seed, 1, int(rng.integers(500, 6000)), zero_share=zero_share))
    one_call, two_calls, answered = _tables_with_and_without_the_row_build(p, q, n)
    assert answered
    _assert_same_tables(one_call, two_calls)


def test_the_one_call_row_build_hands_back_the_rows_python_must_build():
    """A close full-vocabulary draft (the first unit fit short of alpha*: numpy's retries) and a draft equal to
    the target (1 - alpha* = 0, below the grouped build's room: the exact path) are built by Python, the same
    tables either way."""
    rng = np.random.default_rng(5)
    logits = 3.0 * rng.standard_normal(6000)
    p = np.exp(logits - logits.max())
    close = p * np.exp(0.05 * rng.standard_normal(6000))
    for target, draft in ((p / p.sum(), close / close.sum()), (p / p.sum(), p / p.sum())):
        one_call, two_calls, answered = _tables_with_and_without_the_row_build(target, draft, 8)
        assert not answered
        _assert_same_tables(one_call, two_calls)


def test_a_library_whose_row_build_disagrees_is_refused():
    """Negative control of the row build's probe: the real function with two tokens of different items
    swapping items (a scatter gone wrong), and with the acceptance moved by 1e-13."""
    require_native_code()
    function = native._library().specbound_build_row

    def swapped(*args):
        items = function(*args)
        item = np.ctypeslib.as_array(ctypes.cast(args[8], ctypes.POINTER(ctypes.c_int64)), shape=(args[2],))
        other = int(np.flatnonzero(item != item[0])[0])
        item[0], item[other] = item[other], item[0]
        return items

    def off(*args):
        items = function(*args)
        scalars = np.ctypeslib.as_array(ctypes.cast(args[11], ctypes.POINTER(ctypes.c_double)), shape=(2,))
        scalars[0] += 1e-13
        return items

    native._probe_build_row(function)
    for wrong in (swapped, off):
        with pytest.raises(RuntimeError, match="row build disagrees"):
            native._probe_build_row(wrong)


@given(degenerate_pairs(), st.integers(0, 3), st.integers(0, 2**32 - 1))
def test_the_one_call_row_build_is_the_two_native_calls_bitwise_on_degenerate_pairs(case, padding, seed):
    """The families that break verifiers (one-hot p or q, disjoint supports, q ~ 1e-18 or subnormal, p = q,
    peaked q, alpha* = 1 with a tight set, ties, n above the draft's support), alone or among 10-1,000 tokens
    the draft leaves out (cut to the support, or passed whole): the same tables, or both handed to Python."""
    p, q, n = case
    if n == 1:
        n = 2
    if padding:
        rng = np.random.default_rng(seed)
        extra = int(rng.integers(10, 1000)) if padding > 1 else p.shape[0]  # more absent tokens, or as many
        p = np.concatenate([p, rng.dirichlet(np.ones(extra))]) / 2.0
        q = np.concatenate([q, np.zeros(extra)])
        order = rng.permutation(p.shape[0])
        p, q = p[order] / p.sum(), q[order]
    one_call, two_calls, _ = _tables_with_and_without_the_row_build(p, q, n)
    _assert_same_tables(one_call, two_calls)
