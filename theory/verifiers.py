r"""Multi-draft verification algorithms: exact acceptance, exact output law, and a step-by-step simulation.

A verifier is a conditional law :math:`\pi(y \mid \bar x)` of the output token ``y`` given the ordered drafts
:math:`\bar x = (x_1, \dots, x_n)` drawn from a draft law :math:`P` (see :mod:`theory.draft_laws`). It is
lossless iff :math:`\sum_{\bar x} P(\bar x)\, \pi(y \mid \bar x) = p(y)` for every ``y``, and its acceptance
rate is :math:`\alpha = P(y \in \bar x)` (Hu et al., ICLR 2025, arXiv 2502.18779; Sun et al., SpecTr,
NeurIPS 2023, arXiv 2310.15141).

Every verifier exposes the same four routes, which the tests play against each other:

``acceptance(p, q, n)``
    exact acceptance rate (closed form where one exists, else an exact recursion), batched where the
    closed form allows;
``conditional(p, q, drafts)``
    the exact output distribution given one ordered draft tuple (``(n,)``) or a stack of them (``(M, n)``):
    the verifier's definition;
``output_distribution(p, q, n)``
    :math:`\sum_{\bar x} P(\bar x)\, \pi(\cdot \mid \bar x)` by enumerating the draft law (small ``V``);
``sample(p, q, n, rng)``
    one step, drafts from :func:`theory.draft_laws.sample_drafts` and then the algorithm run with coin flips.

``p`` is the target distribution and ``q`` the draft distribution throughout (several papers swap them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from theory.checks import as_choice, as_count, as_distribution_pair
from theory.draft_laws import check_draft_law, enumerate_drafts, sample_drafts, top_tokens

#: Names accepted by :func:`verifier`.
VERIFIERS = ("nss", "naive", "rrs", "rrs_wor", "kseq", "spechub", "greedy", "optimal")

#: RRS without replacement for ``n >= 3`` recurses over ``V ** (n - 2)`` rejected-token paths, each closed in
#: O(V log V); beyond this many paths the exact method is refused rather than left to run for minutes.
RRS_WOR_MAX_PATHS = 5000


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
    """The draft-law checks of :func:`theory.draft_laws.check_draft_law`, for a batch of ``q`` rows."""
    if draft == "spechub" and n != 2:
        raise ValueError(f"n must be 2 for draft='spechub' (SpecHub is defined for two drafts), got {n}")
    if draft in ("wor", "greedy", "spechub") and n > 1:
        support = int(np.count_nonzero(q, axis=-1).min())
        if support < n:
            raise ValueError(
                f"n = {n} drafts with draft={draft!r} need at least n tokens with q > 0; "
                f"a row of q has {support}"
            )


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
        The name accepted by :func:`verifier`.
    draft : str
        Its draft law, one of :data:`theory.draft_laws.DRAFT_LAWS`.
    """

    name: str
    draft: str

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


# ---------------------------------------------------------------------------------------------------------
# Baselines with i.i.d. drafts


class NaiveSpeculativeSampling(Verifier):
    r"""NSS: sample ``y ~ p`` and ignore the drafts (SpecInfer's naive sampling; Miao et al., ASPLOS 2024,
    arXiv 2305.09781). Lossless trivially.

    Acceptance (closed form, Thomas et al. 2025 App. B): :math:`\alpha = \sum_y p(y)\,(1 - (1 - q(y))^n)`.
    """

    name, draft = "nss", "iid"

    def _acceptance(self, p, q, n):
        return np.sum(p * (1.0 - (1.0 - q) ** n), axis=-1)

    def _conditional(self, p, q, drafts):
        return np.broadcast_to(p, (drafts.shape[0], p.shape[-1])).copy()

    def _simulate(self, p, q, drafts, rng):
        return _draw(p, rng)


