"""Optimal multi-draft acceptance: every method against independent exact oracles and hand-computed values.

Oracles re-derived here rather than trusted: the subset form ``1 + min_H [p(H) - Q(H)]`` with ``Q`` summed
over the enumerated draft law by brute force over all subsets (itertools), the successive-sampling law
enumerated with exact remaining masses (and with ``fractions.Fraction``), and hand calculations.
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import (
    AcceptanceCertificate,
    acceptance_rate,
    optimal_acceptance,
    optimal_acceptance_certificate,
    strategies,
)
from theory.draft_laws import enumerate_drafts, top_tokens
from theory.multidraft import _top_tokens_batched

SORTED_LAWS = ("iid", "wor", "greedy", "spechub")
ORACLES = ("lp", "pot", "cvxpy", "maxflow", "enumerate")
TOL = 1e-9


def positive_support(q):
    return int(np.count_nonzero(q))


def feasible(q, n, draft):
    """Whether the law can draw ``n`` drafts from ``q`` (else the functions must raise)."""
    if draft == "spechub":
        return n == 2 and positive_support(q) >= 2
    return draft == "iid" or n == 1 or positive_support(q) >= n


def successive_law(q, n):
    """Successive sampling enumerated with each denominator the sum of the not-yet-drawn masses."""
    law = {}
    tokens = np.flatnonzero(q).tolist()
    for combo in itertools.permutations(tokens, n):
        probability, left = 1.0, list(tokens)
        for x in combo:
            probability *= q[x] / q[left].sum()
            left.remove(x)
        law[combo] = probability
    return law


def law_of(q, n, draft):
    """The draft law as {tuple: probability}; wor re-derived here, the others from draft_laws."""
    if draft == "wor":
        return successive_law(q, n)
    tuples, probabilities = enumerate_drafts(q, n, draft)
    probabilities = probabilities / probabilities.sum()
    return {tuple(t): pr for t, pr in zip(tuples.tolist(), probabilities, strict=True)}


def brute_force(p, law):
    """``1 + min_H [p(H) - Q(H)]`` over every subset ``H``; returns the value and one minimiser."""
    vocab = len(p)
    best, best_set = 0.0, ()
    for size in range(vocab + 1):
        for subset in itertools.combinations(range(vocab), size):
            members = set(subset)
            inclusion = sum(pr for drafts, pr in law.items() if set(drafts) <= members)
            gap = p[list(subset)].sum() - inclusion
            if gap < best:
                best, best_set = gap, subset
    return 1.0 + best, best_set


def pairs(max_vocab=8, **kwargs):
    return strategies.distribution_pairs(vocab_size=st.integers(1, max_vocab), **kwargs)


# ---------------------------------------------------------------------------------------------------------
# Agreement of methods


@given(pairs(), strategies.draft_counts(max_n=4), st.sampled_from(SORTED_LAWS))
def test_sorted_method_equals_brute_force_subset_minimum(pair, n, draft):
    p, q = pair
    if not feasible(q, n, draft):
        return
    expected, _ = brute_force(p, law_of(q, n, draft))
    assert optimal_acceptance(p, q, n, draft=draft, method="sorted") == pytest.approx(expected, abs=TOL)
    assert optimal_acceptance(p, q, n, draft=draft) == pytest.approx(expected, abs=TOL)


# Each example solves five LPs / flows (~0.1 s together), so this property runs 60 examples, not 200; the
# cheaper test above covers the sorted method on the full 200 and up to V = 8, n = 4.
@settings(max_examples=200)
@given(pairs(max_vocab=5), strategies.draft_counts(max_n=3), st.sampled_from(SORTED_LAWS))
def test_all_methods_agree(pair, n, draft):
    p, q = pair
    if not feasible(q, n, draft):
        return
    reference = optimal_acceptance(p, q, n, draft=draft, method="sorted")
    for method in ORACLES:
        value = optimal_acceptance(p, q, n, draft=draft, method=method)
        assert value == pytest.approx(reference, abs=TOL), method


@given(
    pairs(max_vocab=6, min_probability=0.0), st.integers(2, 3), st.sampled_from(["wor", "greedy", "spechub"])
)
def test_sorted_and_enumeration_agree_with_tiny_probabilities(pair, n, draft):
    # Masses down to 1e-300 next to a dominant token: 1 - q(drawn) cancels; both sides must avoid it.
    p, q = pair
    if not feasible(q, n, draft):
        return
    sorted_value = optimal_acceptance(p, q, n, draft=draft, method="sorted")
    assert sorted_value == pytest.approx(
        optimal_acceptance(p, q, n, draft=draft, method="enumerate"), abs=TOL
    )


@given(
    pairs(max_vocab=6), strategies.draft_counts(max_n=3), st.sampled_from(["iid", "wor"]), st.integers(1, 3)
)
def test_sorted_method_is_unchanged_by_tokens_with_zero_target_and_draft_mass(pair, n, draft, zeros):
    # 0/0 ratios: the sort must still place these tokens after every token with q > 0.
    p, q = pair
    if not feasible(q, n, draft):
        return
    padded_p = np.concatenate([np.zeros(zeros), p, np.zeros(zeros)])
    padded_q = np.concatenate([np.zeros(zeros), q, np.zeros(zeros)])
    expected, _ = brute_force(p, law_of(q, n, draft))
    assert optimal_acceptance(padded_p, padded_q, n, draft=draft) == pytest.approx(expected, abs=TOL)


@given(pairs(max_vocab=5), st.sampled_from(["greedy", "spechub"]), strategies.draft_counts(max_n=4))
def test_greedy_and_spechub_closed_forms_equal_the_lp_on_their_laws(pair, draft, n):
    p, q = pair
    if draft == "spechub":
        n = 2
    if not feasible(q, n, draft):
        return
    closed = optimal_acceptance(p, q, n, draft=draft, method="sorted")
    assert closed == pytest.approx(optimal_acceptance(p, q, n, draft=draft, method="lp"), abs=TOL)


@given(pairs(max_vocab=6))
def test_spechub_optimum_equals_greedy_optimum_with_two_drafts(pair):
    p, q = pair
    if positive_support(q) < 2:
        return
    assert optimal_acceptance(p, q, 2, draft="spechub") == pytest.approx(
        optimal_acceptance(p, q, 2, draft="greedy"), abs=1e-12
    )


# ---------------------------------------------------------------------------------------------------------
# Order between laws and reductions


@given(pairs(), strategies.draft_counts(max_n=4))
def test_without_replacement_optimum_is_at_least_iid_optimum_which_is_at_least_single_draft(pair, n):
    p, q = pair
    single = acceptance_rate(p, q)
    iid = optimal_acceptance(p, q, n, draft="iid")
    assert iid >= single - 1e-12
    if positive_support(q) >= n:
        assert optimal_acceptance(p, q, n, draft="wor") >= iid - 1e-12


@given(pairs(), strategies.draft_counts(max_n=4), st.sampled_from(["greedy", "spechub"]))
def test_greedy_optimum_is_at_least_single_draft_acceptance(pair, n, draft):
    p, q = pair
    n = 2 if draft == "spechub" else n
    if feasible(q, n, draft):
        assert optimal_acceptance(p, q, n, draft=draft) >= acceptance_rate(p, q) - 1e-12


@given(pairs(), st.integers(1, 3))
def test_iid_optimum_is_nondecreasing_in_the_number_of_drafts(pair, n):
    p, q = pair
    assert optimal_acceptance(p, q, n + 1) >= optimal_acceptance(p, q, n) - 1e-12


# ~25 exact solves per example (every law and method): 60 examples, not 200.
@settings(max_examples=200)
@given(pairs(max_vocab=5))
def test_one_draft_reduces_every_law_and_method_to_single_draft_acceptance(pair):
    p, q = pair
    expected = float(np.minimum(p, q).sum())
    for draft in ("iid", "wor", "greedy"):
        for method in ("auto", "sorted", *ORACLES):
            assert optimal_acceptance(p, q, 1, draft=draft, method=method) == pytest.approx(expected, abs=TOL)
    for method in ("auto", *ORACLES):
        value = optimal_acceptance(p, q[None], 1, draft="independent", method=method)
        assert value == pytest.approx(expected, abs=TOL)


@given(pairs(max_vocab=5), st.integers(1, 3))
def test_independent_drafts_with_identical_rows_equal_iid(pair, n):
    p, q = pair
    stacked = np.repeat(q[None], n, axis=0)
    iid = optimal_acceptance(p, q, n, draft="iid")
    assert optimal_acceptance(p, stacked, n, draft="independent") == pytest.approx(iid, abs=TOL)
    assert optimal_acceptance(p, stacked, n, draft="independent", method="lp") == pytest.approx(iid, abs=TOL)


@given(pairs(max_vocab=5), pairs(max_vocab=5))
def test_independent_drafts_equal_product_formula_by_brute_force(first, second):
    # alpha* = 1 + min_H [p(H) - q_1(H) q_2(H)], computed here over every subset.
    p, q1 = first
    _, q2 = second
    if len(q2) != len(p):
        return
    best = min(
        p[list(s)].sum() - q1[list(s)].sum() * q2[list(s)].sum()
        for size in range(len(p) + 1)
        for s in itertools.combinations(range(len(p)), size)
    )
    assert optimal_acceptance(p, np.stack([q1, q2]), 2, draft="independent") == pytest.approx(
        1 + best, abs=TOL
    )


def test_independent_drafts_beyond_enumeration_size_use_an_exact_solver():
    rng = np.random.default_rng(7)
    p, q = rng.dirichlet(np.ones(24)), rng.dirichlet(np.ones(24), size=2)
    auto = optimal_acceptance(p, q, 2, draft="independent")
    assert auto == pytest.approx(optimal_acceptance(p, q, 2, draft="independent", method="maxflow"), abs=TOL)


# ---------------------------------------------------------------------------------------------------------
# Batches


@given(
    st.integers(1, 8).flatmap(
        lambda v: st.lists(pairs(max_vocab=v).filter(lambda x: len(x[0]) == v), max_size=5)
    ),
    strategies.draft_counts(max_n=4),
    st.sampled_from(SORTED_LAWS),
)
def test_batched_sorted_result_equals_row_by_row_result(batch, n, draft):
    if not batch:
        return
    n = 2 if draft == "spechub" else n
    p = np.stack([pq[0] for pq in batch])
    q = np.stack([pq[1] for pq in batch])
    if not all(feasible(row, n, draft) for row in q):
        return
    batched = optimal_acceptance(p, q, n, draft=draft, method="sorted")
    rows = [optimal_acceptance(pr, qr, n, draft=draft, method="sorted") for pr, qr in zip(p, q, strict=True)]
    assert batched.shape == (len(batch),)
    np.testing.assert_allclose(batched, rows, atol=1e-12)


def test_leading_axes_broadcast_and_keep_their_shape():
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(6), size=(2, 1))
    q = rng.dirichlet(np.ones(6), size=(3,))
    values = optimal_acceptance(p, q, 3, draft="wor")
    assert values.shape == (2, 3)
    assert values[1, 2] == pytest.approx(optimal_acceptance(p[1, 0], q[2], 3, draft="wor"), abs=1e-12)
    assert acceptance_rate(p, q).shape == (2, 3)
    assert isinstance(optimal_acceptance(p[0, 0], q[0], 2), float)


@given(st.lists(st.integers(0, 7), min_size=8, max_size=8), st.integers(1, 7))
def test_batched_top_tokens_match_draft_laws_top_tokens(weights, count):
    q = np.array(weights, dtype=float) + 1e-3
    q /= q.sum()
    batch = np.stack([q, q[::-1]])
    chosen = _top_tokens_batched(batch, count)
    np.testing.assert_array_equal(chosen[0], top_tokens(q, count))
    np.testing.assert_array_equal(chosen[1], top_tokens(q[::-1], count))


# ---------------------------------------------------------------------------------------------------------
# Certificates


@given(pairs(max_vocab=6), strategies.draft_counts(max_n=3), st.sampled_from((*SORTED_LAWS, "independent")))
def test_certificate_token_set_attains_the_value_and_the_coupling_is_feasible_and_attains_it(pair, n, draft):
    p, q = pair
    if draft == "independent":
        q = np.stack([q, np.roll(q, 1), q[::-1]][:n])
    elif not feasible(q, n if draft != "spechub" else 2, draft):
        return
    n = 2 if draft == "spechub" else n
    certificate = optimal_acceptance_certificate(p, q, n, draft=draft)
    assert isinstance(certificate, AcceptanceCertificate)
    assert certificate.value == pytest.approx(optimal_acceptance(p, q, n, draft=draft), abs=1e-12)

    drafts, probabilities, coupling = (
        certificate.drafts,
        certificate.draft_probabilities,
        certificate.coupling,
    )
    members = set(certificate.token_set.tolist())
    assert list(certificate.token_set) == sorted(members)
    inclusion = sum(pr for row, pr in zip(drafts.tolist(), probabilities, strict=True) if set(row) <= members)
    assert 1 + p[list(members)].sum() - inclusion == pytest.approx(certificate.value, abs=TOL)

    assert coupling.shape == (len(drafts), len(p))
    assert coupling.min() >= 0.0
    np.testing.assert_allclose(coupling.sum(axis=1), probabilities, atol=1e-12, rtol=0)
    np.testing.assert_allclose(coupling.sum(axis=0), p, atol=1e-12, rtol=0)
    accepted = sum(coupling[i, list(set(row))].sum() for i, row in enumerate(drafts.tolist()))
    assert accepted == pytest.approx(certificate.value, abs=TOL)


def test_certificate_of_a_large_law_has_no_coupling_and_rejects_batches():
    rng = np.random.default_rng(5)
    p, q = rng.dirichlet(np.ones(200)), rng.dirichlet(np.ones(200))
    certificate = optimal_acceptance_certificate(p, q, 3, draft="wor")
    assert certificate.coupling is None and certificate.drafts is None
    members = certificate.token_set
    # Q_3 over the certificate's set, from the exact n = 2 route is not enough; use the iid bound check:
    assert 1 + p[members].sum() - q[members].sum() ** 3 <= certificate.value + 1e-12
    with pytest.raises(ValueError, match="single pair"):
        optimal_acceptance_certificate(np.stack([p, p]), np.stack([q, q]), 2)


# ---------------------------------------------------------------------------------------------------------
# Hand-computed values


def test_without_replacement_n_drafts_on_an_n_token_support_with_a_tiny_token():
    # q has exactly n = 4 tokens, one of mass 1e-18: every draft tuple is the whole support, so alpha* is
    # p(support). The three heavier tokens' prefix has x = 1 - 1e-18 = 1.0 in float64 while their own sum
    # rounds an ulp below 1: its inclusion bounds came out [0.991, 1] instead of 0 and pruned the true
    # minimiser, and alpha* was reported as 1 (found by the CI's hypothesis run of the optimal verifier).
    p = np.array([9.97011952e-01, 9.96015936e-04, 0, 0, 9.96015936e-04, 9.96015936e-04, 0])
    p /= p.sum()
    q = np.array([1e-18, 0.0, 0.37416094895688495, 0.1925800303480084, 0.0, 0.0, 0.4332590206951066])
    support = p[q > 0].sum()
    assert optimal_acceptance(p, q, 4, draft="wor") == pytest.approx(support, abs=1e-12)
    assert optimal_acceptance(p, q, 4, draft="wor", method="enumerate") == pytest.approx(support, abs=1e-12)


def test_khisti_toy_uniform_draft_on_three_tokens_by_hand():
    # Khisti et al. (ICLR 2025) Fig. 2 set-up: q uniform on 3 tokens, n = 2 i.i.d. drafts, so
    # Q(H) = (|H|/3)^2. With p = (1/20, 9/20, 1/2) the worst set is {0}: 1/20 - 1/9 < 0, while every
    # pair has p(H) >= 1/2 > 4/9. So alpha* = 1 + 1/20 - 1/9 = 169/180.
    p, q = np.array([1 / 20, 9 / 20, 1 / 2]), np.full(3, 1 / 3)
    for method in ("auto", *ORACLES):
        assert optimal_acceptance(p, q, 2, method=method) == pytest.approx(169 / 180, abs=1e-12)
    # Without replacement Q({0}) = 0 and Q(pair) = 1/3 <= p(pair): acceptance 1.
    assert optimal_acceptance(p, q, 2, draft="wor") == pytest.approx(1.0, abs=1e-12)
    # Their acceptance = 1 condition: p(S) >= q(S)^2 for all S. p = (1/6, 1/2, 1/3) satisfies it.
    assert optimal_acceptance([1 / 6, 1 / 2, 1 / 3], q, 2) == pytest.approx(1.0, abs=1e-12)


def test_greedy_by_hand():
    # T = {0} (top-1 of q), q' = (0.3, 0.2)/0.5 on {1, 2}: alpha* = 0.2 + min(0.2, 0.6) + min(0.6, 0.4) = 0.8.
    p, q = np.array([0.2, 0.2, 0.6]), np.array([0.5, 0.3, 0.2])
    assert optimal_acceptance(p, q, 2, draft="greedy") == pytest.approx(0.8, abs=1e-12)
    certificate = optimal_acceptance_certificate(p, q, 2, draft="greedy")
    assert certificate.token_set.tolist() == [0, 1]  # 1 + p({0,1}) - q'({1}) = 1 + 0.4 - 0.6


def test_without_replacement_two_drafts_by_hand():
    # q = (1/2, 1/4, 1/4), p = (0, 1/2, 1/2). Two distinct drafts never both lie in a singleton, and
    # Q_2({0, 1}) = 1/2 * 1/2 + 1/4 * 2/3 = 5/12 <= p({0, 1}) = 1/2 (same for {0, 2}), so p(H) >= Q_2(H)
    # for every H and alpha* = 1.
    p, q = np.array([0.0, 0.5, 0.5]), np.array([0.5, 0.25, 0.25])
    assert optimal_acceptance(p, q, 2, draft="wor") == pytest.approx(1.0, abs=1e-12)
    # With replacement H = {0} has Q = 1/4 and p = 0: alpha* = 3/4.
    assert optimal_acceptance(p, q, 2, draft="iid") == pytest.approx(0.75, abs=1e-12)


# ---------------------------------------------------------------------------------------------------------
# Bad input


GOOD_P, GOOD_Q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6])


@pytest.mark.parametrize(
    "p, q, n, kwargs, match",
    [
        ([np.nan, 0.5, 0.5], GOOD_Q, 2, {}, "p contains NaN"),
        (GOOD_P, [-0.1, 0.5, 0.6], 2, {}, "q contains negative"),
        ([0.5, 0.3, 0.3], GOOD_Q, 2, {}, "p must sum to 1"),
        (GOOD_P, [0.5, 0.5], 2, {}, "vocabulary"),
        (GOOD_P, GOOD_Q, 0, {}, "n must be at least 1"),
        (GOOD_P, GOOD_Q, 2.0, {}, "n must be an integer"),
        (GOOD_P, [0.5, 0.5, 0.0], 3, {"draft": "wor"}, "n = 3 drafts"),
        (GOOD_P, [1.0, 0.0, 0.0], 2, {"draft": "greedy"}, "n = 2 drafts"),
        (GOOD_P, GOOD_Q, 3, {"draft": "spechub"}, "n must be 2"),
        (GOOD_P, GOOD_Q, 2, {"draft": "beam"}, "draft must be one of"),
        (GOOD_P, GOOD_Q, 2, {"method": "simplex"}, "method must be one of"),
        (GOOD_P, GOOD_Q, 2, {"draft": "independent"}, r"q must have shape \(\.\.\., n, V\)"),
        (
            GOOD_P,
            np.stack([GOOD_Q, GOOD_Q]),
            2,
            {"draft": "independent", "method": "sorted"},
            "method='sorted'",
        ),
        (np.full(21, 1 / 21), np.full(21, 1 / 21), 2, {"method": "enumerate"}, "method='enumerate'"),
        (np.ones((2, 3)) / 3, np.ones((3, 3)) / 3, 2, {}, "do not broadcast"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(p, q, n, kwargs, match):
    with pytest.raises(ValueError, match=match):
        optimal_acceptance(p, q, n, **kwargs)


def test_bad_input_in_one_batch_row_is_reported():
    q = np.array([[0.2, 0.2, 0.6], [1.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="n = 2 drafts"):
        optimal_acceptance(np.stack([GOOD_P, GOOD_P]), q, 2, draft="wor")
    with pytest.raises(ValueError, match="q contains NaN"):
        acceptance_rate(GOOD_P, [np.nan, 0.5, 0.5])
    with pytest.raises(ValueError, match="draft must be one of"):
        optimal_acceptance_certificate(GOOD_P, GOOD_Q, 2, draft="tree")


def test_lp_oracle_survives_marginals_that_differ_by_round_off():
    # Found by hypothesis: tiny draft-tuple probabilities whose sum is 1 only to ~1e-16 made HiGHS report
    # the LP infeasible when the dropped marginal row was a zero of p.
    p = np.array([1.0, 0.0, 0.0])
    q = np.array([2.61122117e-04, 2.61122117e-04, 9.99477756e-01])
    q /= q.sum()
    lp = optimal_acceptance(p, np.stack([q] * 3), 3, draft="independent", method="lp")
    assert lp == pytest.approx(optimal_acceptance(p, q, 3, method="sorted"), abs=1e-9)
