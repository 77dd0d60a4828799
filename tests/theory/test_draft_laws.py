"""Draft laws: enumeration against hand-derived laws, sampling against enumeration."""

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.goodness_of_fit import law_p_value
from theory.draft_laws import acceptance_by_draft_count, enumerate_drafts, sample_drafts, top_tokens

Q = np.array([0.4, 0.3, 0.2, 0.1, 0.0])


@st.composite
def draft_distributions(draw, max_vocab=6):
    vocab = draw(st.integers(1, max_vocab))
    weights = np.array(draw(st.lists(st.integers(0, 10), min_size=vocab, max_size=vocab)), dtype=float)
    if weights.sum() == 0:
        weights[draw(st.integers(0, vocab - 1))] = 1.0
    return weights / weights.sum()


def law_as_dict(q, n, draft):
    tuples, probabilities = enumerate_drafts(q, n, draft)
    return {tuple(t): pr for t, pr in zip(tuples.tolist(), probabilities, strict=True)}


@given(draft_distributions(), st.integers(1, 3), st.sampled_from(["iid", "wor", "greedy"]))
def test_enumerated_law_is_a_distribution_over_positive_tuples(q, n, draft):
    if draft != "iid" and np.count_nonzero(q) < n:
        with pytest.raises(ValueError, match="n = "):
            enumerate_drafts(q, n, draft)
        return
    tuples, probabilities = enumerate_drafts(q, n, draft)
    assert tuples.shape == (len(probabilities), n)
    assert np.all(probabilities > 0)
    assert probabilities.sum() == pytest.approx(1.0, abs=1e-12)
    assert len({tuple(t) for t in tuples.tolist()}) == len(tuples)


@given(draft_distributions(), st.integers(1, 3))
def test_without_replacement_first_draft_is_q_and_tokens_are_distinct(q, n):
    if np.count_nonzero(q) < n:
        return
    first = np.zeros_like(q)
    for drafts, probability in law_as_dict(q, n, "wor").items():
        assert len(set(drafts)) == n
        first[drafts[0]] += probability
    np.testing.assert_allclose(first, q, atol=1e-12)


@given(draft_distributions(), st.integers(1, 3))
def test_without_replacement_equals_successive_sampling_defined_by_rejection(q, n):
    # Independent route: draw i.i.d. and discard repeats. Before each new token, any number k >= 0 of repeats of
    # already drawn tokens (mass `used`) may occur, so its probability is q(token) * sum_k used**k.
    if np.count_nonzero(q) < n:
        return
    for drafts, probability in law_as_dict(q, n, "wor").items():
        expected, used = 1.0, 0.0
        for token in drafts:
            expected *= q[token] / (1.0 - used)  # the geometric series sum_k used**k
            used += q[token]
        assert probability == pytest.approx(expected, rel=1e-9)


def test_greedy_law_fixes_the_top_tokens_and_draws_the_last_from_the_rest():
    law = law_as_dict(Q, 3, "greedy")
    assert law == pytest.approx({(0, 1, 2): 2 / 3, (0, 1, 3): 1 / 3})


def test_spechub_law_pairs_every_token_with_the_hub():
    law = law_as_dict(Q, 2, "spechub")
    expected = {}
    for i in (1, 2, 3):
        expected[(i, 0)] = Q[i]
        expected[(0, i)] = Q[0] * Q[i] / (1 - Q[0])
    assert law == pytest.approx(expected)


def test_independent_law_is_the_product_of_its_rows():
    rows = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    law = law_as_dict(rows, 2, "independent")
    expected = {(a, b): rows[0, a] * rows[1, b] for a, b in itertools.product(range(2), range(3))}
    assert law == pytest.approx(expected)