class NaiveTree(Verifier):
    r"""Single-draft speculative sampling on ``x_1`` (Leviathan et al., ICML 2023, arXiv 2211.17192); the
    residual sample may coincide with another draft.

    :math:`\pi(\cdot \mid \bar x) = a\,\delta_{x_1} + (1 - a)\,(p - q)_+ / \sum (p - q)_+` with
    :math:`a = \min(1, p(x_1)/q(x_1))`. Acceptance (closed form, Thomas et al. 2025 App. B):
    :math:`\alpha = \sum \min(p, q) + \sum_y (p - q)_+(y)\,(1 - (1 - q(y))^{n-1})`.
    """

    name, draft = "naive", "iid"

    def _acceptance(self, p, q, n):
        return np.sum(np.minimum(p, q), axis=-1) + np.sum(
            np.maximum(p - q, 0.0) * (1.0 - (1.0 - q) ** (n - 1)), axis=-1
        )

    def _conditional(self, p, q, drafts):
        first = drafts[:, 0]
        accept = _ratio(p[first], q[first])
        result = (1.0 - accept)[:, None] * _normalise(np.maximum(p - q, 0.0), p)
        result[np.arange(first.shape[0]), first] += accept
        return result

    def _simulate(self, p, q, drafts, rng):
        first = drafts[0]
        if _coin(p[first] / q[first], rng):
            return int(first)
        return _draw(np.maximum(p - q, 0.0), rng)


class RecursiveRejectionSampling(Verifier):
    r"""RRS with i.i.d. drafts: SpecInfer's multi-step speculative sampling (Miao et al., ASPLOS 2024,
    arXiv 2305.09781).

    With :math:`p_1 = p`: accept :math:`x_i` with probability :math:`\min(1, p_i(x_i)/q(x_i))`, otherwise
    :math:`p_{i+1} = (p_i - q)_+ / \sum (p_i - q)_+`; if all ``n`` are rejected, output
    :math:`y \sim p_{n+1}`.
    Acceptance (closed form): :math:`\alpha = 1 - \prod_{i=1}^n (1 - r_i)`, :math:`r_i = \sum \min(p_i, q)`;
    the final residual never hits a rejected draft, so this is also ``P(output in drafts)``.
    """

    name, draft = "rrs", "iid"

    @staticmethod
    def _residuals(p, q, n):
        r""":math:`p_1, \dots, p_{n+1}`, each along the last axis (the fallback only covers ``p_i = q``)."""
        residuals = [p]
        for _ in range(n):
            residuals.append(_normalise(np.maximum(residuals[-1] - q, 0.0), residuals[-1]))
        return residuals

    def _acceptance(self, p, q, n):
        residuals = self._residuals(p, q, n)
        rejection = np.ones(p.shape[:-1])
        for p_i in residuals[:-1]:
            rejection = rejection * (1.0 - np.sum(np.minimum(p_i, q), axis=-1))
        return 1.0 - rejection

    def _conditional(self, p, q, drafts):
        residuals = self._residuals(p, q, drafts.shape[1])
        result = np.zeros((drafts.shape[0], p.shape[-1]))
        remaining = np.ones(drafts.shape[0])
        for i, p_i in enumerate(residuals[:-1]):
            x = drafts[:, i]
            accept = _ratio(p_i[x], q[x])
            result[np.arange(x.shape[0]), x] += remaining * accept
            remaining = remaining * (1.0 - accept)
        return result + remaining[:, None] * residuals[-1]

    def _simulate(self, p, q, drafts, rng):
        p_i = p
        for x in drafts:
            if _coin(p_i[x] / q[x], rng):
                return int(x)
            excess = np.maximum(p_i - q, 0.0)
            p_i = excess / excess.sum()  # a rejection implies p_i != q, so the excess has mass
        return _draw(p_i, rng)


