"""Verifiers with their own draft laws: RRS without replacement, SpecHub and the greedy draft law's."""

from __future__ import annotations

import numpy as np

from theory._buckets import head_sums, tail_sums
from theory.verifiers.base import Verifier, _coin, _draw, _normalise, _ratio

#: RRS without replacement for ``n >= 3`` recurses over ``V ** (n - 2)`` rejected-token paths, each closed in
#: O(V log V); beyond this many paths the exact method is refused rather than left to run for minutes.
RRS_WOR_MAX_PATHS = 5000


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

    name = "rrs_wor"

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
            # Only drafts with q > p are ever rejected. 1 - q(x) is the sum of the tokens before x and after it:
            # 1 - q(x) and q.sum() - q(x) both cancel when q(x) is near 1 (5e-11 relative at q(x) = 1 - 2e-6).
            drafted = np.flatnonzero(rejected > 0)
            others = np.maximum(head_sums(q)[drafted] + tail_sums(q)[drafted + 1], np.finfo(float).tiny)
            return overlap + float(rejected[drafted] @ cls._overlap_with_scaled(p_next, q, 1.0 / others))
        total = overlap
        for x in np.flatnonzero(rejected > 0):
            q_next = q.copy()
            q_next[x] = 0.0
            total += rejected[x] * cls._recursion(p_next, q_next / q_next.sum(), k - 1)
        return total

    @staticmethod
    def _overlap_with_scaled(p, q, scales):
        r""":math:`G(c) = \sum_y \min(p(y), c\, q(y))` for every ``c > 0`` in ``scales``: sorted by ``p/q`` over the
        tokens with ``p > 0`` and ``q > 0`` only, the others adding 0 to every term. On logged SmolLM2 pairs
        (V = 49,152, the feature head's reduced vocabulary, T = 1) that is a median 1,726 tokens, and the
        evaluation took 1.3 ms instead of 8.4 sorting the whole vocabulary."""
        support = np.flatnonzero((p > 0) & (q > 0))
        ratio = p[support] / q[support]
        order = np.argsort(ratio)
        tokens = support[order]  # the support in ratio order
        below = np.searchsorted(ratio[order], scales, side="right")
        return head_sums(p[tokens])[below] + scales * tail_sums(q[tokens])[below]

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

    name = "spechub"

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

    name = "greedy"

    @staticmethod
    def _split(p, q, n):
        """Mask of ``T`` (batched), the renormalised law ``q'`` of the last draft (``rest``) and the leftover law."""
        order = np.argsort(-q, axis=-1, kind="stable")[..., : n - 1]
        in_top = np.zeros(q.shape, dtype=bool)
        np.put_along_axis(in_top, order, True, axis=-1)
        rest = np.where(in_top, 0.0, q)
        rest = rest / rest.sum(axis=-1, keepdims=True)
        leftover = np.where(in_top, p, np.maximum(p - rest, 0.0))
        return in_top, rest, leftover

    def _acceptance(self, p, q, n):
        in_top, rest, _ = self._split(p, q, n)
        return np.sum(np.where(in_top, p, np.minimum(p, rest)), axis=-1)

    def _conditional(self, p, q, drafts):
        _, rest, leftover = self._split(p, q, drafts.shape[1])
        x = drafts[:, -1]
        accept = _ratio(p[x], rest[x])
        result = (1.0 - accept)[:, None] * _normalise(leftover, p)
        result[np.arange(x.shape[0]), x] += accept
        return result

    def _simulate(self, p, q, drafts, rng):
        _, rest, leftover = self._split(p, q, drafts.shape[0])
        x = drafts[-1]
        if _coin(p[x] / rest[x], rng):
            return int(x)
        return _draw(leftover, rng)
