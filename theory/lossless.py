r"""Exact losslessness check of a multi-draft verification algorithm.

A verifier :math:`\pi(y \mid \bar x)` used with the draft law :math:`P` is lossless iff its output law equals
the target:

.. math:: \sum_{\bar x} P(\bar x)\, \pi(y \mid \bar x) = p(y) \quad \text{for every token } y

(Leviathan et al., ICML 2023, arXiv 2211.17192; Hu et al., ICLR 2025, arXiv 2502.18779). For small
vocabularies the sum is finite and the check is exact: :func:`check_lossless` enumerates every draft tuple
with :func:`theory.draft_laws.enumerate_drafts` and calls the user's function once per tuple.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from theory.checks import as_distribution, as_nonnegative
from theory.draft_laws import check_draft_law, enumerate_drafts
from theory.verifiers.base import Verifier


@dataclass(frozen=True)
class LosslessReport:
    r"""Result of :func:`check_lossless`.

    Attributes
    ----------
    lossless : bool
        Every conditional is a distribution and ``max_error <= tolerance``.
    max_error : float
        :math:`\max_y |\sum_{\bar x} P(\bar x)\pi(y \mid \bar x) - p(y)|`.
    worst_token : int
        The token ``y`` attaining ``max_error``.
    output_distribution : numpy.ndarray
        The exact output law :math:`\sum_{\bar x} P(\bar x)\pi(\cdot \mid \bar x)`, shape ``(V,)``.
    invalid_conditional : tuple of int or None
        The first draft tuple whose returned vector is not a distribution (a negative entry or a sum off 1
        by more than the tolerance), else ``None``.
    invalid_reason : str or None
        What is wrong with that vector.
    worst_drafts : tuple of int
        The draft tuple contributing most to the error at ``worst_token``: the maximiser of
        :math:`\mathrm{sign}(e)\, P(\bar x)(\pi(w \mid \bar x) - p(w))` where ``e`` is the signed error at
        ``w = worst_token``.
    """

    lossless: bool
    max_error: float
    worst_token: int
    output_distribution: np.ndarray
    invalid_conditional: tuple[int, ...] | None
    invalid_reason: str | None
    worst_drafts: tuple[int, ...]

    def __str__(self) -> str:
        verdict = "lossless" if self.lossless else "NOT lossless"
        text = f"{verdict}: max |output - p| = {self.max_error:.3g} at token {self.worst_token}"
        text += f" (largest contribution from drafts {self.worst_drafts})"
        if self.invalid_conditional is not None:
            text += f"; drafts {self.invalid_conditional}: {self.invalid_reason}"
        return text


def check_lossless(
    verify: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | Verifier,
    p,
    q,
    n: int,
    *,
    draft: str | None = None,
    tolerance: float = 1e-9,
) -> LosslessReport:
    r"""Check exactly whether a verifier is lossless for one target/draft pair.

    Parameters
    ----------
    verify : callable or Verifier
        ``verify(p, q, drafts) -> (V,)``, the verifier's output distribution :math:`\pi(\cdot \mid \bar x)`
        given the ordered drafts ``drafts`` (an int array of shape ``(n,)``, in draw order). For example
        ``theory.verifier("rrs").conditional``; a :func:`theory.verifier` itself stands for its
        ``conditional``.
    p, q : array_like, shape (V,)
        Target and draft distributions (``q`` is ``(n, V)`` for ``draft="independent"``).
    n : int
        Number of drafts.
    draft : str, optional
        The draft law: ``"iid"``, ``"wor"``, ``"greedy"``, ``"spechub"`` or ``"independent"``. Default: the
        verifier's own law when ``verify`` is a :func:`theory.verifier`, else ``"iid"``.
    tolerance : float
        Largest accepted :math:`|\sum_{\bar x} P(\bar x)\pi(y \mid \bar x) - p(y)|`, and largest accepted
        deviation of each conditional from a distribution.

    Returns
    -------
    LosslessReport

    Raises
    ------
    ValueError
        For bad ``p``, ``q``, ``n``, ``draft`` or ``tolerance``, and when ``verify`` returns something that is
        not a finite vector of shape ``(V,)``.

    Examples
    --------
    >>> import numpy as np
    >>> from theory import check_lossless, verifier
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> check_lossless(verifier("rrs").conditional, p, q, 2).lossless
    True
    """
    if isinstance(verify, Verifier):
        draft = verify.draft if draft is None else draft
        verify = verify.conditional
    draft = "iid" if draft is None else draft
    if not callable(verify):
        raise ValueError(f"verify must be a callable verify(p, q, drafts) -> (V,), got {verify!r}")
    tolerance = as_nonnegative(tolerance, "tolerance")
    p = as_distribution(p, "p")
    if p.ndim != 1:
        raise ValueError(f"p must be a single distribution of shape (V,), got shape {p.shape}")
    q, n = check_draft_law(q, n, draft)
    if q.shape[-1] != p.shape[-1]:
        raise ValueError(
            f"p and q must share the vocabulary axis: p has {p.shape[-1]} tokens, q {q.shape[-1]}"
        )
    tuples, probabilities = enumerate_drafts(q, n, draft)
    conditionals = np.empty((tuples.shape[0], p.shape[-1]))
    invalid, reason = None, None
    for index, drafts in enumerate(tuples):
        conditional = _checked_output(verify(p, q, drafts.copy()), p.shape[-1], drafts)
        if invalid is None:
            reason = _not_a_distribution(conditional, tolerance)
            invalid = tuple(map(int, drafts)) if reason else None
        conditionals[index] = conditional
    output = probabilities @ conditionals
    signed_error = output - p
    worst_token = int(np.argmax(np.abs(signed_error)))
    max_error = float(np.abs(signed_error[worst_token]))
    contribution = probabilities * (conditionals[:, worst_token] - p[worst_token])
    worst_index = int(np.argmax(np.sign(signed_error[worst_token]) * contribution))
    return LosslessReport(
        lossless=invalid is None and max_error <= tolerance,
        max_error=max_error,
        worst_token=worst_token,
        output_distribution=output,
        invalid_conditional=invalid,
        invalid_reason=reason,
        worst_drafts=tuple(map(int, tuples[worst_index])),
    )


def _checked_output(value, vocab: int, drafts: np.ndarray) -> np.ndarray:
    """The verify function's output as a float vector, or a ``ValueError`` saying why it cannot be one."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"verify returned a non-numeric value for drafts {drafts.tolist()}: {error}"
        ) from None
    if array.shape != (vocab,):
        raise ValueError(
            f"verify must return a vector of shape ({vocab},) (one entry per token), got shape {array.shape} "
            f"for drafts {drafts.tolist()}"
        )
    if not np.all(np.isfinite(array)):
        raise ValueError(f"verify returned NaN or infinite entries for drafts {drafts.tolist()}")
    return array


def _not_a_distribution(conditional: np.ndarray, tolerance: float) -> str | None:
    """Why ``conditional`` is not a probability distribution (within ``tolerance``), or ``None``."""
    if conditional.min() < -tolerance:
        return f"negative entry {conditional.min():.3g} at token {int(np.argmin(conditional))}"
    total = conditional.sum()
    if abs(total - 1.0) > tolerance:
        return f"entries sum to {total:.12g}, not 1"
    return None
