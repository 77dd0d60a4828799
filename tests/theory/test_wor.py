"""The without-replacement quadrature of theory._wor against successive sampling enumerated exactly.

The oracle enumerates every ordered draw with each denominator the sum of the not-yet-drawn masses (in floats
and in ``fractions.Fraction``); the quadrature must match it on every prefix.
"""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.theory.test_multidraft import TOL, brute_force, law_of, positive_support
from theory import (
    optimal_acceptance,
    strategies,
)
from theory._wor import (
    _branch_and_bound,
    _fill_trivial_prefixes,
    _PrefixInclusion,
    _series_coefficients,
    wor_prefix_inclusion,
    wor_prefix_inclusion_two,
    wor_prefix_minimiser,
)

# ---------------------------------------------------------------------------------------------------------
# The without-replacement quadrature


def exact_prefix_inclusion(q, n, exact=False):
    """Q_n(H_k) for every prefix of the given order, by enumerating successive sampling."""
    values = [Fraction(0) if exact else 0.0 for _ in range(len(q) + 1)]
    tokens = np.flatnonzero(q).tolist()
    weights = [Fraction(x) for x in q] if exact else q
    for combo in itertools.permutations(tokens, n):
        probability, left = Fraction(1) if exact else 1.0, list(tokens)
        for x in combo:
            probability *= weights[x] / sum(weights[y] for y in left)
            left.remove(x)
        for k in range(max(combo) + 1, len(q) + 1):
            values[k] += probability
    return np.array([float(v) for v in values])


def suffix_sums(q):
    suffix = np.zeros(q.shape[-1] + 1)
    suffix[:-1] = np.cumsum(q[::-1])[::-1]
    return suffix


def test_float_enumeration_oracle_matches_exact_rational_arithmetic():
    q = np.random.default_rng(11).dirichlet(np.full(5, 0.3))
    np.testing.assert_allclose(
        exact_prefix_inclusion(q, 3), exact_prefix_inclusion(q, 3, exact=True), atol=1e-15
    )


@pytest.mark.parametrize("n", range(3, 9))
def test_quadrature_matches_enumeration_for_three_to_eight_drafts(n):
    rng = np.random.default_rng(100 + n)
    worst = 0.0
    for concentration in (0.1, 0.5, 3.0):
        q = rng.dirichlet(np.full(8, concentration))
        if positive_support(q) < n:
            continue
        quadrature = wor_prefix_inclusion(q[None], suffix_sums(q)[None], n)[0]
        worst = max(worst, np.max(np.abs(quadrature - exact_prefix_inclusion(q, n))))
    assert worst < 1e-12


@given(strategies.distributions(vocab_size=st.integers(2, 7), min_probability=0.0), st.integers(2, 4))
def test_quadrature_matches_enumeration_on_every_prefix(q, n):
    outside = suffix_sums(q)
    if positive_support(q) < n or np.any((outside > 0) & (outside < 1e-300)):
        return  # the quadrature's documented domain: mass outside the set is 0 or at least 1e-300
    quadrature = wor_prefix_inclusion(q[None], outside[None], n)[0]
    np.testing.assert_allclose(quadrature, exact_prefix_inclusion(q, n), atol=1e-11, rtol=0)


def test_quadrature_matches_exact_two_draft_formula_at_lm_vocabulary_size():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal(50_000) * 3.0
    q = np.exp(logits - logits.max())
    q /= q.sum()
    suffix = suffix_sums(q)[None]
    quadrature = wor_prefix_inclusion(q[None], suffix, 2)
    exact = wor_prefix_inclusion_two(q[None], suffix)
    assert np.max(np.abs(quadrature - exact)) < 1e-12


def test_exact_two_draft_formula_matches_enumeration():
    q = np.random.default_rng(4).dirichlet(np.ones(7))
    exact = wor_prefix_inclusion_two(q[None], suffix_sums(q)[None])[0]
    np.testing.assert_allclose(exact, exact_prefix_inclusion(q, 2), atol=1e-15)


def exact_three_draft_prefix_inclusion(q):
    """Q_3(H_k) for every prefix, exactly in O(V^2) per prefix (independent of the quadrature).

    Q_3(H) = sum over ordered pairs i != j in H of q_i q_j / (1 - q_i) * (x - q_i - q_j) / (1 - q_i - q_j):
    the first two draws are i then j, the third lands in the rest of H.
    """
    values = np.zeros(len(q) + 1)
    for k in range(3, len(q) + 1):
        h = q[:k]
        x, rest = h.sum(), q[k:].sum()
        first = h[:, None] * h[None, :] / (x - h[:, None] + rest)  # 1 - q_i as the other tokens' mass
        third = (x - h[:, None] - h[None, :]) / (x - h[:, None] - h[None, :] + rest)
        terms = first * third
        np.fill_diagonal(terms, 0.0)
        values[k] = terms.sum()
    return values


