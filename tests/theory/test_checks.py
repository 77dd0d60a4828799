"""Input checks of theory.checks: the two-pass fast path of a distribution's check must give the verdict, and
the words, of the entry-wise checks it skips on valid input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory.checks import (
    SUM_TOLERANCE,
    as_distribution,
    as_distribution_pair,
    distribution_pair_with_sums,
    distribution_with_sums,
)

SPECIAL = (np.nan, np.inf, -np.inf, -1e-3, -0.0, 1e308, 0.0)


def entrywise_verdict(array: np.ndarray) -> str:
    """The reference: every entry looked at, in the order the messages are ranked."""
    if not np.all(np.isfinite(array)):
        return "NaN or infinite"
    if np.any(array < 0):
        return "negative entries"
    with np.errstate(over="ignore"):
        sums = array.sum(axis=-1)
    if not np.max(np.abs(sums - 1.0)) <= SUM_TOLERANCE:
        return "must sum to 1"
    return "valid"


def verdict(array: np.ndarray) -> str:
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            distribution_with_sums(array, "p")
    except ValueError as error:
        for words in ("NaN or infinite", "negative entries", "must sum to 1"):
            if words in str(error):
                return words
        raise
    return "valid"


@st.composite
def probability_arrays_with_damage(draw):
    rows = draw(st.integers(1, 3))
    vocab = draw(st.integers(1, 6))
    raw = np.array(draw(st.lists(st.floats(0.01, 1.0), min_size=rows * vocab, max_size=rows * vocab)))
    array = (raw.reshape(rows, vocab) / raw.reshape(rows, vocab).sum(axis=1, keepdims=True)).copy()
    damage = draw(st.lists(st.tuples(st.integers(0, rows * vocab - 1), st.sampled_from(SPECIAL)), max_size=3))
    for where, value in damage:
        array.flat[where] = value
    return array


@settings(max_examples=300, deadline=None)
@given(probability_arrays_with_damage())
def test_two_pass_check_gives_the_entrywise_verdict_and_message(array):
    assert verdict(array) == entrywise_verdict(array)


@settings(max_examples=100, deadline=None)
@given(probability_arrays_with_damage())
def test_returned_sums_are_the_row_sums_of_a_valid_array(array):
    if entrywise_verdict(array) != "valid":
        return
    checked, sums = distribution_with_sums(array, "p")
    np.testing.assert_array_equal(sums, array.sum(axis=-1))
    np.testing.assert_array_equal(checked, array)


def test_finite_entries_whose_sum_overflows_are_reported_as_a_bad_sum_not_as_infinite_entries():
    with pytest.raises(ValueError, match="must sum to 1"), np.errstate(over="ignore"):
        as_distribution([1e308, 1e308], "p")


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ([0.5, np.nan, 0.5], "p contains NaN or infinite"),
        ([0.5, np.inf], "p contains NaN or infinite"),
        ([1.5, -0.5], "p contains negative entries"),
        ([0.5, 0.4], "p must sum to 1"),
        (1.0, "p must have at least one axis"),
        (np.zeros((2, 0)), "p has an empty vocabulary axis"),
        ("x", "p must be an array of probabilities"),
    ],
)
def test_bad_distribution_is_refused_naming_the_argument(value, words):
    with pytest.raises(ValueError, match=words):
        as_distribution(value, "p")


def test_pair_sums_are_broadcast_to_the_common_batch_shape():
    p = np.array([0.25, 0.75])
    q = np.array([[0.5, 0.5], [0.1, 0.9], [1.0, 0.0]])
    bp, bq, p_sums, q_sums = distribution_pair_with_sums(p, q)
    assert bp.shape == bq.shape == (3, 2)
    assert p_sums.shape == q_sums.shape == (3,)
    np.testing.assert_array_equal(p_sums, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(q_sums, q.sum(axis=-1))
    checked_p, checked_q = as_distribution_pair(p, q)
    np.testing.assert_array_equal(checked_p, bp)
    np.testing.assert_array_equal(checked_q, bq)


def test_pair_with_different_vocabularies_is_refused():
    with pytest.raises(ValueError, match="must share the vocabulary axis"):
        distribution_pair_with_sums([0.5, 0.5], [1.0, 0.0, 0.0])
