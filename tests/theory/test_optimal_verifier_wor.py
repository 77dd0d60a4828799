"""The optimal verifier for drafts without replacement: exact output law, acceptance = alpha*_wor, exact marginal.

Oracles re-derived here: the output law, the selection marginal and the acceptance P(output in drafts) by
enumerating every ordered draft tuple of successive sampling (``enumerate_drafts(q, n, "wor")``); alpha*_wor by
brute force over all 2^V token sets with Q(H) summed from the same enumeration, and by
``optimal_acceptance(..., draft="wor")``; ``check_lossless(..., draft="wor")`` with a negative control whose
marginal is moved by 1e-6. The families are those of ``test_optimal_verifier`` (one-hot p or q, disjoint
supports, q = 1e-18, p = q, peaked q, alpha* = 1 with a tight set, ties), with n at most the draft's support.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.theory.test_optimal_verifier import degenerate_pairs, enumerated, perturbed
from theory import check_lossless, optimal_acceptance, optimal_verifier, optimal_verifier_wor, strategies
from theory.draft_laws import enumerate_drafts, sample_drafts

wor_module = importlib.import_module("theory.optimal_verifier_wor")
NEGLIGIBLE_Q = importlib.import_module("theory.optimal_verifier").NEGLIGIBLE_Q


@st.composite
def cases(draw):
    """V <= 7, 1 <= n <= min(4, support of q)."""
    if draw(st.booleans()):
        p, q, n = draw(degenerate_pairs())
    else:
        p, q = draw(strategies.distribution_pairs(vocab_size=st.integers(1, 6), min_probability=0.0))
        n = draw(st.integers(1, 4))
    # Refused (test_negligible_draft_mass_is_refused); twice the bound, since the renormalisation below can take
    # an entry at the bound just under it (CI drew q with an entry 1e-300 that came out below 1e-300).
    q = np.where(q < 2 * NEGLIGIBLE_Q, 0.0, q)
    if q.sum() <= 0 or p.sum() <= 0:
        p, q = np.ones_like(p), np.ones_like(q)
    p, q = p / p.sum(), q / q.sum()
    return p, q, max(1, min(n, 4, int(np.count_nonzero(q))))


def brute_force_optimum(p, q, n, tuples, probabilities):
    """alpha*_wor = 1 + min over all 2^V sets H of p(H) - P(every draft in H)."""
    vocab = p.shape[-1]
    sets = ((np.arange(2**vocab)[:, None] >> np.arange(vocab)) & 1).astype(bool)
    inside = sets[:, tuples].all(axis=-1)  # (2^V, M)
    return float(1.0 + np.min(sets @ p - inside @ probabilities))


@given(cases())
def test_output_law_equals_target_by_enumeration(case):
    p, q, n = case
    v = optimal_verifier_wor(p, q, n)
    output, _, _ = enumerated(v, q, n, "wor")
    np.testing.assert_allclose(output, p, rtol=0, atol=1e-12)


# A token with p = 5.6e-8 sat under HiGHS's default feasibility tolerance: its target was 1e-9, shortfall 1e-3.
TINY_TARGET_TOKEN = (
    np.array([5.60984861e-08, 0.0, 0.0, 9.41176418e-01, 5.88235261e-02, 0.0]),
    np.array(
        [1.69379978e-07, 2.09753408e-05, 4.62012627e-01, 4.70609184e-01, 2.94327384e-02, 3.79243058e-02]
    ),
    3,
)

# A token of mass 2e-167 tied in p/q with two tokens of mass 1/3: its share of the class target was 2e-167, which
# Newton could not reach (the others stopped 8e-7 short: shortfall 4.1e-7). The shared newton_fit reaches it.
NEGLIGIBLE_TIED_TOKEN = (
    np.array([0.0, 0.0, 1 / 3, 1 / 3, 2.0586477292169566e-167, 0.0, 1 / 3]),
    np.array(
        [
            1e-18,
            0.0,
            0.23269653761889864,
            0.38365173119055074,
            2.3694112956766908e-167,
            0.0,
            0.38365173119055074,
        ]
    ),
    2,
)


WOR_TOP_EIGHT_PAIR = (
    np.array(
        [
            9.6004241568845738e-01,
            4.7384381506724381e-07,
            1.1453688853755334e-03,
            3.3588416467972397e-05,
            1.1357670752932271e-02,
            9.3127108597188934e-03,
            7.7923075596528734e-06,
            1.8178663920903677e-07,
            1.8099797459033954e-02,
        ]
    ),
    np.array(
        [
            2.1505756997711820e-01,
            6.9926020415191859e-01,
            4.0827627659531747e-02,
            2.8329275270117277e-02,
            1.6540391141977911e-07,
            1.5193132592768220e-20,
            3.8952478523550356e-03,
            3.6483191964720315e-03,
            8.9815904885756186e-03,
        ]
    ),
)


@given(cases())
@example(TINY_TARGET_TOKEN)
@example(NEGLIGIBLE_TIED_TOKEN)
def test_acceptance_reaches_the_without_replacement_optimum(case):
    p, q, n = case
    v = optimal_verifier_wor(p, q, n)
    _, _, acceptance = enumerated(v, q, n, "wor")
    tuples, probabilities = enumerate_drafts(q, n, "wor")
    assert abs(v.alpha_star - brute_force_optimum(p, q, n, tuples, probabilities)) <= 1e-12
    assert abs(v.alpha_star - optimal_acceptance(p, q, n, draft="wor")) <= 1e-9
    assert abs(acceptance - v.acceptance) <= 1e-12
    assert 0.0 <= v.shortfall <= 1e-9


@given(cases())
def test_marginal_equals_the_enumerated_selection_marginal(case):
    p, q, n = case
    v = optimal_verifier_wor(p, q, n)
    _, selection, _ = enumerated(v, q, n, "wor")
    np.testing.assert_allclose(v.marginal, selection, rtol=0, atol=1e-12)


@given(cases())
def test_check_lossless_passes_it_and_flags_a_perturbed_marginal(case):
    p, q, n = case
    v = optimal_verifier_wor(p, q, n)
    report = check_lossless(lambda p_, q_, drafts: v.conditional(drafts), p, q, n, draft="wor")
    assert report.lossless, str(report)
    copy, a = perturbed(v, q)
    if copy is not None and v.p[a] >= 1e-2 * v.marginal[a]:
        bad = check_lossless(lambda p_, q_, drafts: copy.conditional(drafts), p, q, n, draft="wor")
        assert not bad.lossless, str(bad)


def test_a_class_target_just_outside_the_polytope_still_reaches_alpha_star():
    """A SmolLM2 pair (T = 1, cut to its top 8 tokens + rest; benchmark ``--wor-tokens 8``), n = 3: within
    HiGHS's tolerance the LP gave two tokens of the upper class targets 2.7e-10 and 2.3e-10 above the most
    they can win (a token of q = 1.5e-20 can win at most 1.9e-19). The fit then centred its steps on a mean
    that those tokens' steps dominated and stopped 0.023 off: shortfall 1.1e-2. Exact and within 1e-9 now."""
    p, q = WOR_TOP_EIGHT_PAIR
    v = optimal_verifier_wor(p, q, 3)
    output, _, acceptance = enumerated(v, q, 3, "wor")
    np.testing.assert_allclose(output, p, rtol=0, atol=1e-12)
    # P(output in drafts) counts sum min(p, r) and residual draws that hit another draft.
    assert v.acceptance - 1e-12 <= acceptance <= v.alpha_star + 1e-12
    assert 0.0 <= v.shortfall <= 1e-9