class RecursiveRejectionSamplingWithoutReplacement(Verifier):
    r"""RRS without replacement (Jeon et al. 2024, arXiv 2402.05109; Sequoia, Chen et al. 2024,
    arXiv 2402.12374): drafts by successive sampling, verified **in draw order**.

    With :math:`p_1 = p, q_1 = q`: accept :math:`x_i` with probability :math:`\min(1, p_i(x_i)/q_i(x_i))`,
    otherwise :math:`p_{i+1} = \mathrm{norm}((p_i - q_i)_+)` and :math:`q_{i+1}` is :math:`q_i` with
    :math:`x_i` removed and renormalised; after ``n`` rejections output :math:`y \sim p_{n+1}`.

    Acceptance (exact): the recursion over rejected-token paths
    :math:`A_k(p, q) = r + \sum_x (q(x) - p(x))_+\, A_{k-1}(p', q^{-x})`, with :math:`r = \sum\min(p,q)`,
    :math:`p' = \mathrm{norm}((p - q)_+)` and :math:`q^{-x} = q\,1[\cdot \ne x] / (1 - q(x))`, whose last two
    levels are closed in O(V log V) by the ``n = 2`` form
    :math:`A_2 = r + \sum_x (q - p)_+(x)\, G(1/(1 - q(x)))`, :math:`G(c) = \sum_y \min(p'(y), c\,q(y))`,
    evaluated for all ``x`` at once after sorting ``p'/q``. Cost O(V^(n-2) V log V); see
    :data:`RRS_WOR_MAX_PATHS`.
    """

    name, draft = "rrs_wor", "wor"

    def max_exact_vocab(self, n):
        return None if n <= 2 else int(np.floor(RRS_WOR_MAX_PATHS ** (1.0 / (n - 2)) + 1e-9))

    def _acceptance(self, p, q, n):
        limit = self.max_exact_vocab(n)
        if limit is not None and p.shape[-1] > limit:
            raise ValueError(
                f"the exact RRS-wor acceptance for n = {n} needs V <= {limit} (got V = {p.shape[-1]}); "
                "estimate it with .sample instead"
            )
        flat_p, flat_q = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1])
        values = [self._recursion(row_p, row_q, n) for row_p, row_q in zip(flat_p, flat_q, strict=True)]
        return np.array(values).reshape(p.shape[:-1])

    @classmethod
    def _recursion(cls, p, q, k):
        overlap = float(np.sum(np.minimum(p, q)))
        excess = np.maximum(p - q, 0.0)
        if k == 1 or excess.sum() <= 0:
            return overlap
        rejected = np.maximum(q - p, 0.0)
        p_next = excess / excess.sum()
        if k == 2:
            # 1 - q(x) summed from the other tokens: subtracting from 1 cancels when q(x) is near 1
            others = np.maximum(q.sum() - q, np.finfo(float).tiny)
            return overlap + float(rejected @ cls._overlap_with_scaled(p_next, q, 1.0 / others))
        total = overlap
        for x in np.flatnonzero(rejected > 0):
            q_next = q.copy()
            q_next[x] = 0.0
            total += rejected[x] * cls._recursion(p_next, q_next / q_next.sum(), k - 1)
        return total

    @staticmethod
    def _overlap_with_scaled(p, q, scales):
        r""":math:`G(c) = \sum_y \min(p(y), c\, q(y))` for every ``c`` in ``scales`` (sort by ``p/q``)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(q > 0, p / np.where(q > 0, q, 1.0), np.inf)
        order = np.argsort(ratio, kind="stable")
        cumulative_p = np.concatenate([[0.0], np.cumsum(p[order])])
        cumulative_q = np.concatenate([[0.0], np.cumsum(q[order])])
        below = np.searchsorted(ratio[order], scales, side="right")
        return cumulative_p[below] + scales * (cumulative_q[-1] - cumulative_q[below])

    def _conditional(self, p, q, drafts):
        count = drafts.shape[0]
        rows = np.arange(count)
        p_i = np.broadcast_to(p, (count, p.shape[-1])).copy()
        q_i = np.broadcast_to(q, (count, q.shape[-1])).copy()
        result = np.zeros_like(p_i)
        remaining = np.ones(count)
        for i in range(drafts.shape[1]):
            x = drafts[:, i]
            accept = _ratio(p_i[rows, x], q_i[rows, x])
            result[rows, x] += remaining * accept
            remaining = remaining * (1.0 - accept)
            p_i = _normalise(np.maximum(p_i - q_i, 0.0), p_i)
            q_i[rows, x] = 0.0
            q_i = _normalise(q_i, q_i)
        return result + remaining[:, None] * p_i

    def _simulate(self, p, q, drafts, rng):
        p_i, q_i = p, q.copy()
        for x in drafts:
            if _coin(p_i[x] / q_i[x], rng):
                return int(x)
            excess = np.maximum(p_i - q_i, 0.0)
            p_i = excess / excess.sum()  # a rejection implies p_i != q_i, so the excess has mass
            q_i[x] = 0.0
            q_i = q_i / q_i.sum() if q_i.sum() > 0 else q_i
        return _draw(p_i, rng)


class KSequential(Verifier):
    r"""K-SEQ (Sun et al., SpecTr, NeurIPS 2023, arXiv 2310.15141) with the optimal division factor.

    With :math:`\beta(\rho) = \sum \min(p/\rho, q)` and :math:`p_{acc}(\rho) = 1 - (1 - \beta(\rho))^n`,
    accept :math:`x_i` with probability :math:`\min(1, p(x_i)/(\rho q(x_i)))` in turn; if all are rejected,
    output from :math:`\mathrm{norm}((p - \gamma \min(p/\rho, q))_+)` with :math:`\gamma = p_{acc}/\beta`.
    It is lossless iff :math:`p_{acc}(\rho) \le \rho\beta(\rho)`; the optimal :math:`\rho^*` is the root of
    :math:`p_{acc}(\rho) = \rho\beta(\rho)` in :math:`[1, n]` (left side decreasing, right side increasing),
    found by bisection to machine precision, keeping the valid end.

    Acceptance (closed form): :math:`\alpha = 1 - (1 - \beta(\rho^*))^n`, at least
    :math:`(1 - 1/e)\,\alpha^*_{iid}` (SpecTr, Theorem 3).
    """

    name, draft = "kseq", "iid"
    _BISECTION_STEPS = 80  # halves [1, n] below float64 resolution

    def __init__(self):
        self._last_factor: tuple[bytes, float] | None = None  # repeated .sample calls on one pair

    @staticmethod
    def _beta(p, q, rho):
        return np.sum(np.minimum(p / rho[..., None], q), axis=-1)

    def division_factor(self, p, q, n: int):
        r"""The optimal division factor :math:`\rho^*` (batched), smallest valid :math:`\rho \in [1, n]`."""
        p, q = as_distribution_pair(p, q)
        return _scalar_or_array(self._division_factor(p, q, as_count(n, "n")))

    def _division_factor(self, p, q, n):
        def valid(rho):
            beta = self._beta(p, q, rho)
            # 1e-13 absorbs round-off in beta (p = q gives beta = 1 - 1e-16, which must count as valid at rho = 1)
            return 1.0 - (1.0 - beta) ** n <= rho * beta + 1e-13

        low = np.ones(p.shape[:-1])
        high = np.full(p.shape[:-1], float(n))
        done = valid(low)
        high = np.where(done, low, high)
        for _ in range(self._BISECTION_STEPS):
            middle = 0.5 * (low + high)
            ok = valid(middle)
            high = np.where(ok, middle, high)
            low = np.where(ok, low, middle)
        return high

    def _acceptance(self, p, q, n):
        return 1.0 - (1.0 - self._beta(p, q, self._division_factor(p, q, n))) ** n

    def _conditional(self, p, q, drafts):
        rho = float(self._division_factor(p, q, drafts.shape[1]))
        return _kseq_conditional(p, q, drafts, rho)

    def _simulate(self, p, q, drafts, rng):
        key = p.tobytes() + q.tobytes() + drafts.shape[0].to_bytes(4, "little")
        if self._last_factor is None or self._last_factor[0] != key:
            self._last_factor = (key, float(self._division_factor(p, q, drafts.shape[0])))
        rho = self._last_factor[1]
        for x in drafts:
            if _coin(p[x] / (rho * q[x]), rng):
                return int(x)
        return _draw(_kseq_residual(p, q, drafts.shape[0], rho), rng)


def _kseq_residual(p: np.ndarray, q: np.ndarray, n: int, rho: float) -> np.ndarray:
    r"""K-SEQ residual :math:`\mathrm{norm}((p - \gamma\min(p/\rho, q))_+)`, gamma = p_acc / beta."""
    accepted = np.minimum(p / rho, q)
    beta = accepted.sum()
    scale = (1.0 - (1.0 - beta) ** n) / beta if beta > 0 else 0.0
    return _normalise(np.maximum(p - scale * accepted, 0.0), p)


def _kseq_conditional(p: np.ndarray, q: np.ndarray, drafts: np.ndarray, rho: float) -> np.ndarray:
    r"""K-SEQ's :math:`\pi(\cdot \mid \bar x)` at a given division factor (``rho < rho*``: not lossless)."""
    rows = np.arange(drafts.shape[0])
    result = np.zeros((drafts.shape[0], p.shape[-1]))
    remaining = np.ones(drafts.shape[0])
    for i in range(drafts.shape[1]):
        x = drafts[:, i]
        accept = _ratio(p[x] / rho, q[x])
        result[rows, x] += remaining * accept
        remaining = remaining * (1.0 - accept)
    return result + remaining[:, None] * _kseq_residual(p, q, drafts.shape[1], rho)