def test_quadrature_matches_exact_three_draft_formula_with_both_token_classes_and_dropped_grid_points():
    # A peaked q with a long tail: the tail tokens go through the moment series, the large ones through the
    # recursion, and the grid points where n = 3 tokens ring surely leave the integrand. All must stay exact.
    rng = np.random.default_rng(8)
    q = np.exp(rng.standard_normal(300) * 4.0)
    q /= q.sum()
    suffix = suffix_sums(q)
    reads = np.arange(3, 300)
    evaluator = _PrefixInclusion(q, suffix, 3, reads[suffix[reads] > 0])
    assert 0 < evaluator.large_positions.size < 250  # both classes are used
    assert evaluator.points < evaluator.grid.size  # grid points were dropped
    quadrature = wor_prefix_inclusion(q[None], suffix[None], 3)[0]
    np.testing.assert_allclose(quadrature, exact_three_draft_prefix_inclusion(q), atol=1e-12, rtol=0)


def test_series_coefficients_are_the_taylor_coefficients_of_powers_of_expm1():
    # (e^a - 1)^m = sum_l C(m, l) (-1)^(m - l) e^(l a), so the a^r coefficient is sum_l ... l^r / r! (exact).
    coefficients = _series_coefficients(8)
    for m in range(8):
        for r in range(coefficients.shape[1]):
            exact = sum(
                Fraction(math.comb(m, ell) * (-1) ** (m - ell) * ell**r, math.factorial(r))
                for ell in range(m + 1)
            )
            assert coefficients[m, r] == pytest.approx(float(exact), rel=1e-14, abs=1e-300)


def random_lm_like_row(seed):
    """A target/draft pair shaped like LM next-token distributions, with random V and n, in ratio order."""
    rng = np.random.default_rng(1000 + seed)
    vocab, n = int(rng.integers(50, 1500)), int(rng.integers(3, 7))
    logits = rng.standard_normal(vocab) * rng.uniform(0.5, 5.0)
    p = np.exp(logits - logits.max())
    q = np.exp(logits + rng.standard_normal(vocab) * rng.uniform(0.1, 2.0))
    order = np.argsort(p / q)
    target = np.concatenate([[0.0], np.cumsum(p[order] / p.sum())])
    return target, q[order] / q.sum(), n


def minimiser_against_full_evaluation(seed, bound=None):
    """(min over the prefixes wor_prefix_minimiser evaluated, min over every prefix, evaluations, prefixes)."""
    target, q_sorted, n = random_lm_like_row(seed)
    suffix = suffix_sums(q_sorted)
    candidates = np.ones(target.size, dtype=bool)
    bound = np.ones(target.size) if bound is None else bound(target.size)  # Q <= 1 always holds
    searched = wor_prefix_minimiser(target, q_sorted, suffix, n, candidates, bound)
    full = wor_prefix_inclusion(q_sorted[None], suffix[None], n)[0]
    return (
        np.nanmin(target - searched),
        np.min(target - full),
        np.count_nonzero(~np.isnan(searched)),
        target.size,
    )


@pytest.mark.parametrize("batch", [64, 8])
def test_branch_and_bound_finds_the_minimum_over_every_prefix(monkeypatch, batch):
    # Rounds of 8 prefixes take many pruning steps; they caught a version that used a ruled-out (never
    # evaluated) prefix as the next evaluated one and missed the minimum by 1e-7.
    import theory._wor as wor

    monkeypatch.setattr(wor, "PREFIX_BATCH", batch)
    pruned = 0
    for seed in range(25):
        searched, full, evaluated, prefixes = minimiser_against_full_evaluation(seed)
        assert searched == pytest.approx(full, abs=1e-13), seed
        pruned += evaluated < prefixes
    assert pruned > 20  # it does skip prefixes


def test_branch_and_bound_with_an_invalid_bound_is_caught():
    # Negative control: claiming Q <= 0 rules out every prefix after the first round, which must miss the
    # minimum on some row, so the test above can fail.
    misses = [
        abs(searched - full)
        for seed in range(5)
        for searched, full, _, _ in [minimiser_against_full_evaluation(seed, bound=np.zeros)]
    ]
    assert max(misses) > 1e-9