def test_lp_targets_outside_the_singleton_bounds_are_clipped(monkeypatch):
    """The pair above: HiGHS puts two upper-class targets 2.9e-10 and 2.4e-10 (of the class mass) above the
    most those tokens can win. Newton then stops short of them (shortfall 7.4e-11 with the targets as the LP
    left them); clipped into the singleton bounds, the mass moved given to the tokens with room, the build
    reaches alpha*_wor to round-off."""
    calls = []
    original = wor_module._into_singleton_bounds

    def spy(target, low, high, p, above):
        clipped = original(target, low, high, p, above)
        calls.append((target, high, clipped))
        return clipped

    monkeypatch.setattr(wor_module, "_into_singleton_bounds", spy)
    p, q = WOR_TOP_EIGHT_PAIR
    v = optimal_verifier_wor(p, q, 3)
    assert any(np.any(target > high + 1e-11) for target, high, _ in calls)  # the LP left the polytope
    assert all(np.all(clipped <= high) for _, high, clipped in calls)
    assert 0.0 <= v.shortfall <= 1e-12
    assert abs(v.alpha_star - optimal_acceptance(p, q, 3, draft="wor")) <= 1e-12


@st.composite
def clip_cases(draw):
    """Bounds low <= high around a point x summing to 1, p on the side of x the class asks for, and a
    target moved from x by a zero-sum step that may leave the bounds."""
    size = draw(st.integers(2, 6))
    unit = st.floats(0.0, 1.0)
    low = np.array(draw(st.lists(unit, min_size=size, max_size=size)))
    width = np.array(draw(st.lists(unit, min_size=size, max_size=size)))
    share = np.array(draw(st.lists(unit, min_size=size, max_size=size)))
    high = low + width
    x = low + share * width
    scale = x.sum()
    if scale <= 1e-6:
        low, high, x, scale = np.zeros(size), np.ones(size), np.full(size, 1.0 / size), 1.0
    low, high, x = low / scale, high / scale, x / scale
    above = draw(st.booleans())
    slack = np.array(draw(st.lists(unit, min_size=size, max_size=size))) / size
    p = x + slack if above else np.maximum(x - slack, 0.0)
    a, b = draw(st.integers(0, size - 1)), draw(st.integers(0, size - 1))
    step = draw(st.floats(-0.5, 0.5))
    target = x.copy()
    target[a] += step
    target[b] -= step
    return target, low, high, p, above


