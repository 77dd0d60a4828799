"""theory.strategies: every draw is a valid distribution, and the hard cases are actually generated."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from theory import strategies
from theory.checks import as_distribution


@given(strategies.distributions())
def test_distributions_are_valid_probability_vectors_of_size_one_to_eight(p):
    as_distribution(p, "p")  # raises on negatives, NaN, or a sum off 1
    assert p.dtype == np.float64 and p.ndim == 1 and 1 <= p.shape[0] <= 8


@given(strategies.distributions(vocab_size=5, allow_zeros=False))
def test_distributions_without_zeros_are_strictly_positive(p):
    assert p.shape == (5,) and p.min() > 0


@given(strategies.distributions(st.integers(1, 8)))
def test_positive_entries_respect_the_minimum_probability(p):
    positive = p[p > 0]
    assert positive.min() >= strategies.MIN_PROBABILITY / (1 + 8 * strategies.MIN_PROBABILITY)


@given(strategies.distribution_pairs())
def test_distribution_pairs_share_the_vocabulary_and_are_valid(pair):
    p, q = pair
    as_distribution(p, "p")
    as_distribution(q, "q")
    assert p.shape == q.shape


@given(strategies.draft_counts(3))
def test_draft_counts_lie_between_one_and_max_n(n):
    assert isinstance(n, int) and 1 <= n <= 3


# Each hard case must actually be produced: find() raises if no draw satisfies the condition.
FIND = settings(max_examples=2000, database=None)


@pytest.mark.parametrize(
    ("description", "condition"),
    [
        ("one-hot", lambda p: p.shape[0] >= 3 and np.count_nonzero(p) == 1),
        ("some zeros", lambda p: 0 < np.count_nonzero(p) < p.shape[0] - 1),
        ("near-uniform", lambda p: p.shape[0] >= 4 and p.min() > 0 and p.max() / p.min() < 1.2),
        ("peaked", lambda p: p.shape[0] >= 4 and p.max() > 0.99 and np.count_nonzero(p) == p.shape[0]),
        ("flat-ish and unequal", lambda p: p.shape[0] >= 4 and 0.2 < p.max() < 0.6 and p.min() > 0.01),
        ("float64 tiny tail", lambda p: p.shape[0] >= 4 and 0 < p.min() < 1e-4),
    ],
)
def test_distributions_cover_the_hard_cases(description, condition):
    assert condition(find(strategies.distributions(), condition, settings=FIND)), description


@pytest.mark.parametrize(
    ("description", "condition"),
    [
        ("identical", lambda pq: pq[0].shape[0] >= 3 and np.array_equal(pq[0], pq[1])),
        ("disjoint supports", lambda pq: pq[0].shape[0] >= 3 and np.minimum(pq[0], pq[1]).sum() == 0),
        ("close but different", lambda pq: 0.9 < np.minimum(pq[0], pq[1]).sum() < 1 - 1e-6),
        ("far apart", lambda pq: pq[0].shape[0] >= 4 and 0 < np.minimum(pq[0], pq[1]).sum() < 0.2),
    ],
)
def test_distribution_pairs_cover_the_hard_cases(description, condition):
    assert condition(find(strategies.distribution_pairs(), condition, settings=FIND)), description


def test_tiny_masses_are_available_on_request():
    p = find(strategies.distributions(min_probability=0.0), lambda p: 0 < p.min() < 1e-12, settings=FIND)
    assert p.min() < 1e-12


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: strategies.distributions(vocab_size=0), "vocab_size must be a positive int"),
        (lambda: strategies.distributions(vocab_size=2.5), "vocab_size must be a positive int"),
        (lambda: strategies.distribution_pairs(min_probability=-1.0), "min_probability must be"),
        (lambda: strategies.draft_counts(0), "max_n must be a positive int"),
    ],
)
def test_bad_arguments_raise_value_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()
