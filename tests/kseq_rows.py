"""Vocabulary-sized pairs for K-SEQ's division factor, shared by the numpy and torch twins' tests.

The twins bin the ratios ``p/q`` into buckets of ``[1, n]`` before their last halvings
(``theory.verifiers.iid.KSEQ_BUCKETS``); these rows put many ratios exactly on bucket edges and zeros in ``p`` and
``q``, where a bucketed search could go wrong.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from theory.verifiers.iid import KSEQ_BUCKETS

#: Arguments of :func:`kseq_row`: seed, Dirichlet concentration, drafts, shape.
KSEQ_ROW_ARGUMENTS = (
    st.integers(0, 2**32 - 1),
    st.sampled_from([0.05, 0.5, 5.0]),
    st.integers(2, 8),
    st.sampled_from(["plain", "edges", "sparse"]),
)


def kseq_row(
    seed: int, concentration: float, n: int, shape: str, vocab: int
) -> tuple[np.ndarray, np.ndarray]:
    """A ``(p, q)`` pair of ``vocab`` tokens: Dirichlet draws (``"plain"``), with a third of the ratios exactly
    on the bucket edges of ``[1, n]`` (``"edges"``), or with a fifth of each side zeroed (``"sparse"``)."""
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.full(vocab, concentration))
    p = rng.dirichlet(np.full(vocab, concentration))
    if shape == "edges":
        k = rng.integers(0, KSEQ_BUCKETS + 1, vocab // 3)
        p[: vocab // 3] = q[: vocab // 3] * (1.0 + (n - 1.0) / KSEQ_BUCKETS * k)
    elif shape == "sparse":
        q[rng.random(vocab) < 0.2] = 0.0
        p[rng.random(vocab) < 0.2] = 0.0
    return p / p.sum(), q / q.sum()
