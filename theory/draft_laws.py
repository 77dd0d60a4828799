"""Draft sampling methods: the laws P on ordered n-tuples of draft tokens, enumerated and sampled.

A draft sampling method turns one draft distribution ``q`` into ``n`` ordered drafts ``(x_1, ..., x_n)``:

``"iid"``
    with replacement, :math:`P(\\bar x) = \\prod_j q(x_j)` (SpecInfer, SpecTr).
``"wor"``
    without replacement, successive sampling (Gumbel-top-n, Plackett-Luce order),
    :math:`P(\\bar x) = \\prod_j q(x_j) / (1 - \\sum_{l<j} q(x_l))` for distinct tokens (Jeon et al. 2024;
    Hu et al. ICLR 2025).
``"greedy"``
    the top ``n - 1`` tokens of ``q`` in decreasing order (ties to the lower index), then one draw from ``q``
    restricted to the remaining tokens and renormalised (Hu et al. ICLR 2025).
``"spechub"``
    ``n = 2``; with hub ``a = argmax q`` (first index), the pair ``(i, a)`` has probability ``q(i)`` for
    ``i != a`` and ``(a, i)`` has probability ``q(a) q(i) / (1 - q(a))`` (Sun et al., SpecHub, EMNLP 2024).
``"independent"``
    ``q`` has one row per draft, :math:`P(\\bar x) = \\prod_k q_k(x_k)` (several draft models, SpecInfer).

Enumeration is exact and meant for small vocabularies (tests, oracles, exact output distributions).
"""

from __future__ import annotations

import itertools

import numpy as np

from theory.checks import as_choice, as_count, as_distribution
from theory.verifier_table import DRAFT_LAW_TABLE, DRAFT_LAWS, check_draft_count

__all__ = [
    "DRAFT_LAWS",
    "acceptance_by_draft_count",
    "check_draft_law",
    "enumerate_drafts",
    "sample_drafts",
    "top_tokens",
]


def check_draft_law(q, n, draft: str) -> tuple[np.ndarray, int]:
    """Validate a single draft distribution for a draft law; return ``(q, n)``.

    ``q`` is ``(V,)`` for every law but ``"independent"``, where it is ``(n, V)``. Raises ``ValueError``
    when the law cannot produce ``n`` drafts from ``q`` (:func:`theory.verifier_table.check_draft_count`:
    too few tokens with ``q > 0`` for a law of distinct drafts; ``n != 2`` for ``"spechub"``).
    """
    draft = as_choice(draft, "draft", DRAFT_LAWS)
    n = as_count(n, "n")
    q = as_distribution(q, "q")
    if draft == "independent":
        if q.ndim != 2 or q.shape[0] != n:
            raise ValueError(f"q must have shape (n, V) = ({n}, V) for draft='independent', got {q.shape}")
        return q, n
    if q.ndim != 1:
        raise ValueError(f"q must be a single distribution of shape (V,) here, got shape {q.shape}")
    check_draft_count(draft, n, int(np.count_nonzero(q)))
    return q, n