def test_exact_three_draft_formula_matches_enumeration():
    q = np.random.default_rng(9).dirichlet(np.ones(7))
    np.testing.assert_allclose(
        exact_three_draft_prefix_inclusion(q), exact_prefix_inclusion(q, 3), atol=1e-15
    )


def test_quadrature_on_requested_prefixes_equals_the_full_quadrature_there():
    rng = np.random.default_rng(12)
    q = rng.dirichlet(np.full(400, 0.2))
    suffix = suffix_sums(q)[None]
    wanted = rng.random(401) < 0.1
    partial = wor_prefix_inclusion(q[None], suffix, 4, prefixes=wanted[None])[0]
    full = wor_prefix_inclusion(q[None], suffix, 4)[0]
    assert np.all(np.isnan(partial[~wanted]))
    # The grids differ (each spans its own smallest complement mass), hence 1e-13 rather than round-off.
    np.testing.assert_allclose(partial[wanted], full[wanted], atol=1e-13, rtol=0)


def test_without_replacement_with_a_complement_mass_far_below_every_other_mass_is_exact():
    # Found by hypothesis: the prefix of the three 1/3 tokens leaves s = 3.3e-49, so its integrand lives at
    # t ~ 1/s; a grid cut at s = 1e-30 returned alpha* = 1. By hand: H = those three tokens has
    # Q_3(H) = 1 - O(1e-48) and p(H) = 3/7, so alpha* = 1 + 3/7 - 1 = 3/7 (and the brute force agrees).
    p = np.full(7, 1 / 7)
    q = np.array([0.0, 0.0, 0.0, 1 / 3, 1 / 3, 1 / 3, 3.33333333e-49])
    q /= q.sum()
    expected, _ = brute_force(p, law_of(q, 3, "wor"))
    assert expected == pytest.approx(3 / 7, abs=1e-12)
    assert optimal_acceptance(p, q, 3, draft="wor") == pytest.approx(3 / 7, abs=TOL)


def test_quadrature_with_a_coarse_grid_is_caught(monkeypatch):
    # Negative control: the accuracy tests above must fail for a visibly too coarse trapezoid step.
    import theory._wor as wor

    monkeypatch.setattr(wor, "QUADRATURE_STEP", 1.5)
    q = np.random.default_rng(105).dirichlet(np.full(8, 0.5))
    quadrature = wor.wor_prefix_inclusion(q[None], suffix_sums(q)[None], 5)[0]
    assert np.max(np.abs(quadrature - exact_prefix_inclusion(q, 5))) > 1e-9


# ---------------------------------------------------------------------------------------------------------
# The batched branch and bound against the former one-row-per-call version


def one_row_minimiser(target_mass, q_sorted, suffix, n, candidates, inclusion_bound, dust=0.0):
    """One row alone on the per-row path (its trivial prefixes, then its branch and bound on its own
    :class:`_PrefixInclusion`, rounds of ``PREFIX_BATCH``): the oracle of the rows-together evaluation."""
    inclusion = np.full(suffix.shape, np.nan)
    reads = _fill_trivial_prefixes(inclusion, suffix, n, candidates, dust > 0)
    if reads.size:
        _branch_and_bound(inclusion, reads, target_mass, q_sorted, suffix, n, inclusion_bound, dust)
    return inclusion