@pytest.mark.parametrize("draft,n", [("wor", 4), ("greedy", 3), ("spechub", 2)])
def test_laws_stay_exact_when_the_undrawn_mass_is_below_rounding(draft, n):
    # 1 - (mass drawn) cancels to 0 here; the remaining mass must be summed instead.
    q = (
        np.array([1 / 3, 1 / 3, 1 / 3 - 1e-300, 1e-300])
        if draft == "wor"
        else np.array([0.5, 0.5 - 1e-300, 1e-300])
    )
    tuples, probabilities = enumerate_drafts(q, n, draft)
    assert np.all(np.isfinite(probabilities)) and probabilities.sum() == pytest.approx(1.0, abs=1e-12)


def test_top_tokens_breaks_ties_towards_the_lower_index():
    assert top_tokens(np.array([0.25, 0.25, 0.5, 0.0]), 3).tolist() == [2, 0, 1]


def empirical_law_p_value(q, n, draft, sampler, samples=20_000, seed=0):
    rng = np.random.default_rng(seed)
    law = law_as_dict(q, n, draft)
    keys = list(law)
    counts = dict.fromkeys(keys, 0)
    for _ in range(samples):
        drafts = tuple(sampler(q, n, draft, rng).tolist())
        assert drafts in counts, f"sampled {drafts}, which has probability 0 under the law"
        counts[drafts] += 1
    return law_p_value(np.array([counts[k] for k in keys]), np.array([law[k] for k in keys]))


@pytest.mark.parametrize("draft,n", [("iid", 2), ("wor", 3), ("greedy", 3), ("spechub", 2)])
def test_sampled_drafts_follow_the_enumerated_law(draft, n):
    # Chi-square goodness of fit at a fixed seed; threshold 1e-3.
    assert empirical_law_p_value(Q, n, draft, sample_drafts) > 1e-3


def test_sampling_check_detects_a_wrong_without_replacement_order():
    # Negative control: returning the Gumbel-top-n tokens sorted by index (not in draw order) changes the law.
    def sorted_order(q, n, draft, rng):
        return np.sort(sample_drafts(q, n, draft, rng))

    assert empirical_law_p_value(Q, 3, "wor", sorted_order) < 1e-6


@pytest.mark.parametrize(
    "q,n,draft,message",
    [
        (Q, 0, "iid", "n must be at least 1"),
        (Q, 2, "beam", "draft must be one of"),
        (Q, 5, "wor", "need at least n tokens with q > 0"),
        (Q, 3, "spechub", "n must be 2"),
        (Q[:-1] * 2, 2, "iid", "q must sum to 1"),
        (np.array([0.5, np.nan, 0.5]), 1, "iid", "q contains NaN"),
        (np.array([1.5, -0.5]), 1, "iid", "q contains negative"),
        (np.array([[0.5, 0.5]]), 2, "independent", r"shape \(n, V\)"),
    ],
)
def test_bad_input_is_rejected_naming_the_argument(q, n, draft, message):
    with pytest.raises(ValueError, match=message):
        enumerate_drafts(q, n, draft)


@given(
    st.lists(draft_distributions(max_vocab=5), min_size=1, max_size=4),
    st.integers(1, 4),
    st.sampled_from(["iid", "wor", "greedy"]),
)
def test_rows_with_fewer_tokens_than_n_are_scored_with_all_of_their_tokens(rows, n, draft):
    """acceptance_by_draft_count: row by row, the named law's acceptance at k = min(n, |supp q|) for a law of
    distinct drafts (k = n for i.i.d.), with one draft being speculative sampling's sum min(p, q)."""
    from theory import verifier

    vocab = 5
    q = np.array([np.pad(row, (0, vocab - len(row))) for row in rows])
    p = np.roll(q, 1, axis=1) * 0.5 + 0.5 / vocab
    name = {"iid": "rrs", "wor": "rrs_wor", "greedy": "greedy"}[draft]
    scores = acceptance_by_draft_count(p, q, n, draft, verifier(name).acceptance)
    for row, score in zip(range(len(q)), scores, strict=True):
        k = n if draft == "iid" else min(n, int(np.count_nonzero(q[row])))
        expected = (
            np.minimum(p[row], q[row]).sum() if k == 1 else verifier(name).acceptance(p[row], q[row], k)
        )
        assert score == pytest.approx(float(expected), abs=1e-12)
