"""Verifiers for i.i.d. drafts: NSS, the naive tree rule, RRS (SpecInfer) and K-SEQ (SpecTr)."""

from __future__ import annotations

import numpy as np

from theory.checks import as_count, as_distribution_pair
from theory.verifiers.base import Verifier, _coin, _draw, _normalise, _ratio, _scalar_or_array

# ---------------------------------------------------------------------------------------------------------
# Baselines with i.i.d. drafts


class NaiveSpeculativeSampling(Verifier):
    r"""NSS: sample ``y ~ p`` and ignore the drafts (SpecInfer's naive sampling; Miao et al., ASPLOS 2024,
    arXiv 2305.09781). Lossless trivially.

    Acceptance (closed form, Thomas et al. 2025 App. B): :math:`\alpha = \sum_y p(y)\,(1 - (1 - q(y))^n)`.
    """

    name = "nss"

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

    name = "naive"

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

    name = "rrs"

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


#: Halvings of [1, n] whose resolution K-SEQ's rho* is found to (below float64's), and the buckets of the ratio
#: p/q on [1, n] that place it before the last of them; the executor's twin and the truncated-log bounds use
#: the same.
KSEQ_BISECTION_STEPS = 80
KSEQ_BUCKETS = 1024
#: Vocabularies up to this size skip the buckets: plain bisection over every token, all rows at once, costs
#: 5-33 us a row in a batch against the buckets' ~230 us (their last halvings run row by row).
KSEQ_PLAIN_BISECTION_VOCAB = 128


def _bisected_division_factor(p, q, n, valid):
    """K-SEQ's :math:`\\rho^*` per row by :data:`KSEQ_BISECTION_STEPS` plain halvings of ``[1, n]`` on every
    token, keeping the valid end, for rows where ``rho = 1`` is not valid."""
    low, high = np.ones(p.shape[0]), np.full(p.shape[0], float(n))
    for _ in range(KSEQ_BISECTION_STEPS):
        middle = 0.5 * (low + high)
        good = valid(middle, np.minimum(p / middle[:, None], q).sum(axis=-1))
        low, high = np.where(good, low, middle), np.where(good, middle, high)
    return high


