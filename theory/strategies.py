"""Hypothesis strategies for property tests of speculative-decoding code.

Use them to test your own verifier, sampler or bound the way specbound tests its own::

    from hypothesis import given
    from theory import check_lossless, strategies

    @given(strategies.distribution_pairs(vocab_size=5), strategies.draft_counts(max_n=3))
    def test_my_verifier_is_lossless(pair, n):
        p, q = pair
        assert check_lossless(my_verify, p, q, n).lossless

The generated vectors are float64 probability distributions (non-negative, summing to 1 up to rounding)
and deliberately include the cases that break verifiers: exact zeros, one-hot vectors, near-uniform and
sharply peaked laws, identical pairs and pairs with disjoint supports.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

__all__ = ["distributions", "distribution_pairs", "draft_counts", "trees", "acceptance_vectors"]

_UNIT = st.floats(0.0, 1.0, allow_subnormal=False)

#: Default smallest positive probability. Smaller masses make ``1 - sum(q[drawn])`` cancel catastrophically
#: in float64 (successive sampling, the greedy and SpecHub laws) and sit far below the 1e-9 tolerances of
#: exact checks; pass ``min_probability=0`` to probe such tails deliberately.
MIN_PROBABILITY = 1e-6

#: Default vocabulary sizes: 1 to 8 tokens, small enough to enumerate every draft tuple exactly.
VOCAB_SIZES = st.integers(1, 8)
_DISTRIBUTION_KINDS = ("dirichlet", "softmax", "near_uniform", "peaked", "one_hot", "sparse")
_ZERO_KINDS = ("one_hot", "sparse")  # kinds whose zeros are the point; blurred when zeros are not allowed


def _vocab_strategy(vocab_size) -> st.SearchStrategy[int]:
    if isinstance(vocab_size, st.SearchStrategy):
        return vocab_size
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int | np.integer) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int or a hypothesis strategy, got {vocab_size!r}")
    return st.just(int(vocab_size))


def _check_floor(min_probability) -> float:
    if (
        isinstance(min_probability, bool)
        or not isinstance(min_probability, float | int)
        or not (0 <= min_probability <= 1e-2)
    ):
        raise ValueError(f"min_probability must be a number in [0, 0.01], got {min_probability!r}")
    return float(min_probability)


def _normalised(weights: np.ndarray, min_probability: float = 0.0) -> np.ndarray:
    weights = np.asarray(weights, dtype=np.float64)
    if weights.sum() <= 0:  # every weight drew 0: fall back on a point mass
        weights = np.zeros_like(weights)
        weights[0] = 1.0
    weights = weights / weights.sum()
    if min_probability > 0:
        weights = np.where(weights > 0, np.maximum(weights, min_probability), 0.0)
        weights = weights / weights.sum()
    return weights


@st.composite
def _distribution(
    draw, vocab: int, allow_zeros: bool, min_probability: float, kind: str | None = None
) -> np.ndarray:
    kind = kind or draw(st.sampled_from(_DISTRIBUTION_KINDS))
    if kind == "dirichlet":  # powers of uniforms: from flat (power 1) to spiky (power 8)
        power = draw(st.sampled_from([1.0, 2.0, 4.0, 8.0]))
        weights = np.array(draw(st.lists(_UNIT, min_size=vocab, max_size=vocab))) ** power
    elif kind == "softmax":  # softmax of scaled standard-normal-like logits, as a language model emits
        scale = draw(st.floats(0.1, 8.0))
        logits = scale * np.array(draw(st.lists(st.floats(-3.0, 3.0), min_size=vocab, max_size=vocab)))
        weights = np.exp(logits - logits.max())
    elif kind == "near_uniform":
        noise = draw(st.lists(st.floats(-0.05, 0.05), min_size=vocab, max_size=vocab))
        weights = 1.0 + np.array(noise)
    elif kind == "peaked":  # one token takes 1 - eps, the rest share eps
        eps = draw(st.floats(1e-6, 0.3))
        weights = np.full(vocab, eps / max(vocab - 1, 1))
        weights[draw(st.integers(0, vocab - 1))] = 1.0 - eps if vocab > 1 else 1.0
    elif kind == "one_hot":
        weights = np.zeros(vocab)
        weights[draw(st.integers(0, vocab - 1))] = 1.0
    else:  # sparse: a random support mask over Dirichlet-like weights
        mask = np.array(draw(st.lists(st.booleans(), min_size=vocab, max_size=vocab)))
        mask[draw(st.integers(0, vocab - 1))] = True
        weights = mask * (0.05 + np.array(draw(st.lists(_UNIT, min_size=vocab, max_size=vocab))))
    distribution = _normalised(weights)
    if not allow_zeros:
        blend = draw(st.floats(1e-4, 0.1))
        distribution = (1.0 - blend) * distribution + blend / vocab
    return _normalised(distribution, min_probability)


def distributions(
    vocab_size=VOCAB_SIZES, *, allow_zeros: bool = True, min_probability: float = MIN_PROBABILITY
) -> st.SearchStrategy[np.ndarray]:
    """Probability vectors of shape ``(V,)``.

    Parameters
    ----------
    vocab_size : int or hypothesis strategy of int
        ``V``, fixed or drawn (default 1 to 8).
    allow_zeros : bool
        If False every entry is strictly positive (one-hot and sparse draws are blended with a little
        uniform mass).
    min_probability : float
        Positive entries are raised to at least about this value (see :data:`MIN_PROBABILITY`); exact
        zeros stay zero.

    Examples
    --------
    >>> from hypothesis import given
    >>> @given(distributions(vocab_size=4))
    ... def test_sums_to_one(p):
    ...     assert abs(p.sum() - 1) < 1e-12
    """
    min_probability = _check_floor(min_probability)
    return _vocab_strategy(vocab_size).flatmap(
        lambda vocab: _distribution(vocab, allow_zeros, min_probability)
    )


@st.composite
def _pair(draw, vocab: int, allow_zeros: bool, floor: float) -> tuple[np.ndarray, np.ndarray]:
    kinds = ["independent", "identical", "perturbed", "mixture"]
    if allow_zeros and vocab >= 2:
        kinds.append("disjoint")
    kind = draw(st.sampled_from(kinds))
    if kind == "disjoint":
        in_target = np.array(draw(st.lists(st.booleans(), min_size=vocab, max_size=vocab)))
        in_target[0], in_target[-1] = True, False  # both supports non-empty
        target = draw(_distribution(vocab, True, floor, "dirichlet")) + 1e-3
        proposal = draw(_distribution(vocab, True, floor, "dirichlet")) + 1e-3
        return _normalised(target * in_target, floor), _normalised(proposal * ~in_target, floor)
    p = draw(_distribution(vocab, allow_zeros, floor))
    if kind == "identical":
        return p, p.copy()
    if kind == "independent":
        return p, draw(_distribution(vocab, allow_zeros, floor))
    if kind == "perturbed":  # a draft model's logits: the target's plus noise, at a temperature
        noise = np.array(draw(st.lists(st.floats(-2.0, 2.0), min_size=vocab, max_size=vocab)))
        with np.errstate(divide="ignore"):
            logits = np.log(p) + noise
        q = _normalised(np.exp(logits - logits.max()))
        if not allow_zeros:
            q = 0.999 * q + 0.001 / vocab
        return p, _normalised(q, floor)
    weight = draw(st.floats(0.0, 1.0))  # mixture: q between p and another law
    other = draw(_distribution(vocab, allow_zeros, floor))
    return p, _normalised((1.0 - weight) * p + weight * other, floor)


def distribution_pairs(
    vocab_size=VOCAB_SIZES, *, allow_zeros: bool = True, min_probability: float = MIN_PROBABILITY
) -> st.SearchStrategy[tuple[np.ndarray, np.ndarray]]:
    """Target/draft pairs ``(p, q)`` over a shared vocabulary.

    Covers independent pairs, identical pairs (``q == p``: every verifier must accept always), perturbed
    pairs (``q = softmax(log p + noise)``, like a small draft model), mixtures, and pairs with disjoint
    supports (acceptance 0 for one draft) when zeros are allowed. ``allow_zeros`` and ``min_probability``
    act as in :func:`distributions`.

    Examples
    --------
    >>> from hypothesis import given
    >>> from theory import acceptance_rate
    >>> @given(distribution_pairs(vocab_size=st.integers(2, 6)))
    ... def test_acceptance_is_a_probability(pair):
    ...     assert 0 <= acceptance_rate(*pair) <= 1 + 1e-12
    """
    min_probability = _check_floor(min_probability)
    return _vocab_strategy(vocab_size).flatmap(lambda vocab: _pair(vocab, allow_zeros, min_probability))


def draft_counts(max_n: int = 4) -> st.SearchStrategy[int]:
    """Numbers of drafts per step, ``1`` to ``max_n``.

    Examples
    --------
    >>> from hypothesis import given
    >>> @given(draft_counts(max_n=3))
    ... def test_n_in_range(n):
    ...     assert 1 <= n <= 3
    """
    if isinstance(max_n, bool) or not isinstance(max_n, int | np.integer) or max_n < 1:
        raise ValueError(f"max_n must be a positive int, got {max_n!r}")
    return st.integers(1, int(max_n))


# Token-tree strategies (``trees()``) are added here alongside these by the tree-planning module.


# -- token trees -----------------------------------------------------------------------------------------


def _check_positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


@st.composite
def _tree(draw, max_size: int):
    from theory.trees import Tree  # deferred: keeps importing the strategies light

    size = draw(st.integers(1, max_size))
    # a uniform parent among the earlier nodes draws random recursive trees; shrinking goes to the star
    return Tree([-1] + [draw(st.integers(0, i - 1)) for i in range(1, size)])


def trees(max_size: int = 12) -> st.SearchStrategy:
    """Token trees (:class:`theory.trees.Tree`) with 1 to ``max_size`` nodes, root included.

    Examples
    --------
    >>> from hypothesis import given
    >>> @given(trees(max_size=6))
    ... def test_mask_diagonal(tree):
    ...     assert tree.attention_mask().diagonal().all()
    """
    return _tree(_check_positive(max_size, "max_size"))


@st.composite
def _acceptance(draw, width: int, rows: int | None, monotone: bool):
    def vector():
        weights = np.array(draw(st.lists(_UNIT, min_size=width, max_size=width)))
        total = draw(st.sampled_from([0.0, 1.0]) | _UNIT)  # sum(acc) <= 1: the rest is "none accepted"
        vector = weights * (total / weights.sum()) if weights.sum() > 0 else weights
        return np.sort(vector)[::-1].copy() if monotone else vector

    return vector() if rows is None else np.stack([vector() for _ in range(rows)])


def acceptance_vectors(
    max_width: int = 4, *, rows: int | None = None, monotone: bool = False
) -> st.SearchStrategy:
    """Positional acceptance vectors (entries in [0, 1], sum at most 1) of length 1 to ``max_width``.

    With ``rows`` an int, per-depth matrices of that many rows; ``monotone`` sorts each row non-increasing
    (the case where best-first growth is optimal).
    """
    max_width = _check_positive(max_width, "max_width")
    if rows is not None:
        rows = _check_positive(rows, "rows")
    return st.integers(1, max_width).flatmap(lambda width: _acceptance(width, rows, monotone))