@st.composite
def minimiser_batches(draw):
    """Batches of rows in ratio order with degenerate rows mixed in: zero-mass tokens, a token holding almost
    all the mass, a complement mass that reaches 0 before the end, no candidates, every candidate, tiny V, rows
    with Poisson dust or without, rows with more candidates than PREFIX_BATCH (the per-row branch and bound) and
    with fewer (evaluated together)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rows, vocab, n = draw(st.integers(1, 6)), draw(st.integers(1, 150)), draw(st.integers(2, 8))
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.full(vocab, draw(st.sampled_from([0.05, 0.5, 3.0]))), size=rows)
    kind = draw(
        st.lists(st.sampled_from(["plain", "zeros", "spike", "tail_zero"]), min_size=rows, max_size=rows)
    )
    for row, how in enumerate(kind):
        if how == "zeros":
            q[row, rng.random(vocab) < 0.5] = 0.0
        elif how == "spike":
            q[row] = 1e-12
            q[row, rng.integers(vocab)] = 1.0
        elif how == "tail_zero":
            q[row, vocab // 2 :] = 0.0
        if q[row].sum() == 0:
            q[row, 0] = 1.0
        q[row] /= q[row].sum()
    suffix = np.zeros((rows, vocab + 1))
    suffix[:, :-1] = np.cumsum(q[:, ::-1], axis=1)[:, ::-1]
    target = np.concatenate(
        [np.zeros((rows, 1)), np.cumsum(rng.dirichlet(np.ones(vocab), size=rows), axis=1)], 1
    )
    share = draw(st.sampled_from([0.0, 0.3, 1.0]))
    candidates = rng.random((rows, vocab + 1)) < share
    bound = np.minimum(1.0, (1.0 - suffix) * rng.uniform(0.0, 1.5, size=(rows, vocab + 1)))
    dust = np.where(rng.random(rows) < draw(st.sampled_from([0.0, 0.5, 1.0])), rng.uniform(0, 0.5, rows), 0.0)
    q *= 1.0 - dust[:, None]
    suffix *= 1.0 - dust[:, None]
    return target, q, suffix, n, candidates, bound, dust


@settings(max_examples=300)
@given(minimiser_batches())
def test_batched_minimiser_equals_the_one_row_version_bit_for_bit(batch):
    target, q, suffix, n, candidates, bound, dust = batch
    batched = wor_prefix_minimiser(target, q, suffix, n, candidates, bound, dust)
    expected = np.stack(
        [
            one_row_minimiser(*row, n, c, b, r)
            for *row, c, b, r in zip(target, q, suffix, candidates, bound, dust, strict=True)
        ]
    )
    np.testing.assert_array_equal(batched, expected)  # NaN in the same places, every value identical
    single = wor_prefix_minimiser(target[0], q[0], suffix[0], n, candidates[0], bound[0], dust[0])
    np.testing.assert_array_equal(single, expected[0])


@pytest.mark.parametrize("batch", [64, 8])
def test_minimiser_equals_one_row_runs_over_many_rounds_bit_for_bit(monkeypatch, batch):
    # LM-sized rows with hundreds of candidates: several rounds of pruning, rows finishing at different rounds,
    # next to rows settled by their first round.
    import theory._wor as wor

    monkeypatch.setattr(wor, "PREFIX_BATCH", batch)
    rows = [random_lm_like_row(seed) for seed in range(8)]
    width = max(r[0].size for r in rows)
    target, q = np.ones((8, width)), np.zeros((8, width - 1))
    for b, (t, q_row, _) in enumerate(rows):
        target[b, : t.size], q[b, : q_row.size] = t, q_row
    suffix = np.stack([suffix_sums(row) for row in q])
    candidates, bound = np.ones(target.shape, dtype=bool), np.minimum(1.0, 1.0 - suffix)
    dust = np.zeros(8)
    batched = wor.wor_prefix_minimiser(target, q, suffix, 4, candidates, bound, dust)
    for b in range(8):
        expected = one_row_minimiser(target[b], q[b], suffix[b], 4, candidates[b], bound[b])
        np.testing.assert_array_equal(batched[b], expected)
    assert np.count_nonzero(~np.isnan(batched) & (suffix > 0)) < 0.9 * np.count_nonzero(
        suffix > 0
    )  # it prunes


def test_batched_minimiser_oracle_comparison_can_fail():
    # Negative control: a batch whose rows are shuffled against the oracle's must differ somewhere.
    rng = np.random.default_rng(3)
    q = rng.dirichlet(np.full(40, 0.3), size=3)
    suffix = np.zeros((3, 41))
    suffix[:, :-1] = np.cumsum(q[:, ::-1], axis=1)[:, ::-1]
    target = np.concatenate([np.zeros((3, 1)), np.cumsum(rng.dirichlet(np.ones(40), size=3), axis=1)], 1)
    candidates, bound = np.ones((3, 41), dtype=bool), np.ones((3, 41))
    batched = wor_prefix_minimiser(target, q, suffix, 4, candidates, bound)
    shuffled = np.stack(
        [
            one_row_minimiser(target[i], q[j], suffix[j], 4, candidates[i], bound[i])
            for i, j in enumerate([1, 2, 0])
        ]
    )
    assert not np.array_equal(batched, shuffled, equal_nan=True)


# ---------------------------------------------------------------------------------------------------------
# Poisson dust inside every prefix


def exact_dust_prefix_inclusion(q, dust, n, exact=False):
    """Q_n(H_k + dust) for every prefix k, by enumerating the first n arrivals of successive sampling from the
    tokens of ``q`` plus a Poisson process of rate ``dust`` (an arrival is dust with probability dust / (dust +
    undrawn token mass), memoryless, and drawing dust depletes nothing; ``q`` and ``dust`` sum to 1)."""
    one = Fraction(1) if exact else 1.0
    weights = [Fraction(x) for x in q] if exact else list(q)
    rate = Fraction(dust) if exact else dust
    values = [0 * one for _ in range(len(q) + 1)]
    tokens = np.flatnonzero(q).tolist()

    def walk(drawn, probability, depth):
        if depth == n:
            last = max(drawn, default=-1)
            for k in range(last + 1, len(q) + 1):
                values[k] += probability
            return
        left = rate + sum(weights[y] for y in tokens if y not in drawn)
        walk(drawn, probability * rate / left, depth + 1)
        for x in tokens:
            if x not in drawn:
                walk(drawn | {x}, probability * weights[x] / left, depth + 1)

    walk(frozenset(), one, 0)
    return np.array([float(v) for v in values])


def dusty_row(seed, vocab=6, concentration=0.5):
    rng = np.random.default_rng(seed)
    dust = float(rng.uniform(0.05, 0.6))
    q = rng.dirichlet(np.full(vocab, concentration)) * (1.0 - dust)
    return q, dust


def test_dust_enumeration_in_floats_matches_exact_rationals_and_the_empty_prefix_is_r_to_the_n():
    q, dust = dusty_row(1)
    floats = exact_dust_prefix_inclusion(q, dust, 3)
    np.testing.assert_allclose(floats, exact_dust_prefix_inclusion(q, dust, 3, exact=True), atol=1e-15)
    assert floats[0] == pytest.approx(dust**3, rel=1e-14)  # only dust: every arrival is dust w.p. r


def test_dust_enumeration_is_the_limit_of_splitting_the_dust_into_many_tokens():
    # M tokens of r/M each (enumerated as ordinary tokens) approach the Poisson dust within n(n-1)/(2M).
    q, dust = dusty_row(2, vocab=3)
    n, tokens = 3, 6
    split = np.concatenate([np.full(tokens, dust / tokens), q])
    inclusion = exact_prefix_inclusion(split, n)[tokens:]  # prefixes holding all the split dust
    poisson = exact_dust_prefix_inclusion(q, dust, n)
    assert np.all(inclusion <= poisson + 1e-15)
    assert np.max(poisson - inclusion) <= n * (n - 1) / (2 * tokens)


@pytest.mark.parametrize("n", range(2, 7))
def test_quadrature_with_dust_matches_enumeration_on_every_prefix_including_those_below_n_tokens(n):
    worst = 0.0
    for seed, concentration in enumerate((0.1, 0.5, 3.0)):
        q, dust = dusty_row(10 * n + seed, concentration=concentration)
        outside = suffix_sums(q)
        quadrature = wor_prefix_inclusion(q[None], outside[None], n, dust=np.array([dust]))[0]
        worst = max(worst, np.max(np.abs(quadrature - exact_dust_prefix_inclusion(q, dust, n))))
    assert worst < 1e-12


def test_exact_two_draft_formula_with_dust_matches_enumeration():
    q, dust = dusty_row(3, vocab=7)
    exact = wor_prefix_inclusion_two(q[None], suffix_sums(q)[None], np.array([dust]))[0]
    np.testing.assert_allclose(exact, exact_dust_prefix_inclusion(q, dust, 2), atol=1e-15)


@given(
    strategies.distributions(vocab_size=st.integers(2, 6), min_probability=0.0),
    st.floats(0.0, 0.95),
    st.integers(2, 4),
)
# Found by hypothesis: two tokens, three drafts, the smallest dust. After both tokens the third arrival is dust
# with probability 1, so the whole vocabulary's prefix holds the three arrivals with probability 1.
@example(q=np.array([0.5, 0.5]), dust=5e-324, n=3)
def test_quadrature_with_dust_matches_enumeration_for_any_rate(q, dust, n):
    q = q * (1.0 - dust)
    outside = suffix_sums(q)
    if np.any((outside > 0) & (outside < 1e-300)) or (dust == 0 and positive_support(q) < n):
        return  # the quadrature's documented domain
    quadrature = wor_prefix_inclusion(q[None], outside[None], n, dust=np.array([dust]))[0]
    # The oracle in rationals: in floats a subnormal dust underflows (0.5 * 5e-324 / 5e-324 is 0, not 0.5), and
    # the enumeration said 0 where every arrival after the last token must be dust (probability 1).
    expected = exact_dust_prefix_inclusion(q, dust, n, exact=True)
    np.testing.assert_allclose(quadrature, expected, atol=1e-11, rtol=0)


def test_dust_comparison_can_fail():
    # Negative controls: a dust that depletes (one token of mass r) and a quadrature that forgets the dust
    # both differ from the Poisson enumeration by far more than the tolerance.
    q, dust = dusty_row(4)
    poisson = exact_dust_prefix_inclusion(q, dust, 3)
    one_token = exact_prefix_inclusion(np.concatenate([[dust], q]), 3)[1:]
    assert np.max(np.abs(one_token - poisson)) > 1e-3
    forgotten = wor_prefix_inclusion(q[None], suffix_sums(q)[None], 3)[0]
    assert np.nanmax(np.abs(forgotten - poisson)) > 1e-3


@pytest.mark.parametrize("seed", range(8))
def test_branch_and_bound_with_dust_finds_the_minimum_over_every_prefix(seed):
    target, q_sorted, n = random_lm_like_row(seed)
    dust = 0.05 + 0.1 * (seed % 3)
    q_sorted = q_sorted * (1.0 - dust)
    suffix = suffix_sums(q_sorted)
    candidates, bound = np.ones(target.size, dtype=bool), np.ones(target.size)
    searched = wor_prefix_minimiser(target, q_sorted, suffix, n, candidates, bound, dust)
    full = wor_prefix_inclusion(q_sorted[None], suffix[None], n, dust=np.array([dust]))[0]
    assert np.nanmin(target - searched) == pytest.approx(np.min(target - full), abs=1e-13)
    assert not np.isnan(searched[0])  # prefixes below n tokens are evaluated when there is dust


# ---------------------------------------------------------------------------------------------------------
# Subnormal draft masses: one token holds all but ~1e-310 of q


PEAKED_Q = [
    [1.0, 1e-310, 0.0],
    [1.0, 1e-310, 1e-311],
    [0.6, 0.4 - 1e-310, 1e-310],
    [1.0, 5e-324, 0.0],
    [0.5, 0.3, 0.2 - 2e-305, 2e-305, 0.0],
]


@pytest.mark.parametrize("q", PEAKED_Q)
def test_exact_two_draw_inclusion_stays_finite_when_the_largest_token_leaves_a_subnormal_rest(q):
    # 1 - q_i of the largest token is subnormal: q_i / (1 - q_i) overflows, and before the fix inf * 0 = NaN.
    q = np.array(q)
    with np.errstate(over="raise", invalid="raise"):
        values = wor_prefix_inclusion_two(q[None], suffix_sums(q)[None])[0]
    np.testing.assert_allclose(values, exact_prefix_inclusion(q, 2), atol=1e-15)


@pytest.mark.parametrize("q", PEAKED_Q)
@pytest.mark.parametrize("n", [2, 3])
def test_optimal_acceptance_without_replacement_equals_brute_force_on_subnormal_masses(q, n):
    q = np.array(q)
    if np.count_nonzero(q) < n:
        return
    p = np.array([0.4, 0.3, 0.2, 0.1, 0.0])[: q.size]
    p /= p.sum()
    with np.errstate(over="raise", invalid="raise"):  # no overflow or invalid value on the way
        value = optimal_acceptance(p, q, n, draft="wor")
    assert abs(value - brute_force(p, law_of(q, n, "wor"))[0]) <= 1e-12


def test_without_replacement_refuses_what_its_quadrature_cannot_resolve_instead_of_guessing():
    # After the dominant token only ~1e-301 of mass is left, spread so that the third draw still matters: the
    # quadrature's grid cannot reach it and the bounds disagree. It used to return 1.0 (the optimum is 0.992).
    q = np.array([1.0, 1e-300, 1e-301, 1e-302])
    p = np.array([0.4, 0.3, 0.2, 0.1])
    assert abs(brute_force(p, law_of(q, 3, "wor"))[0] - 0.9918010719990915) < 1e-12
    with pytest.raises(ValueError, match="draft='wor' with n = 3: .* below the 1e-300"):
        optimal_acceptance(p, q, 3, draft="wor")
    assert abs(optimal_acceptance(p, q, 2, draft="wor") - brute_force(p, law_of(q, 2, "wor"))[0]) <= 1e-12