# ---------------------------------------------------------------------------------------------------------
# Verifiers with their own draft laws


class SpecHub(Verifier):
    r"""SpecHub (Sun, Zhou, Chen, Sun; EMNLP 2024, arXiv 2411.05289), ``n = 2``, with its hub draft law.

    Hub :math:`a = \arg\max q`; the pair is :math:`(i, a)` w.p. :math:`q(i)` or :math:`(a, i)` w.p.
    :math:`Q(i) = q(a) q(i)/(1 - q(a))`. With :math:`p'(i) = (p(i) - q(i))_+`,
    :math:`R_{ia} = \sum_{i \ne a}(q(i) - p(i))_+`, :math:`R_{ai} = \sum_{i \ne a}(Q(i) - p'(i))_+` and
    :math:`p''(a) = (p(a) - R_{ai})_+`:
    for :math:`(i, a)` accept ``i`` w.p. :math:`\min(1, p(i)/q(i))`, else ``a`` w.p.
    :math:`\min(1, p''(a)/R_{ia})`; for :math:`(a, i)` accept ``i`` w.p. :math:`\min(1, p'(i)/Q(i))`,
    else ``a``
    w.p. :math:`\min(1, p(a)/R_{ai})`; otherwise output from the leftover mass :math:`(p' - Q)_+` off the hub
    and :math:`(p''(a) - R_{ia})_+` on it (from the authors' ``MyTree.accept_step``).

    Acceptance (closed form; equals the optimum of its own draft law, Hu et al. ICLR 2025):
    :math:`\alpha = p(a) + \sum_{i \ne a} \min(p(i), q(i)/(1 - q(a)))`.
    """

    name, draft = "spechub", "spechub"

    def _acceptance(self, p, q, n):
        hub = np.argmax(q, axis=-1)[..., None]
        off_hub = q.copy()
        np.put_along_axis(off_hub, hub, 0.0, axis=-1)
        # q(i) / (1 - q(a)) with 1 - q(a) summed from the other tokens (subtraction cancels near one-hot q)
        others = np.minimum(p, off_hub / off_hub.sum(axis=-1, keepdims=True))
        np.put_along_axis(others, hub, 0.0, axis=-1)
        return np.take_along_axis(p, hub, axis=-1)[..., 0] + others.sum(axis=-1)

    @staticmethod
    def _parts(p, q):
        """Hub, second-draft law Q, and the per-case acceptance probabilities and leftover law."""
        hub = int(np.argmax(q))
        off_hub = np.arange(q.shape[-1]) != hub
        second = np.where(off_hub, q[hub] * q / np.sum(q[off_hub]), 0.0)
        excess = np.where(off_hub, np.maximum(p - q, 0.0), 0.0)
        rejected_first = float(np.sum(np.where(off_hub, np.maximum(q - p, 0.0), 0.0)))  # R_ia
        rejected_second = float(np.sum(np.maximum(second - excess, 0.0)))  # R_ai
        hub_left = max(p[hub] - rejected_second, 0.0)  # p''(a)
        leftover = np.where(off_hub, np.maximum(excess - second, 0.0), 0.0)
        leftover[hub] = max(hub_left - rejected_first, 0.0)
        return {
            "hub": hub,
            "accept_first": _ratio(p, q),  # case (i, a), test on i
            "accept_second": _ratio(excess, second),  # case (a, i), test on i
            "hub_after_first": float(_ratio(np.float64(hub_left), np.float64(rejected_first))),
            "hub_after_second": float(_ratio(np.float64(p[hub]), np.float64(rejected_second))),
            "leftover": _normalise(leftover, p),
        }

    def _conditional(self, p, q, drafts):
        parts = self._parts(p, q)
        hub, rows = parts["hub"], np.arange(drafts.shape[0])
        hub_first = drafts[:, 0] == hub
        other = np.where(hub_first, drafts[:, 1], drafts[:, 0])
        accept = np.where(hub_first, parts["accept_second"][other], parts["accept_first"][other])
        accept_hub = np.where(hub_first, parts["hub_after_second"], parts["hub_after_first"])
        result = np.zeros((drafts.shape[0], p.shape[-1]))
        result[rows, other] += accept
        result[:, hub] += (1.0 - accept) * accept_hub
        return result + ((1.0 - accept) * (1.0 - accept_hub))[:, None] * parts["leftover"]

    def _simulate(self, p, q, drafts, rng):
        parts = self._parts(p, q)
        hub = parts["hub"]
        if drafts[0] == hub:
            other, accept, accept_hub = drafts[1], parts["accept_second"], parts["hub_after_second"]
        else:
            other, accept, accept_hub = drafts[0], parts["accept_first"], parts["hub_after_first"]
        if _coin(accept[other], rng):
            return int(other)
        if _coin(accept_hub, rng):
            return hub
        return _draw(parts["leftover"], rng)


