"""Published example inputs, shipped so that examples, benchmarks and tests share one copy.

``SEQUOIA_DEMO_COUNTS``: the Sequoia repository's demo acceptance vector (Infini-AI-Lab/Sequoia,
``acceptance-rate-vector.pt``; JackFram/llama-68m drafting for Llama-2-7B on CNN/DailyMail), stored there as
float32 counts over 667 positions: ``p_k = counts[k-1] / 667`` is the probability that the k-th child of a node
is the accepted one (Sequoia's positional acceptance; 49 of the 667 positions accepted no child).
"""

import numpy as np

SEQUOIA_DEMO_COUNTS = [
    423,
    72,
    38,
    15,
    13,
    10,
    3,
    2,
    8,
    3,
    5,
    3,
    4,
    2,
    1,
    2,
    1,
    2,
    0,
    2,
    2,
    2,
    0,
    1,
    0,
    1,
    0,
    0,
    0,
    1,
    1,
    1,
]
SEQUOIA_DEMO_POSITIONS = 667


def sequoia_demo_acceptance() -> np.ndarray:
    """The demo vector as the repository computes it (float32 division), returned in float64."""
    counts = np.array(SEQUOIA_DEMO_COUNTS, dtype=np.float32)
    return (counts / np.float32(SEQUOIA_DEMO_POSITIONS)).astype(np.float64)
