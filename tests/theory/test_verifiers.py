"""Verifiers: exact acceptance, exact output law and simulated steps, checked against each other and oracles.

Oracles re-derived here rather than taken from the implementation:

* the optimum of a draft law by brute force over all token sets H (min-cut form of the OT dual,
  alpha* = 1 + min_H [p(H) - P(all drafts in H)]), with P enumerated by ``enumerate_drafts``;
* the acceptance P(output in drafts) summed from ``.conditional`` over the enumerated law;
* hand-computed values on a 3-token example;
* Monte Carlo runs of ``.sample`` (coin flips, not draws from ``.conditional``) with fixed seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats

import theory
from tests.kseq_rows import KSEQ_ROW_ARGUMENTS, kseq_row
from theory import check_lossless, strategies, verifier
from theory.draft_laws import enumerate_drafts
from theory.verifiers import VERIFIERS, RecursiveRejectionSampling, Verifier, iid

# The optimal verifier needs an LP coupling per example; it has its own, smaller tests below.
CLOSED_FORM = tuple(name for name in VERIFIERS if name != "optimal")


def applicable(name: str, q: np.ndarray, n: int) -> bool:
    """Whether the verifier's draft law can produce n drafts from q."""
    draft = verifier(name).draft
    if draft == "spechub":
        return n == 2 and np.count_nonzero(q) >= 2
    if draft in ("wor", "greedy"):
        return np.count_nonzero(q) >= n
    return True


def optimum_by_subsets(p: np.ndarray, q: np.ndarray, n: int, draft: str) -> float:
    """alpha*(P) = 1 + min over all 2^V token sets H of p(H) - P(every draft lies in H)."""
    tuples, probabilities = enumerate_drafts(q, n, draft)
    vocab = p.shape[-1]
    sets = (np.arange(2**vocab)[:, None] >> np.arange(vocab)) & 1 == 1  # (2^V, V)
    inside = sets[:, tuples].all(axis=2)  # (2^V, M): tuple lies inside H
    return float(1.0 + np.min(sets @ p - inside @ probabilities))


def acceptance_from_conditional(v: Verifier, p: np.ndarray, q: np.ndarray, n: int) -> float:
    """Sum over x of P(x) * sum_{y in x} pi(y | x): the second route to the acceptance rate."""
    tuples, probabilities = enumerate_drafts(q, n, v.draft)
    conditionals = v.conditional(p, q, tuples)
    in_drafts = np.zeros_like(conditionals, dtype=bool)
    np.put_along_axis(in_drafts, tuples, True, axis=1)
    return float(probabilities @ np.sum(conditionals * in_drafts, axis=1))


# V^n is capped so that enumerating i.i.d. tuples stays cheap at 200 examples per property; every V in 1..8
# and every n in 1..4 still occurs (V = 8 with n = 3; V = 5 with n = 4).
@st.composite
def cases(draw, max_vocab: int = 8, max_n: int = 4, max_tuples: int = 640):
    n = draw(strategies.draft_counts(max_n))
    vocab_cap = max(v for v in range(1, max_vocab + 1) if v**n <= max_tuples)
    p, q = draw(strategies.distribution_pairs(st.integers(1, vocab_cap)))
    return p, q, n


# ---------------------------------------------------------------------------------------------------------
# Exact properties


@given(cases())
def test_every_verifier_output_distribution_equals_target(case):
    p, q, n = case
    for name in CLOSED_FORM:
        if applicable(name, q, n):
            output = verifier(name).output_distribution(p, q, n)
            np.testing.assert_allclose(output, p, atol=1e-9, rtol=0, err_msg=name)


@given(cases())
def test_every_conditional_is_a_distribution(case):
    p, q, n = case
    for name in CLOSED_FORM:
        if applicable(name, q, n):
            v = verifier(name)
            conditionals = v.conditional(p, q, enumerate_drafts(q, n, v.draft)[0])
            assert conditionals.min() >= -1e-12, name
            np.testing.assert_allclose(conditionals.sum(axis=1), 1.0, atol=1e-9, err_msg=name)


@given(cases())
def test_acceptance_lies_between_single_draft_acceptance_and_optimum_of_its_draft_law(case):
    p, q, n = case
    single = float(np.sum(np.minimum(p, q)))
    optimum = {}
    for name in CLOSED_FORM:
        if applicable(name, q, n):
            v = verifier(name)
            if v.draft not in optimum:
                optimum[v.draft] = optimum_by_subsets(p, q, n, v.draft)
            alpha = v.acceptance(p, q, n)
            # NSS ignores the drafts, so it can fall below sum(min(p, q)) (p = q = uniform, n = 1: 1/V)
            lower = 0.0 if name == "nss" else single
            assert lower - 1e-9 <= alpha <= optimum[v.draft] + 1e-9, (name, single, alpha, optimum[v.draft])