class GreedyDraftVerifier(Verifier):
    r"""Hu et al.'s greedy draft law and its verifier (ICLR 2025, arXiv 2502.18779).

    Drafts: the top ``n - 1`` tokens ``T`` of ``q``, then :math:`X \sim q' = q\,1[\cdot \notin T]/(1 - q(T))`.
    Accept ``X`` w.p. :math:`\min(1, p(X)/q'(X))`; otherwise output from
    :math:`\mathrm{norm}(p\,1_T + (p - q')_+ 1_{\Sigma \setminus T})`.

    Acceptance (closed form, attains the optimum of this draft law):
    :math:`\alpha = p(T) + \sum_{x \notin T} \min(p(x), q'(x))`.
    """

    name, draft = "greedy", "greedy"

    @staticmethod
    def _split(p, q, n):
        """Mask of ``T`` (batched), the renormalised last-draft law ``q'`` and the rejection law."""
        order = np.argsort(-q, axis=-1, kind="stable")[..., : n - 1]
        in_top = np.zeros(q.shape, dtype=bool)
        np.put_along_axis(in_top, order, True, axis=-1)
        rest = np.where(in_top, 0.0, q)
        last = rest / rest.sum(axis=-1, keepdims=True)
        leftover = np.where(in_top, p, np.maximum(p - last, 0.0))
        return in_top, last, leftover

    def _acceptance(self, p, q, n):
        in_top, last, _ = self._split(p, q, n)
        return np.sum(np.where(in_top, p, np.minimum(p, last)), axis=-1)

    def _conditional(self, p, q, drafts):
        _, last, leftover = self._split(p, q, drafts.shape[1])
        x = drafts[:, -1]
        accept = _ratio(p[x], last[x])
        result = (1.0 - accept)[:, None] * _normalise(leftover, p)
        result[np.arange(x.shape[0]), x] += accept
        return result

    def _simulate(self, p, q, drafts, rng):
        _, last, leftover = self._split(p, q, drafts.shape[0])
        x = drafts[-1]
        if _coin(p[x] / last[x], rng):
            return int(x)
        return _draw(leftover, rng)


