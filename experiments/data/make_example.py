"""Regenerate ``example_pair.npz``: the target/draft pair that ``specbound bound --example`` analyses.

A realistic next-token pair without running a model: the target ``p`` is the softmax of a peaked logit
vector over V = 1000 tokens (Gaussian logits plus a heavy head of a few strongly preferred tokens, like a
language model that is fairly sure of the next word); the draft ``q`` is the softmax of the same logits,
shrunk towards zero (a less confident small model) and perturbed by Gaussian noise (its own mistakes).
Deterministic (numpy PCG64, seed 20250218); the file is committed, so the CLI never needs this script.

    python experiments/data/make_example.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB = 1000
SEED = 20250218


def softmax(logits: np.ndarray) -> np.ndarray:
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def example_pair() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    logits = 1.5 * rng.standard_normal(VOCAB)
    head = rng.choice(VOCAB, size=5, replace=False)
    logits[head] += np.array([9.0, 8.0, 7.5, 6.0, 5.0])  # a peaked head: the top token takes ~0.4
    p = softmax(logits)
    q = softmax(0.8 * logits + 0.7 * rng.standard_normal(VOCAB))
    return p, q


def main() -> None:
    p, q = example_pair()
    path = Path(__file__).with_name("example_pair.npz")
    np.savez_compressed(path, p=p, q=q)
    print(
        f"wrote {path}: V = {VOCAB}, max p = {p.max():.3f}, max q = {q.max():.3f}, "
        f"sum min(p, q) = {np.minimum(p, q).sum():.4f}"
    )


if __name__ == "__main__":
    main()