def top_tokens(q: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest entries of ``q``, largest first, ties broken towards the lower index."""
    return np.argsort(-q, kind="stable")[:k]


def enumerate_drafts(q, n, draft: str = "iid") -> tuple[np.ndarray, np.ndarray]:
    """Every draft tuple with positive probability under the law, and its probability.

    Returns ``(tuples, probabilities)`` with ``tuples`` an int array of shape ``(M, n)`` (ordered drafts,
    in draw order) and ``probabilities`` of shape ``(M,)`` summing to 1. Cost grows like ``V**n``.
    """
    q, n = check_draft_law(q, n, draft)
    tuples: list[tuple[int, ...]] = []
    probabilities: list[float] = []
    if draft == "independent":
        supports = [np.flatnonzero(row) for row in q]
        for combo in itertools.product(*supports):
            tuples.append(combo)
            probabilities.append(float(np.prod([q[k, x] for k, x in enumerate(combo)])))
    elif draft == "iid":
        for combo in itertools.product(np.flatnonzero(q), repeat=n):
            tuples.append(combo)
            probabilities.append(float(np.prod(q[list(combo)])))
    elif draft == "wor":
        support = np.flatnonzero(q)
        for combo in itertools.permutations(support, n):
            probability, remaining = 1.0, set(support.tolist())
            for x in combo:
                # The mass not yet drawn, summed rather than 1 - drawn, which cancels for tiny tails.
                probability *= q[x] / q[sorted(remaining)].sum()
                remaining.discard(x)
            tuples.append(combo)
            probabilities.append(probability)
    elif draft == "greedy":
        top = top_tokens(q, n - 1)
        rest_mass = np.delete(q, top).sum()  # not 1 - q(T), which cancels for tiny tails
        for x in np.flatnonzero(q):
            if x not in top:
                tuples.append((*top, x))
                probabilities.append(q[x] / rest_mass)
    else:  # spechub
        hub = int(np.argmax(q))
        rest_mass = np.delete(q, hub).sum()  # not 1 - q(hub), which cancels for tiny tails
        for i in np.flatnonzero(q):
            if i != hub:
                tuples.append((i, hub))
                probabilities.append(q[i])
                tuples.append((hub, i))
                probabilities.append(q[hub] * q[i] / rest_mass)
    return np.array(tuples, dtype=np.int64).reshape(-1, n), np.array(probabilities, dtype=np.float64)


def sample_drafts(q, n, draft: str, rng: np.random.Generator) -> np.ndarray:
    """Draw one ordered tuple of ``n`` drafts from the law (int array of shape ``(n,)``, in draw order).

    ``"wor"`` uses the Gumbel-top-n trick: the tokens with the ``n`` largest ``log q + Gumbel`` scores, in
    decreasing score order, follow the successive-sampling law exactly.
    """
    q, n = check_draft_law(q, n, draft)
    vocab = q.shape[-1]
    if draft == "independent":
        return np.array([rng.choice(vocab, p=row) for row in q], dtype=np.int64)
    if draft == "iid":
        return rng.choice(vocab, size=n, p=q).astype(np.int64)
    if draft == "wor":
        with np.errstate(divide="ignore"):
            scores = np.log(q) + rng.gumbel(size=vocab)
        return np.argsort(-scores, kind="stable")[:n].astype(np.int64)
    if draft == "greedy":
        top = top_tokens(q, n - 1)
        rest = q.copy()
        rest[top] = 0.0
        last = rng.choice(vocab, p=rest / rest.sum())
        return np.array([*top, last], dtype=np.int64)
    hub = int(np.argmax(q))  # spechub
    first = int(rng.choice(vocab, p=q))
    if first != hub:
        return np.array([first, hub], dtype=np.int64)
    rest = q.copy()
    rest[hub] = 0.0
    return np.array([hub, rng.choice(vocab, p=rest / rest.sum())], dtype=np.int64)


def acceptance_by_draft_count(p, q, n: int, draft: str, acceptance) -> np.ndarray:
    """``acceptance(p, q, k)`` per row, with ``k = min(n, |supp q|)`` rows for a law of distinct drafts.

    A row of ``q`` with fewer tokens than ``n`` (a prompt-lookup drafter's one-hot ``q``) yields all of them,
    as the executor's tree decoder drafts it; ``k = 1`` is speculative sampling, :math:`\\sum_y \\min(p_y, q_y)`,
    whichever verifier was named. ``p``, ``q``: ``(rows, V)``; other laws call ``acceptance(p, q, n)`` once.
    """
    if not DRAFT_LAW_TABLE[draft].distinct:
        return np.atleast_1d(acceptance(p, q, n))
    counts = np.minimum(n, np.count_nonzero(q, axis=-1))
    out = np.empty(len(p))
    for k in np.unique(counts):
        rows = counts == k
        out[rows] = np.minimum(p[rows], q[rows]).sum(-1) if k == 1 else acceptance(p[rows], q[rows], int(k))
    return out
