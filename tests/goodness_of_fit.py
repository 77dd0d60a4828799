"""The statistical tests of every suite: one z-score and one goodness-of-fit test of counts against a law.

Every statistical test in tests/ uses these two, with a fixed seed, a stated threshold and a negative control.
"""

import numpy as np
from scipy import stats


def law_p_value(observed: np.ndarray, probabilities: np.ndarray) -> float:
    """Chi-square p-value of counts against a law; 0 when a count falls on a zero-probability cell.

    Cells with an expected count below 5 are pooled so the chi-square approximation holds.
    """
    observed = np.asarray(observed, dtype=np.float64)
    if np.any(observed[probabilities <= 0] > 0):
        return 0.0
    expected = probabilities * observed.sum()
    large = expected >= 5
    small = ~large & (probabilities > 0)
    observed_cells = np.append(observed[large], observed[small].sum())
    expected_cells = np.append(expected[large], expected[small].sum())
    if expected_cells[-1] == 0:
        observed_cells, expected_cells = observed_cells[:-1], expected_cells[:-1]
    if len(expected_cells) < 2:
        return 1.0  # one possible cell: the zero-cell check above is the whole test
    expected_cells *= observed_cells.sum() / expected_cells.sum()
    return float(stats.chisquare(observed_cells, expected_cells).pvalue)


def z_score(samples, expected: float, variance: float | None = None) -> float:
    """``(mean(samples) - expected) / standard error``: approximately standard normal under the null.

    ``variance`` is the known variance of one sample (e.g. ``r (1 - r)`` for Bernoulli outcomes of rate
    ``r``); without it the sample variance (``ddof=1``) is used. With a zero standard error the samples must
    match ``expected`` exactly: 0 if they do (to 1e-12), infinity otherwise.
    """
    samples = np.asarray(samples, dtype=np.float64)
    spread = samples.var(ddof=1) if variance is None else variance
    error2 = spread / samples.size
    gap = samples.mean() - expected
    if error2 < 1e-15:
        return 0.0 if abs(gap) < 1e-12 else float(np.inf)
    return float(gap / np.sqrt(error2))
