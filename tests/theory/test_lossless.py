"""check_lossless: passes every shipped verifier, catches known-broken ones, validates the verify function."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from theory import LosslessReport, check_lossless, strategies, verifier
from theory.draft_laws import enumerate_drafts
from theory.verifiers import VERIFIERS, _kseq_conditional

P3, Q3 = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])


def single_draft(p, q, drafts, *, swap_letters=False, normalise_residual=True):
    """Leviathan et al.'s single-draft rule on x_1, optionally broken in one of two classic ways."""
    x = drafts[0]
    accept = min(1.0, q[x] / p[x]) if swap_letters else min(1.0, p[x] / q[x])
    residual = np.maximum(p - q, 0.0)
    if normalise_residual:
        residual = residual / residual.sum() if residual.sum() > 0 else p
    out = (1.0 - accept) * residual
    out[x] += accept
    return out


@st.composite
def small_cases(draw):
    # check_lossless calls the verify function once per draft tuple from Python, so V^n is kept <= 125
    # (V = 8 with n = 2, V = 5 with n = 3, V = 3 with n = 4) to keep 200 examples within a few seconds.
    n = draw(strategies.draft_counts(4))
    vocab_cap = max(v for v in range(1, 9) if v**n <= 125)
    p, q = draw(strategies.distribution_pairs(st.integers(1, vocab_cap)))
    return p, q, n


@given(small_cases())
def test_every_shipped_verifier_passes_check_lossless(case):
    p, q, n = case
    for name in VERIFIERS:
        v = verifier(name)
        if name == "optimal" or (v.draft == "spechub" and n != 2):
            continue  # the optimal verifier is checked in test_verifiers; SpecHub needs n = 2
        if v.draft in ("wor", "greedy", "spechub") and np.count_nonzero(q) < n:
            continue
        report = check_lossless(v.conditional, p, q, n, draft=v.draft)
        assert report.lossless, (name, report)
        assert report.invalid_conditional is None


def test_a_shipped_verifier_passed_itself_is_checked_under_its_own_draft_law():
    """``check_lossless(verifier(name), ...)`` is ``check_lossless(verifier(name).conditional, ...,
    draft=verifier(name).draft)``; an explicit ``draft`` still wins."""
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    for name in ("rrs", "rrs_wor", "greedy", "spechub"):
        v = verifier(name)
        itself, by_hand = check_lossless(v, p, q, 2), check_lossless(v.conditional, p, q, 2, draft=v.draft)
        np.testing.assert_array_equal(itself.output_distribution, by_hand.output_distribution)
        assert itself.lossless
    with pytest.raises(ValueError, match="distinct"):  # i.i.d. tuples repeat tokens, which RRS-wor refuses
        check_lossless(verifier("rrs_wor"), p, q, 2, draft="iid")


@given(strategies.distribution_pairs(st.integers(1, 6)), strategies.draft_counts(3))
def test_report_output_distribution_equals_verifier_output_distribution(pair, n):
    p, q = pair
    v = verifier("naive")
    report = check_lossless(v.conditional, p, q, n)
    np.testing.assert_allclose(report.output_distribution, v.output_distribution(p, q, n), atol=1e-12)


@given(strategies.distribution_pairs(st.integers(2, 6)), strategies.draft_counts(3))
def test_unnormalised_residual_is_flagged_whenever_rejection_is_possible(pair, n):
    p, q = pair
    report = check_lossless(lambda p, q, d: single_draft(p, q, d, normalise_residual=False), p, q, n)
    rejection = 1.0 - np.minimum(p, q).sum()
    if 1e-6 < rejection < 1.0 - 1e-6:  # then some conditional sums to 1 - rejection * (1 - mass) != 1
        assert not report.lossless
        assert report.invalid_conditional is not None and "sum" in report.invalid_reason


@pytest.mark.parametrize(
    ("name", "verify", "n", "draft"),
    [
        (
            "residual left unnormalised",
            lambda p, q, d: single_draft(p, q, d, normalise_residual=False),
            2,
            "iid",
        ),
        ("letters swapped: min(1, q/p)", lambda p, q, d: single_draft(p, q, d, swap_letters=True), 2, "iid"),
        (
            "RRS-wor verified sorted",
            lambda p, q, d: verifier("rrs_wor").conditional(p, q, np.sort(d)),
            2,
            "wor",
        ),
        ("K-SEQ with rho = 1", lambda p, q, d: _kseq_conditional(p, q, d[None, :], 1.0)[0], 2, "iid"),
        ("K-SEQ with rho = 1, n = 3", lambda p, q, d: _kseq_conditional(p, q, d[None, :], 1.0)[0], 3, "iid"),
    ],
)
def test_known_broken_verifier_is_flagged(name, verify, n, draft):
    report = check_lossless(verify, P3, Q3, n, draft=draft)
    assert not report.lossless, name
    assert report.max_error > 1e-3 or report.invalid_conditional is not None, name