@given(cases())
def test_exact_acceptance_equals_acceptance_summed_from_conditional(case):
    p, q, n = case
    for name in CLOSED_FORM:
        if applicable(name, q, n):
            v = verifier(name)
            assert v.acceptance(p, q, n) == pytest.approx(
                acceptance_from_conditional(v, p, q, n), abs=1e-9
            ), name


@given(strategies.distribution_pairs())
def test_one_draft_reduces_every_verifier_but_nss_to_single_draft_acceptance(pair):
    p, q = pair
    single = float(np.sum(np.minimum(p, q)))
    for name in CLOSED_FORM:
        if name not in ("spechub", "nss"):  # SpecHub is only defined for n = 2; NSS below
            assert verifier(name).acceptance(p, q, 1) == pytest.approx(single, abs=1e-12), name
    # NSS draws its output independently of the single draft: P(y = x) = sum p q, not sum min(p, q)
    assert verifier("nss").acceptance(p, q, 1) == pytest.approx(float(p @ q), abs=1e-12)


@given(cases())
def test_kseq_acceptance_is_at_least_one_minus_inverse_e_of_iid_optimum(case):
    p, q, n = case
    alpha_kseq = verifier("kseq").acceptance(p, q, n)
    assert alpha_kseq >= (1.0 - 1.0 / math.e) * optimum_by_subsets(p, q, n, "iid") - 1e-12


@given(cases(max_n=2))
def test_spechub_and_greedy_attain_the_optimum_of_their_draft_law(case):
    p, q, n = case
    for name in ("spechub", "greedy"):
        if applicable(name, q, n):
            v = verifier(name)
            assert v.acceptance(p, q, n) == pytest.approx(optimum_by_subsets(p, q, n, v.draft), abs=1e-9)


@given(cases(max_n=4))
def test_greedy_attains_the_optimum_of_its_draft_law_for_every_n(case):
    p, q, n = case
    if not applicable("greedy", q, n):
        return
    alpha = verifier("greedy").acceptance(p, q, n)
    assert alpha == pytest.approx(optimum_by_subsets(p, q, n, "greedy"), abs=1e-9)


@given(cases())
def test_every_verifier_accepts_always_when_draft_equals_target(case):
    p, _, n = case
    for name in CLOSED_FORM:
        if name != "nss" and applicable(name, p, n):  # NSS ignores the drafts
            assert verifier(name).acceptance(p, p, n) == pytest.approx(1.0, abs=1e-9), name


@given(
    st.integers(2, 6).flatmap(
        lambda vocab: st.tuples(strategies.distribution_pairs(vocab), strategies.distribution_pairs(vocab))
    )
)
def test_batched_acceptance_equals_row_by_row_acceptance(pairs):
    first, second = pairs
    p = np.stack([first[0], second[0]])
    q = np.stack([first[1], second[1]])
    for name in CLOSED_FORM:
        n = 2
        if all(applicable(name, row, n) for row in q):
            batched = verifier(name).acceptance(p, q, n)
            assert batched.shape == (2,)
            rows = [verifier(name).acceptance(p[i], q[i], n) for i in range(2)]
            np.testing.assert_allclose(batched, rows, atol=1e-12, err_msg=name)


@given(strategies.distribution_pairs(st.integers(1, 8)), strategies.draft_counts(4))
def test_kseq_division_factor_is_the_smallest_valid_factor(pair, n):
    p, q = pair
    rho = float(verifier("kseq").division_factor(p, q, n))
    assert 1.0 <= rho <= n

    def slack(r):  # rho * beta(rho) - p_acc(rho) >= 0 iff the factor is valid (lossless)
        beta = np.sum(np.minimum(p / r, q))
        return r * beta - (1.0 - (1.0 - beta) ** n)

    assert slack(rho) >= -1e-12
    if rho > 1.0 + 1e-6:
        assert slack(rho - 1e-6) < 0