@given(clip_cases())
@example(  # the room above p (token 0's) is one ulp short of the deficit: it used to take from token 2 below p
    (
        np.array([1.10377358, -0.5, 0.39622642]),
        np.array([0.60377358, 0.0, 0.30188679]),
        np.array([1.20754717, 0.0, 0.49056604]),
        np.array([0.60377358, 0.0, 0.39622642]),
        False,
    )
)
@example(  # the only room (token 1's, to its bound) is 6e-17 short of the excess: it used to move nothing
    (
        np.array([0.67857142857142860, 0.32142857142857145]),
        np.array([0.42857142857142855, 0.0]),
        np.array([0.42857142857142855, 0.57142857142857140]),
        np.array([0.42857142857142855, 0.57142857142857140]),
        False,
    )
)
def test_clipped_targets_stay_in_the_singleton_bounds_with_their_sum_and_their_side_of_p(case):
    target, low, high, p, above = case
    clipped = wor_module._into_singleton_bounds(target, low, high, p, above)
    tolerance = 1e-15 * (1.0 + np.abs(target).sum())
    assert np.all(clipped >= low - tolerance) and np.all(clipped <= high + tolerance)
    assert abs(clipped.sum() - target.sum()) <= 4 * tolerance
    # Tokens on the side of p the class asks for stay there (room for the moved mass exists: x is inside).
    if above:
        assert np.all(clipped[target <= p] <= p[target <= p] + tolerance)
    else:
        assert np.all(clipped[target >= p] >= p[target >= p] - tolerance)


def test_without_replacement_beats_the_iid_construction_on_a_peaked_draft():
    """Distinct drafts cover more of p: on a peaked q the wor optimum exceeds the i.i.d. one, and both
    constructions reach their own optimum."""
    p, q = np.array([0.3, 0.3, 0.2, 0.2]), np.array([0.7, 0.1, 0.1, 0.1])
    wor, iid = optimal_verifier_wor(p, q, 3), optimal_verifier(p, q, 3)
    assert wor.acceptance > iid.acceptance + 0.03
    assert wor.shortfall <= 1e-12 and iid.shortfall <= 1e-12


def test_negligible_draft_mass_is_refused():
    """With a q of 5e-324 the class targets overflowed (p / set mass) and scipy's linprog stopped on a NaN
    bound: such rows are refused with the count, the smallest value and the way out, where the i.i.d.
    construction demotes the tokens."""
    p, q = np.array([0.75, 0.05, 0.1, 0.1]), np.array([1e-310, 0.5, 0.25, 0.25])
    with pytest.raises(ValueError, match=r"q has 1 token\(s\) with 0 < q < 1e-300 \(smallest 1e-310\)"):
        optimal_verifier_wor(p, q, 2)
    assert optimal_verifier(p, q, 2).marginal[0] == 0.0
    q[0] = 0.0
    assert optimal_verifier_wor(p, q / q.sum(), 2).shortfall <= 1e-12


def test_repeated_drafts_and_too_many_drafts_are_rejected():
    v = optimal_verifier_wor([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 2)
    with pytest.raises(ValueError, match="distinct"):
        v.conditional([1, 1])
    with pytest.raises(ValueError):
        optimal_verifier_wor([0.5, 0.5, 0.0], [0.5, 0.5, 0.0], 3)


def test_sample_follows_the_target_on_a_fixed_seed():
    """Monte Carlo of the coin-flip sampler (fixed seed), chi-square-free: frequencies within 5 sigma of p;
    the selected draft's frequencies within 5 sigma of the marginal."""
    p, q = np.array([0.1, 0.4, 0.2, 0.3]), np.array([0.4, 0.1, 0.3, 0.2])
    v = optimal_verifier_wor(p, q, 2)
    rng = np.random.default_rng(7)
    drafts = np.array([sample_drafts(q, 2, "wor", rng) for _ in range(20_000)])
    out, selected = v.sample(drafts, rng, return_selected=True)
    for observed, law in ((out, p), (selected, v.marginal)):
        frequency = np.bincount(observed, minlength=4) / observed.shape[0]
        assert np.all(np.abs(frequency - law) <= 5 * np.sqrt(law * (1 - law) / observed.shape[0]) + 1e-12)
