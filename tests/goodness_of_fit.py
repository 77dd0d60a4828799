"""Statistical helpers shared by the test suites (goodness of fit of sampled counts against exact laws)."""

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