def bisected_division_factor(p: np.ndarray, q: np.ndarray, n: int, steps: int = 80) -> float:
    """The oracle: plain bisection of [1, n] on the full sums, keeping the valid end."""

    def valid(rho):
        beta = np.sum(np.minimum(p / rho, q))
        return 1.0 - (1.0 - beta) ** n <= rho * beta + 1e-13

    low, high = 1.0, float(n)
    if valid(low):
        return 1.0
    for _ in range(steps):
        middle = 0.5 * (low + high)
        low, high = (low, middle) if valid(middle) else (middle, high)
    return high


@given(*KSEQ_ROW_ARGUMENTS)
def test_kseq_division_factor_matches_plain_bisection_at_vocabulary_scale(seed, concentration, n, shape):
    """The bucketed search (ratios binned on [1, n], the last halvings inside one bucket) against plain
    bisection on rows of 3,000 tokens (:func:`tests.kseq_rows.kseq_row`). A batch solves each row as it is
    solved alone."""
    p, q = kseq_row(seed, concentration, n, shape, 3000)
    kseq = verifier("kseq")
    rho = float(kseq.division_factor(p, q, n))
    expected = bisected_division_factor(p, q, n)
    assert rho == pytest.approx(expected, rel=1e-9)
    acceptance = 1.0 - (1.0 - np.sum(np.minimum(p / rho, q))) ** n
    assert acceptance == pytest.approx(1.0 - (1.0 - np.sum(np.minimum(p / expected, q))) ** n, abs=1e-12)
    batch = kseq.division_factor(np.stack([q, p]), np.stack([p, q]), n)
    assert batch[0] == float(kseq.division_factor(q, p, n)) and batch[1] == rho


@given(*KSEQ_ROW_ARGUMENTS)
def test_kseq_division_factor_agrees_across_the_plain_bisection_threshold(seed, concentration, n, shape):
    """Just above :data:`KSEQ_PLAIN_BISECTION_VOCAB` the bucketed search runs; raising the threshold sends the
    same rows through the plain bisection, and the two factors agree to 1e-9."""
    vocab = iid.KSEQ_PLAIN_BISECTION_VOCAB + 1
    p, q = kseq_row(seed, concentration, n, shape, vocab)
    batch = (np.stack([p, q]), np.stack([q, p]))
    bucketed = verifier("kseq").division_factor(*batch, n)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(iid, "KSEQ_PLAIN_BISECTION_VOCAB", vocab)
        plain = verifier("kseq").division_factor(*batch, n)
    np.testing.assert_allclose(plain, bucketed, rtol=1e-9)


# ---------------------------------------------------------------------------------------------------------
# Hand-checked values and the large-V paths


P3, Q3 = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])


@pytest.mark.parametrize(
    ("name", "n", "expected"),
    [
        ("nss", 1, 0.5 * 0.2 + 0.3 * 0.3 + 0.2 * 0.5),
        ("naive", 2, 0.7 + 0.3 * 0.2),  # residual is token 0 (q = 0.2), hit by x_2 w.p. 0.2
        ("rrs", 2, 1 - 0.3 * 0.8),  # r_1 = 0.7; p_2 = (1, 0, 0), r_2 = 0.2
        ("spechub", 2, 0.2 + 0.4 + 0.3),  # hub 2: p(a) + min(.5, .2/.5) + min(.3, .3/.5)
        ("greedy", 2, 0.2 + 0.4 + 0.3),  # T = {2}: p(T) + min(.5, .4) + min(.3, .6)
    ],
)
def test_acceptance_matches_hand_computed_value(name, n, expected):
    assert verifier(name).acceptance(P3, Q3, n) == pytest.approx(expected, abs=1e-12)


def rrs_wor_two_draft_quadratic_sum(p, q):
    """alpha = r_1 + sum_x (q - p)_+(x) sum_{y != x} min(p_2(y), q(y) / (1 - q(x))), evaluated as a V x V sum."""
    excess = np.maximum(p - q, 0)
    overlap = np.minimum(p, q).sum()
    if excess.sum() <= 0:
        return overlap
    p_2 = excess / excess.sum()
    others = np.array([np.delete(q, x).sum() for x in range(q.shape[0])])  # 1 - q(x) without cancellation
    with np.errstate(divide="ignore"):  # q(x) = 1 is never rejected: its row is weighted by (q - p)_+ = 0
        inner = np.minimum(p_2[None, :], q[None, :] / others[:, None])
    np.fill_diagonal(inner, 0.0)
    rejected = np.maximum(q - p, 0)
    return overlap + rejected[rejected > 0] @ inner[rejected > 0].sum(axis=1)


