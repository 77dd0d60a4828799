"""theory._wor_rows: the quadrature of many short rows at once against each row's own one-row evaluation."""

import numpy as np

from tests.theory.test_wor import random_lm_like_row, suffix_sums
from theory._wor import _PrefixInclusion
from theory._wor_rows import evaluate_rows


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


def test_rows_evaluated_together_equal_each_row_alone_on_lm_like_rows_bit_for_bit():
    # The padded evaluation, whose grids, token splits and sure thresholds differ from row to row, must
    # reproduce each row's own _PrefixInclusion exactly.
    for n in (3, 5, 8):
        q, suffix, needed, dust = lm_like_batch(n)
        together = np.full(suffix.shape, np.nan)
        evaluate_rows(together, needed, q, suffix, n, dust)
        for b in range(len(q)):
            reads = np.flatnonzero(needed[b])
            alone = _PrefixInclusion(q[b], suffix[b], n, reads, dust[b])(reads)
            np.testing.assert_array_equal(together[b, reads], alone)
            assert np.all(np.isnan(together[b, ~needed[b]]))


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