class OptimalTransportVerifier(Verifier):
    r"""The optimal verifier of a draft law: :math:`\pi(y \mid \bar x) = \pi^*(\bar x, y)/P(\bar x)` from an
    optimal coupling of the optimal-transport problem with membership cost (Sun et al., SpecTr, NeurIPS 2023;
    Hu et al., ICLR 2025, arXiv 2502.18779), taken from
    :func:`theory.multidraft.optimal_acceptance_certificate`.

    It attains :math:`\alpha^*(P)` exactly and is lossless by the coupling's target marginal. Small ``V`` only
    (the coupling has one row per draft tuple). Sampling draws the output from the coupling row, which *is*
    this algorithm. The last certificate is cached, since tests and :meth:`sample` ask for the same pair.
    """

    name = "optimal"

    def __init__(self, draft: str = "iid"):
        self.draft = as_choice(draft, "draft", ("iid", "wor", "greedy", "spechub"))
        self._cache: tuple[bytes, object] | None = None

    def _certificate(self, p, q, n):
        from theory.multidraft import optimal_acceptance_certificate

        key = p.tobytes() + q.tobytes() + n.to_bytes(4, "little")
        if self._cache is None or self._cache[0] != key:
            certificate = optimal_acceptance_certificate(p, q, n, draft=self.draft)
            if certificate.coupling is None:
                raise ValueError(f"no optimal coupling is available for V = {p.shape[-1]}, n = {n}")
            rows = {tuple(map(int, row)): index for index, row in enumerate(certificate.drafts)}
            self._cache = (key, (certificate, rows))
        return self._cache[1]

    def _acceptance(self, p, q, n):
        from theory.multidraft import optimal_acceptance

        return optimal_acceptance(p, q, n, draft=self.draft)

    def _conditional(self, p, q, drafts):
        certificate, rows = self._certificate(p, q, drafts.shape[1])
        indices = []
        for row in drafts:
            index = rows.get(tuple(map(int, row)))
            if index is None or certificate.draft_probabilities[index] <= 0:
                raise ValueError(f"drafts {row.tolist()} has probability 0 under draft={self.draft!r}")
            indices.append(index)
        indices = np.array(indices)
        coupling = np.maximum(np.asarray(certificate.coupling)[indices], 0.0)
        return coupling / coupling.sum(axis=-1, keepdims=True)

    def _simulate(self, p, q, drafts, rng):
        return _draw(self._conditional(p, q, drafts[None, :])[0], rng)