def test_rrs_without_replacement_two_draft_closed_form_matches_quadratic_sum_at_large_vocab():
    rng = np.random.default_rng(7)
    logits = 3.0 * rng.standard_normal(300)
    p = np.exp(logits) / np.exp(logits).sum()
    q_logits = logits + rng.standard_normal(300)
    q = np.exp(q_logits) / np.exp(q_logits).sum()
    q[rng.random(300) < 0.5] = 0.0  # a reduced draft vocabulary: q = 0 off it
    q /= q.sum()
    expected = rrs_wor_two_draft_quadratic_sum(p, q)
    assert verifier("rrs_wor").acceptance(p, q, 2) == pytest.approx(expected, abs=1e-12)


@settings(max_examples=300)
@given(strategies.distribution_pairs(st.integers(1, 8)))
def test_rrs_without_replacement_two_draft_closed_form_equals_quadratic_sum(pair):
    """Zeros in p or q, disjoint supports and q = p included: the sort over the tokens with p > q > 0 alone
    loses nothing."""
    p, q = pair
    assume(np.count_nonzero(q) >= 2)  # two drafts without replacement
    expected = rrs_wor_two_draft_quadratic_sum(p, q)
    assert verifier("rrs_wor").acceptance(p, q, 2) == pytest.approx(expected, abs=1e-12)


def test_rrs_without_replacement_refuses_intractable_exact_method():
    v = verifier("rrs_wor")
    limit = v.max_exact_vocab(4)
    assert v.max_exact_vocab(2) is None and limit**2 <= 5000 < (limit + 1) ** 2
    p = np.full(limit + 1, 1.0 / (limit + 1))
    with pytest.raises(ValueError, match=f"needs V <= {limit}"):
        v.acceptance(p, np.roll(np.linspace(1, 2, limit + 1) / np.linspace(1, 2, limit + 1).sum(), 1), 4)


def test_closed_forms_are_fast_at_a_real_vocabulary():
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.full(49152, 0.05), size=2)
    q = rng.dirichlet(np.full(49152, 0.05), size=2)
    for name in ("nss", "naive", "rrs", "kseq", "spechub", "greedy"):
        alpha = verifier(name).acceptance(p, q, 4 if name != "spechub" else 2)
        assert alpha.shape == (2,) and np.all((alpha >= 0) & (alpha <= 1 + 1e-12))
    assert 0 <= verifier("rrs_wor").acceptance(p[0], q[0], 2) <= 1


# ---------------------------------------------------------------------------------------------------------
# The optimal verifier (built on theory.multidraft's certificate)


@settings(max_examples=200)
@given(cases(max_vocab=5, max_n=3, max_tuples=125))
def test_optimal_verifier_attains_optimal_acceptance_and_is_lossless(case):
    p, q, n = case
    for draft in ("iid", "wor", "greedy"):
        if not applicable("rrs_wor" if draft == "wor" else "greedy" if draft == "greedy" else "rrs", q, n):
            continue
        v = verifier("optimal", draft=draft)
        expected = optimum_by_subsets(p, q, n, draft)
        assert v.acceptance(p, q, n) == pytest.approx(expected, abs=1e-7)
        assert acceptance_from_conditional(v, p, q, n) == pytest.approx(expected, abs=1e-7)
        assert check_lossless(v.conditional, p, q, n, draft=draft, tolerance=1e-7).lossless


def test_optimal_verifier_matches_optimal_acceptance_function():
    v = verifier("optimal", draft="wor")
    assert v.draft == "wor"
    assert v.acceptance(P3, Q3, 2) == pytest.approx(
        theory.optimal_acceptance(P3, Q3, 2, draft="wor"), abs=1e-12
    )
    assert verifier("optimal").draft == "iid"


# ---------------------------------------------------------------------------------------------------------
# Monte Carlo: the simulated algorithm against the exact formulas

SAMPLES = 6000
Z_LIMIT = 4.0  # |z| < 4: a false alarm has probability 6e-5 per check
P_VALUE_LIMIT = 1e-4  # G-test of output frequencies against p


def simulate(v: Verifier, p, q, n, seed: int):
    rng = np.random.default_rng(seed)
    hits, counts = 0, np.zeros(p.shape[-1])
    for _ in range(SAMPLES):
        drafts, token = v.sample(p, q, n, rng)
        hits += token in drafts
        counts[token] += 1
    return hits, counts