def test_wrong_order_is_flagged_and_draw_order_is_not():
    # successive sampling is not exchangeable: the same algorithm in the draw order is lossless
    p, q = np.array([0.1, 0.6, 0.3]), np.array([0.5, 0.2, 0.3])
    rrs_wor = verifier("rrs_wor")
    assert check_lossless(rrs_wor.conditional, p, q, 2, draft="wor").lossless
    broken = check_lossless(lambda p, q, d: rrs_wor.conditional(p, q, np.sort(d)), p, q, 2, draft="wor")
    assert not broken.lossless and broken.max_error > 1e-3


def test_report_locates_the_worst_token_and_its_largest_contributor():
    verify = lambda p, q, d: single_draft(p, q, d, swap_letters=True)  # noqa: E731
    report = check_lossless(verify, P3, Q3, 2)
    tuples, probabilities = enumerate_drafts(Q3, 2)
    conditionals = np.array([verify(P3, Q3, t) for t in tuples])
    error = probabilities @ conditionals - P3
    assert report.worst_token == int(np.argmax(np.abs(error)))
    assert report.max_error == pytest.approx(np.abs(error).max(), abs=1e-15)
    w = report.worst_token
    share = np.sign(error[w]) * probabilities * (conditionals[:, w] - P3[w])
    assert report.worst_drafts == tuple(tuples[int(np.argmax(share))])
    assert isinstance(report, LosslessReport) and "NOT lossless" in str(report)
    with pytest.raises(AttributeError):
        report.lossless = True  # frozen


def test_negative_entry_is_reported_as_invalid_conditional():
    def verify(p, q, drafts):
        out = p.copy()
        if drafts[0] == 2:  # moves 0.31 off token 1 (p = 0.3): sums to 1 but has a negative entry
            out[1] -= 0.31
            out[0] += 0.31
        return out

    report = check_lossless(verify, P3, Q3, 1)
    assert not report.lossless
    assert report.invalid_conditional == (2,) and "negative" in report.invalid_reason


def test_independent_draft_models_with_per_model_residual_are_lossless():
    # SpecInfer with several draft models: test x_k against q_k and update the residual with q_k
    q = np.array([[0.2, 0.3, 0.5], [0.6, 0.3, 0.1]])

    def verify(p, models, drafts, update_residual=True):
        out, remaining, p_k = np.zeros_like(p), 1.0, p
        for k, x in enumerate(drafts):
            accept = min(1.0, p_k[x] / models[k, x])
            out[x] += remaining * accept
            remaining *= 1.0 - accept
            excess = np.maximum(p_k - models[k], 0.0)
            if update_residual and excess.sum() > 0:
                p_k = excess / excess.sum()
        return out + remaining * p_k

    p = np.array([0.3, 0.3, 0.4])
    assert check_lossless(verify, p, q, 2, draft="independent").lossless
    stale = lambda p, q, d: verify(p, q, d, update_residual=False)  # noqa: E731
    assert not check_lossless(stale, p, q, 2, draft="independent").lossless


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"verify": "rrs"}, "verify must be a callable"),
        ({"verify": lambda p, q, d: p[:2]}, r"shape \(3,\)"),
        ({"verify": lambda p, q, d: np.full(3, np.nan)}, "NaN"),
        ({"verify": lambda p, q, d: "abc"}, "non-numeric"),
        ({"tolerance": -1.0}, "tolerance must be non-negative"),
        ({"draft": "beam"}, "draft must be one of"),
        ({"n": 0}, "n must be at least 1"),
        ({"p": np.stack([P3, P3])}, r"p must be a single distribution"),
        ({"p": [0.5, 0.5, 0.5]}, "p must sum to 1"),
        ({"q": [0.5, 0.5]}, "share the vocabulary"),
        ({"q": [1.0, 0.0, 0.0], "draft": "wor"}, "at least n tokens"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(kwargs, message):
    arguments = {"verify": lambda p, q, d: p, "p": P3, "q": Q3, "n": 2, "draft": "iid"}
    arguments.update(kwargs)
    verify, p, q, n = (arguments.pop(key) for key in ("verify", "p", "q", "n"))
    with pytest.raises(ValueError, match=message):
        check_lossless(verify, p, q, n, **arguments)