_CLASSES = {
    cls.name: cls
    for cls in (
        NaiveSpeculativeSampling,
        NaiveTree,
        RecursiveRejectionSampling,
        RecursiveRejectionSamplingWithoutReplacement,
        KSequential,
        SpecHub,
        GreedyDraftVerifier,
        OptimalTransportVerifier,
    )
}


def verifier(name: str, **options) -> Verifier:
    """The verification algorithm called ``name``, with its draft law.

    Parameters
    ----------
    name : str
        ``"nss"``, ``"naive"``, ``"rrs"`` (SpecInfer, i.i.d. drafts), ``"rrs_wor"`` (without replacement, draw
        order), ``"kseq"`` (SpecTr K-SEQ at the optimal division factor), ``"spechub"`` (``n = 2``),
        ``"greedy"`` (Hu et al.'s greedy draft law) or ``"optimal"`` (the optimal-transport verifier).
    **options
        Only ``"optimal"`` takes one: ``draft`` (``"iid"`` by default, or ``"wor"``, ``"greedy"``,
        ``"spechub"``).

    Examples
    --------
    >>> import numpy as np
    >>> from theory import verifier
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    >>> round(float(verifier("rrs").acceptance(p, q, 2)), 6)
    0.76
    """
    name = as_choice(name, "name", VERIFIERS)
    if options and name != "optimal":
        raise ValueError(f"verifier {name!r} takes no options, got {sorted(options)}")
    if set(options) - {"draft"}:
        raise ValueError(f"verifier 'optimal' only takes the option 'draft', got {sorted(options)}")
    return _CLASSES[name](**options)