def statistical_agreement(v: Verifier, p, q, n, seed: int) -> tuple[float, float]:
    """(z of the sampled acceptance against the exact one, G-test p-value of outputs against p)."""
    hits, counts = simulate(v, p, q, n, seed)
    alpha = (
        float(verifier(v.name).acceptance(p, q, n)) if v.name != "optimal" else float(v.acceptance(p, q, n))
    )
    se = math.sqrt(max(alpha * (1 - alpha), 1e-12) / SAMPLES)
    z = (hits / SAMPLES - alpha) / se
    support = p > 0
    if counts[~support].sum() > 0:  # a token the target never emits: lossless is refuted outright
        return z, 0.0
    g = 2.0 * np.sum(
        np.where(counts > 0, counts * np.log(np.maximum(counts, 1) / (SAMPLES * p + 1e-300)), 0.0)
    )
    return z, float(stats.chi2.sf(g, df=max(int(support.sum()) - 1, 1)))


MC_P = np.array([0.35, 0.25, 0.15, 0.1, 0.08, 0.05, 0.02])
MC_Q = np.array([0.1, 0.3, 0.05, 0.25, 0.05, 0.2, 0.05])


@pytest.mark.parametrize("name", VERIFIERS)
def test_sampled_acceptance_and_outputs_agree_with_exact(name):
    n = 2 if name == "spechub" else 3
    z, p_value = statistical_agreement(verifier(name), MC_P, MC_Q, n, seed=11)
    assert abs(z) < Z_LIMIT, z
    assert p_value > P_VALUE_LIMIT, p_value


class _ResidualNotUpdated(RecursiveRejectionSampling):
    """Broken RRS: every draft is tested against p itself and the residual is taken once."""

    def _simulate(self, p, q, drafts, rng):
        for x in drafts:
            if rng.random() < p[x] / q[x]:
                return int(x)
        return int(rng.choice(p.shape[-1], p=np.maximum(p - q, 0) / np.maximum(p - q, 0).sum()))


def test_statistical_check_detects_a_broken_sampler():
    z, p_value = statistical_agreement(_ResidualNotUpdated(), MC_P, MC_Q, 3, seed=11)
    assert abs(z) >= Z_LIMIT or p_value <= P_VALUE_LIMIT
    assert p_value <= P_VALUE_LIMIT  # its output law is visibly not p


# ---------------------------------------------------------------------------------------------------------
# Bad input


def test_unknown_verifier_lists_valid_names():
    with pytest.raises(ValueError, match="name must be one of.*'rrs_wor'.*'optimal'"):
        verifier("specinfer")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: verifier("rrs", draft="wor"), "takes no options"),
        (lambda: verifier("optimal", draft="tree"), "draft must be one of"),
        (lambda: verifier("optimal", rho=2), "only takes the options 'draft' and 'method'"),
        (lambda: verifier("rrs").acceptance(P3, Q3, 0), "n must be at least 1"),
        (lambda: verifier("rrs").acceptance(P3, Q3, 2.0), "n must be an integer"),
        (lambda: verifier("rrs").acceptance([0.5, 0.6, 0.2], Q3, 2), "p must sum to 1"),
        (lambda: verifier("rrs").acceptance(P3, [0.5, -0.1, 0.6], 2), "q contains negative"),
        (lambda: verifier("rrs").acceptance(P3, [0.5, 0.5], 2), "share the vocabulary"),
        (lambda: verifier("spechub").acceptance(P3, Q3, 3), "n must be 2"),
        (lambda: verifier("rrs_wor").acceptance(P3, [0.5, 0.5, 0.0], 3), "at least n tokens with q > 0"),
        (lambda: verifier("rrs").conditional(P3, Q3, [0, 3]), r"token ids in \[0, 3\)"),
        (lambda: verifier("rrs").conditional(P3, [0.5, 0.5, 0.0], [0, 2]), "q = 0"),
        (lambda: verifier("rrs_wor").conditional(P3, Q3, [1, 1]), "distinct"),
        (lambda: verifier("greedy").conditional(P3, Q3, [0, 1]), "top n - 1 tokens"),
        (lambda: verifier("spechub").conditional(P3, Q3, [0, 1]), "hub token"),
        (lambda: verifier("rrs").conditional(P3, Q3, [0.0, 1.0]), "integer token ids"),
        (lambda: verifier("rrs").output_distribution(np.stack([P3, P3]), Q3, 2), r"shape \(V,\)"),
        (lambda: verifier("rrs").sample(P3, Q3, 2, rng=0), "rng must be a numpy.random.Generator"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_acceptance_agrees_with_single_draft_acceptance_rate_function():
    assert verifier("rrs").acceptance(P3, Q3, 1) == pytest.approx(float(theory.acceptance_rate(P3, Q3)))
