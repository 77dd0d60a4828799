"""theory._wor_rows: the quadrature of many short rows at once against each row's own one-row evaluation."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.theory.test_wor import random_lm_like_row, suffix_sums
from theory._wor import _PrefixInclusion
from theory._wor_rows import _Rows, evaluate_rows


def lm_like_batch(n, rows=6, reads=40):
    """LM-sized rows (V = 50..1500), every other one with Poisson dust, ``reads`` random prefixes each."""
    pairs = [random_lm_like_row(10 * n + seed) for seed in range(rows)]
    width = max(r[1].size for r in pairs)
    q, suffix = np.zeros((rows, width)), np.zeros((rows, width + 1))
    needed = np.zeros((rows, width + 1), dtype=bool)
    rng = np.random.default_rng(n)
    dust = np.where(np.arange(rows) % 2 == 0, 0.0, 0.2)
    for b, (_, q_row, _) in enumerate(pairs):
        q[b, : q_row.size] = q_row * (1.0 - dust[b])
        suffix[b] = suffix_sums(q[b])
        lowest = 0 if dust[b] else n
        needed[b, rng.choice(np.arange(lowest, q_row.size), size=reads, replace=False)] = True
    return q, suffix, needed & (suffix > 0), dust


def assert_together_equals_each_row_alone(q, suffix, needed, n, dust):
    """evaluate_rows on the batch against each row's own _PrefixInclusion, bit for bit; NaN where not needed."""
    together = np.full(suffix.shape, np.nan)
    evaluate_rows(together, needed, q, suffix, n, dust)
    for b in range(len(q)):
        reads = np.flatnonzero(needed[b])
        if reads.size:
            alone = _PrefixInclusion(q[b], suffix[b], n, reads, dust[b])(reads)
            np.testing.assert_array_equal(together[b, reads], alone)
        assert np.all(np.isnan(together[b, ~needed[b]]))


def test_rows_evaluated_together_equal_each_row_alone_on_lm_like_rows_bit_for_bit():
    # The padded evaluation, whose grids, token splits and sure thresholds differ from row to row, must
    # reproduce each row's own _PrefixInclusion exactly.
    for n in (3, 5, 8):
        q, suffix, needed, dust = lm_like_batch(n)
        assert_together_equals_each_row_alone(q, suffix, needed, n, dust)


def test_rows_split_into_several_calls_give_the_same_values(monkeypatch):
    import theory._wor_rows as rows

    q, suffix, needed, dust = lm_like_batch(4)
    whole = np.full(suffix.shape, np.nan)
    evaluate_rows(whole, needed, q, suffix, 4, dust)
    monkeypatch.setattr(rows, "BATCH_ELEMENTS", 1)  # one row per call
    split = np.full(suffix.shape, np.nan)
    evaluate_rows(split, needed, q, suffix, 4, dust)
    np.testing.assert_array_equal(whole, split)


def test_rows_comparison_can_fail():
    # Negative control: the same rows with the dust moved to the other rows differ from each row alone.
    q, suffix, needed, dust = lm_like_batch(5)
    moved = np.full(suffix.shape, np.nan)
    evaluate_rows(moved, needed, q, suffix, 5, np.where(dust > 0, 0.0, 0.2))
    reads = np.flatnonzero(needed[1])
    alone = _PrefixInclusion(q[1], suffix[1], 5, reads, dust[1])(reads)
    assert np.max(np.abs(moved[1, reads] - alone)) > 1e-6


def top_k_like_batch(n, seed, rows=12):
    """Rows shaped like the top-20 positions of ``bound --logs``: ~20 tokens, a few of them tiny (small-clock
    tokens, through the moment series) or none (every token in the prefix recursion), half with Poisson dust."""
    rng = np.random.default_rng(seed)
    q = np.zeros((rows, 22))
    dust = np.where(np.arange(rows) % 2 == 1, rng.uniform(0.01, 0.3, rows), 0.0)
    for b in range(rows):
        size = int(rng.integers(n + 2, 21))
        q[b, :size] = rng.dirichlet(np.full(size, rng.choice([0.3, 1.0, 5.0])))
        if b % 4 >= 2:  # a tiny token inside the row: small-clock at every grid point
            q[b, int(rng.integers(0, size))] = 1e-9
        q[b] *= (1.0 - dust[b]) / q[b].sum()
    suffix = np.stack([suffix_sums(row) for row in q])
    needed = (rng.random(suffix.shape) < 0.5) & (suffix > 0)
    needed[dust == 0, :n] = False
    needed[:, n] = True  # every row reads something (each has at least n + 2 tokens, so s_n > 0)
    return q, suffix, needed, dust


@pytest.mark.parametrize("n", [3, 4, 8])
def test_rows_of_every_kind_evaluated_together_equal_each_row_alone_bit_for_bit(n):
    # Rows without small-clock tokens skip the moment series and Newton's identities (their small-clock factor
    # is 1, or the dust's Poisson sums); the values must still be the one-row version's, bit for bit.
    kinds = np.zeros(3, dtype=int)
    for seed in range(4):
        q, suffix, needed, dust = top_k_like_batch(n, seed)
        rows = _Rows(q, suffix, n, needed, dust)
        kinds += [rows.series_rows, rows.dust_rows, len(q) - rows.series_rows - rows.dust_rows]
        assert_together_equals_each_row_alone(q, suffix, needed, n, dust)
    assert np.all(kinds > 0), kinds  # series rows, dust-only rows and plain rows were all exercised


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 8), st.integers(1, 9))
def test_short_rows_of_mixed_kinds_together_equal_each_row_alone(seed, n, rows):
    q, suffix, needed, dust = top_k_like_batch(n, seed, rows)
    assert_together_equals_each_row_alone(q, suffix, needed, n, dust)
