"""The verifier interface and the arithmetic every verifier shares (see :mod:`theory.verifiers`)."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from theory.checks import as_count, as_distribution_pair
from theory.draft_laws import check_draft_law, enumerate_drafts, sample_drafts, top_tokens
from theory.verifier_table import VERIFIER_TABLE, check_draft_count

# ---------------------------------------------------------------------------------------------------------
# Shared arithmetic


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """``min(1, numerator / denominator)``, and 1 where the denominator is 0 (such drafts never occur)."""
    safe = np.where(denominator > 0, denominator, 1.0)
    return np.where(denominator > 0, np.minimum(1.0, numerator / safe), 1.0)


def _normalise(mass: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Normalise non-negative ``mass`` along the last axis; rows with no mass become ``fallback``.

    A row without mass is only ever reached with probability 0 (for example the residual when ``p == q``),
    so the fallback never changes an output law; it keeps the arithmetic free of 0/0.
    """
    total = mass.sum(axis=-1, keepdims=True)
    return np.where(total > 0, mass / np.where(total > 0, total, 1.0), fallback)


def _draw(distribution: np.ndarray, rng: np.random.Generator) -> int:
    """One token from a (possibly unnormalised, non-negative) vector by inverting its cumulative sum."""
    cumulative = np.cumsum(distribution)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, distribution.shape[-1] - 1)


def _coin(probability: float, rng: np.random.Generator) -> bool:
    return bool(rng.random() < probability)


def _at(rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``rows[m, tokens[m]]`` for a stack of rows ``(M, V)`` (or one row ``(V,)`` shared by all)."""
    if rows.ndim == 1:
        return rows[tokens]
    return rows[np.arange(tokens.shape[0]), tokens]


def _check_rng(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(
            f"rng must be a numpy.random.Generator (e.g. numpy.random.default_rng(0)), got {rng!r}"
        )
    return rng


def _check_batch(q: np.ndarray, n: int, draft: str) -> None:
    """:func:`theory.verifier_table.check_draft_count` for a batch of ``q`` rows (the smallest support)."""
    support = int(np.count_nonzero(q, axis=-1).min()) if q.size else n
    check_draft_count(draft, n, support, "a row of q")


def _check_drafts(q: np.ndarray, drafts, draft: str) -> np.ndarray:
    """Validate ordered draft tuples (``(n,)`` or ``(M, n)``) against the support of the draft law."""
    array = np.asarray(drafts)
    if array.ndim not in (1, 2) or array.shape[-1] == 0:
        raise ValueError(f"drafts must have shape (n,) or (M, n) with n >= 1, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"drafts must be integer token ids, got dtype {array.dtype}")
    tuples = array.reshape(-1, array.shape[-1]).astype(np.int64)
    n, vocab = tuples.shape[1], q.shape[-1]
    check_draft_law(q, n, draft)
    if tuples.min() < 0 or tuples.max() >= vocab:
        raise ValueError(
            f"drafts must be token ids in [0, {vocab}), got range [{tuples.min()}, {tuples.max()}]"
        )
    if np.any(q[tuples] <= 0):
        raise ValueError("drafts contains a token with q = 0, which the draft law never proposes")
    if draft in ("wor", "spechub") or (draft == "greedy" and n > 1):
        if np.any(np.diff(np.sort(tuples, axis=1), axis=1) == 0):
            raise ValueError(f"drafts must be distinct tokens under draft={draft!r}")
    if draft == "greedy" and n > 1 and np.any(tuples[:, :-1] != top_tokens(q, n - 1)):
        raise ValueError(f"drafts must start with the top n - 1 tokens of q {top_tokens(q, n - 1).tolist()}")
    if draft == "spechub" and not np.all(np.any(tuples == np.argmax(q), axis=1)):
        raise ValueError(f"drafts must contain the hub token argmax(q) = {int(np.argmax(q))} under SpecHub")
    return tuples


def _scalar_or_array(value: np.ndarray):
    return value[()] if np.ndim(value) == 0 else value


# ---------------------------------------------------------------------------------------------------------
# The interface


class Verifier(ABC):
    """A multi-draft verification algorithm together with the draft law it expects.

    Attributes
    ----------
    name : str
        The name accepted by :func:`verifier`, a key of :data:`theory.verifier_table.VERIFIER_TABLE`.
    draft : str
        Its draft law, read from that table (one of :data:`theory.verifier_table.DRAFT_LAWS`).
    """

    name: str
    draft: str

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.draft = VERIFIER_TABLE[cls.name].draft

    def acceptance(self, p, q, n: int):
        r"""Exact acceptance rate :math:`P(y \in \bar x)` for ``n`` drafts; batched over leading axes.

        Parameters
        ----------
        p, q : array_like, shape (..., V)
            Target and draft distributions.
        n : int
            Number of drafts.

        Returns
        -------
        float or numpy.ndarray
            A float for single distributions, an array of the batch shape otherwise.
        """
        p, q = as_distribution_pair(p, q)
        n = as_count(n, "n")
        _check_batch(q, n, self.draft)
        return _scalar_or_array(np.asarray(self._acceptance(p, q, n), dtype=np.float64))

    def conditional(self, p, q, drafts) -> np.ndarray:
        r"""Exact output distribution :math:`\pi(\cdot \mid \bar x)` given ordered drafts (draw order).

        ``drafts`` is one tuple ``(n,)`` (returns ``(V,)``) or a stack ``(M, n)`` (returns ``(M, V)``).
        """
        p, q = self._single(p, q)
        tuples = _check_drafts(q, drafts, self.draft)
        result = self._conditional(p, q, tuples)
        return result[0] if np.ndim(drafts) == 1 else result

    def output_distribution(self, p, q, n: int) -> np.ndarray:
        r"""Exact :math:`\sum_{\bar x} P(\bar x)\, \pi(\cdot \mid \bar x)` by enumerating the draft law."""
        p, q = self._single(p, q)
        tuples, probabilities = enumerate_drafts(q, n, self.draft)
        return probabilities @ self._conditional(p, q, tuples)

    def sample(self, p, q, n: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """Run one step: draw drafts from the draft law, then the algorithm with explicit coin flips.

        Returns ``(drafts, token)``: the ``(n,)`` drafts in draw order and the output token.
        """
        p, q = self._single(p, q)
        rng = _check_rng(rng)
        drafts = sample_drafts(q, n, self.draft, rng)
        return drafts, self._simulate(p, q, drafts, rng)

    def max_exact_vocab(self, n: int) -> int | None:
        """Largest vocabulary for which :meth:`acceptance` is exact and tractable (``None``: any size)."""
        return None

    def __repr__(self) -> str:
        return f"verifier({self.name!r}, draft={self.draft!r})"

    @staticmethod
    def _single(p, q) -> tuple[np.ndarray, np.ndarray]:
        p, q = as_distribution_pair(p, q)
        if p.ndim != 1:
            raise ValueError(f"p and q must be single distributions of shape (V,) here, got shape {p.shape}")
        return p, q

    @abstractmethod
    def _acceptance(self, p: np.ndarray, q: np.ndarray, n: int) -> np.ndarray: ...

    @abstractmethod
    def _conditional(self, p: np.ndarray, q: np.ndarray, drafts: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def _simulate(
        self, p: np.ndarray, q: np.ndarray, drafts: np.ndarray, rng: np.random.Generator
    ) -> int: ...