class KSequential(Verifier):
    r"""K-SEQ (Sun et al., SpecTr, NeurIPS 2023, arXiv 2310.15141) with the optimal division factor.

    With :math:`\beta(\rho) = \sum \min(p/\rho, q)` and :math:`p_{acc}(\rho) = 1 - (1 - \beta(\rho))^n`,
    accept :math:`x_i` with probability :math:`\min(1, p(x_i)/(\rho q(x_i)))` in turn; if all are rejected,
    output from :math:`\mathrm{norm}((p - \gamma \min(p/\rho, q))_+)` with :math:`\gamma = p_{acc}/\beta`.
    It is lossless iff :math:`p_{acc}(\rho) \le \rho\beta(\rho)`; the optimal :math:`\rho^*` is the root of
    :math:`p_{acc}(\rho) = \rho\beta(\rho)` in :math:`[1, n]` (left side decreasing, right side increasing),
    found to machine precision, keeping the valid end (:meth:`_division_factor`).

    Acceptance (closed form): :math:`\alpha = 1 - (1 - \beta(\rho^*))^n`, at least
    :math:`(1 - 1/e)\,\alpha^*_{iid}` (SpecTr, Theorem 3).
    """

    name = "kseq"

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
        """Smallest valid factor per row, to the resolution of :data:`KSEQ_BISECTION_STEPS` halvings of ``[1, n]``.

        :math:`\\beta(\\rho) = \\rho^{-1} \\sum_{p/q \\le \\rho} p + \\sum_{p/q > \\rho} q`: one pass bins the
        ratios into :data:`KSEQ_BUCKETS` equal buckets of ``[1, n]``, cumulative sums give :math:`\\beta` at
        every edge, the first valid edge brackets :math:`\\rho^*`, and the remaining halvings run on the
        tokens of that bucket, ``2**10`` points a round (80 passes over V = 49,152 took 5-17 ms a row, this
        1.0-1.5 ms). Up to :data:`KSEQ_PLAIN_BISECTION_VOCAB` tokens, plain bisection is cheaper, batched.
        """

        def valid(rho, beta):
            # 1e-13 absorbs round-off in beta (p = q gives beta = 1 - 1e-16, which must count as valid at rho = 1)
            return 1.0 - (1.0 - beta) ** n <= rho * beta + 1e-13

        shape, vocab = p.shape[:-1], p.shape[-1]
        p, q = p.reshape(-1, vocab), q.reshape(-1, vocab)
        rho = np.ones(p.shape[0])
        at_one = valid(rho, np.minimum(p, q).sum(axis=-1))
        if n == 1 or at_one.all():  # one draft: rho* = 1 (beta <= beta)
            return rho.reshape(shape)
        if vocab <= KSEQ_PLAIN_BISECTION_VOCAB:
            rho[~at_one] = _bisected_division_factor(p[~at_one], q[~at_one], n, valid)
            return rho.reshape(shape)
        width = (n - 1.0) / KSEQ_BUCKETS
        edges = 1.0 + width * np.arange(KSEQ_BUCKETS + 1)
        edges[-1] = float(n)
        # Bucket b >= 1 holds the ratios in (edges[b-1], edges[b]] (up to a rounding at an edge, where p/rho and
        # q agree to an ulp); 0 those <= 1, KSEQ_BUCKETS + 1 those > n. p = 0 tokens add 0 either side (0/0 is
        # put at ratio 0), q = 0 < p ones are on the q side (p/0 = inf) and add 0 too.
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ratio = np.nan_to_num(p / q, nan=0.0, posinf=np.inf)
            bucket = np.clip(np.ceil((ratio - 1.0) / width), 0, KSEQ_BUCKETS + 1).astype(np.int64)
        size = KSEQ_BUCKETS + 2
        flat = (bucket + size * np.arange(p.shape[0])[:, None]).ravel()
        bucket_p = np.bincount(flat, weights=p.ravel(), minlength=size * p.shape[0]).reshape(-1, size)
        bucket_q = np.bincount(flat, weights=q.ravel(), minlength=size * p.shape[0]).reshape(-1, size)
        lower_p = np.cumsum(bucket_p, axis=-1)[:, :-1]  # p with ratio <= edges[j], j = 0 .. KSEQ_BUCKETS
        upper_q = np.cumsum(bucket_q[:, ::-1], axis=-1)[:, ::-1][:, 1:]  # q with ratio > edges[j], as a sum
        ok = valid(edges, lower_p / edges + upper_q)
        ok[:, -1] = True  # n is always valid: 1 - (1 - beta)^n <= n beta
        first = np.maximum(np.argmax(ok, axis=-1), 1)
        for row in np.flatnonzero(~at_one):
            j = int(first[row])
            inside = bucket[row] == j
            low, high = edges[j - 1], edges[j]
            inner_p, inner_q = p[row, inside], q[row, inside]
            remaining = KSEQ_BISECTION_STEPS - int(np.log2(KSEQ_BUCKETS))
            while remaining > 0:
                bits = min(10, remaining)
                remaining -= bits
                points = low + (high - low) * (np.arange(1, 2**bits + 1) / 2**bits)
                points[-1] = high
                beta = lower_p[row, j - 1] / points + upper_q[row, j]
                beta = beta + np.minimum(inner_p[None, :] / points[:, None], inner_q).sum(axis=-1)
                good = valid(points, beta)
                if not good.any():  # high was valid by the bucket sums and fails here by round-off: keep it
                    break
                index = int(np.argmax(good))
                low, high = (points[index - 1] if index > 0 else low), points[index]
            rho[row] = high
        return rho.reshape(shape)

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
    accepted = np.minimum(p / rho, q)  # min(p/rho, q): the law of an accepted draft, up to beta
    beta = accepted.sum()
    gamma = (1.0 - (1.0 - beta) ** n) / beta if beta > 0 else 0.0  # SpecTr's gamma = p_acc / beta
    return _normalise(np.maximum(p - gamma * accepted, 0.0), p)


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
