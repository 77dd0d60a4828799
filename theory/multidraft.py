r"""Optimal multi-draft acceptance: the largest probability that a lossless verifier outputs one of the drafts.

For a target distribution ``p`` and a draft law ``P`` on ordered ``n``-tuples :math:`\bar x`, the optimal
acceptance rate is the optimal-transport problem with membership cost (Sun et al., "SpecTr: Fast Speculative
Decoding via Optimal Transport", NeurIPS 2023, arXiv:2310.15141; Hu et al., "Towards Optimal Multi-draft
Speculative Decoding", ICLR 2025, arXiv:2502.18779):

.. math:: \alpha^* = \max_{\pi \in \Pi(P, p)} \sum_{\bar x, y} \pi(\bar x, y)\, 1[y \in \bar x].

Its dual is totally unimodular, which turns it into a subset selection (a min cut):

.. math:: \alpha^* = 1 + \min_{H \subseteq \Sigma} \left[ p(H) - Q(H) \right], \qquad
          Q(H) = P(x_1, \dots, x_n \in H).

For draws with replacement (``"iid"``, :math:`Q(H) = q(H)^n`) and without replacement (``"wor"``) an optimal
``H`` is a prefix of the tokens sorted by ascending :math:`p/q` (Hu et al. 2025, the "q-convex" sorting
theorem), so :math:`\alpha^*` costs one sort. The greedy and SpecHub laws have closed forms. Everything else is
solved exactly by an oracle: the primal LP, POT's network simplex, a cvxpy LP, a max flow, or enumeration of
every subset.

The maths, with proofs and usage examples, is in ``docs/multidraft.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from theory._wor import SMALLEST_COMPLEMENT, wor_prefix_inclusion_two, wor_prefix_minimiser
from theory.checks import as_choice, as_count, as_distribution, as_distribution_pair
from theory.draft_laws import DRAFT_LAWS, enumerate_drafts, top_tokens
from theory.verifier_table import check_draft_count

__all__ = [
    "AcceptanceCertificate",
    "METHODS",
    "acceptance_rate",
    "optimal_acceptance",
    "optimal_acceptance_certificate",
]

#: Solution methods of :func:`optimal_acceptance`.
METHODS = ("auto", "sorted", "lp", "pot", "cvxpy", "maxflow", "enumerate")
#: Largest vocabulary for ``method="enumerate"`` (it visits all ``2**V`` token sets).
MAX_ENUMERATE_VOCAB = 20
#: Largest number of draft tuples for which the certificate carries the law and a coupling.
MAX_CERTIFICATE_DRAFTS = 5000
#: Entries per block of rows in the sort-based method (about 0.5 MB per work array, so they stay in cache).
SORTED_BLOCK_ELEMENTS = 1 << 16


def acceptance_rate(p, q) -> float | np.ndarray:
    r"""Single-draft acceptance :math:`\beta(p, q) = \sum_y \min(p(y), q(y)) = 1 - \mathrm{TV}(p, q)`.

    The acceptance of speculative sampling with one draft (Leviathan, Kalman, Matias, ICML 2023,
    arXiv:2211.17192; Chen et al. 2023, arXiv:2302.01318), and the optimum :math:`\alpha^*` for ``n = 1``.

    Parameters
    ----------
    p, q : array_like (..., V)
        Target and draft distributions; leading axes are broadcast.

    Returns
    -------
    float for one pair, else an array of the broadcast batch shape.
    """
    p, q = as_distribution_pair(p, q)
    return _scalar_or_array(np.minimum(p, q).sum(axis=-1))


@dataclass(frozen=True)
class AcceptanceCertificate:
    r"""An optimal acceptance with the evidence that makes it checkable.

    Attributes
    ----------
    value : float
        :math:`\alpha^*`.
    token_set : ndarray of int
        A minimising set ``H`` (sorted token ids): :math:`\alpha^* = 1 + p(H) - Q(H)`. Any coupling accepts
        at most this much (weak duality), so ``value`` is an upper bound that ``coupling`` attains.
    drafts : ndarray (M, n) of int or None
        The draft tuples with positive probability (:func:`theory.draft_laws.enumerate_drafts`), or None when
        there are more than :data:`MAX_CERTIFICATE_DRAFTS`.
    draft_probabilities : ndarray (M,) or None
        :math:`P(\bar x)` of each tuple.
    coupling : ndarray (M, V) or None
        An optimal transport plan :math:`\pi(\bar x, y) \ge 0` with row sums ``draft_probabilities``, column
        sums ``p`` and :math:`\sum \pi\, 1[y \in \bar x] = \alpha^*`. The optimal verifier outputs ``y`` with
        probability :math:`\pi(\bar x, y) / P(\bar x)` given the drafts :math:`\bar x`.
    """

    value: float
    token_set: np.ndarray
    drafts: np.ndarray | None = None
    draft_probabilities: np.ndarray | None = None
    coupling: np.ndarray | None = None


def optimal_acceptance(p, q, n, *, draft: str = "iid", method: str = "auto") -> float | np.ndarray:
    r"""Optimal acceptance rate :math:`\alpha^*` of ``n`` drafts from ``q`` under a draft law, target ``p``.

    .. math:: \alpha^* = 1 + \min_{H \subseteq \Sigma} [p(H) - Q(H)], \qquad Q(H) = P(\text{all drafts} \in H)

    (Hu et al., ICLR 2025, arXiv:2502.18779; the with-replacement case is SpecTr's bound, Sun et al.,
    NeurIPS 2023, arXiv:2310.15141, and for ``n = 2`` Khisti et al., ICLR 2025, arXiv:2410.18234).

    Parameters
    ----------
    p : array_like (..., V)
        Target distributions.
    q : array_like (..., V), or (..., n, V) for ``draft="independent"``
        Draft distributions (one per draft for ``"independent"``). Leading axes of ``p`` and ``q`` broadcast.
    n : int
        Drafts per step, ``>= 1``.
    draft : {"iid", "wor", "greedy", "spechub", "independent"}
        The draft sampling law (see :mod:`theory.draft_laws`).
    method : {"auto", "sorted", "lp", "pot", "cvxpy", "maxflow", "enumerate"}
        ``"sorted"``: for ``"iid"``/``"wor"`` the ratio-prefix form
        :math:`\alpha^* = 1 + \min_k [P_k - Q(H_k)]`, :math:`H_k` the ``k`` tokens of smallest :math:`p/q`,
        vectorised over the batch; :math:`Q(H) = q(H)^n` for ``"iid"``; for ``"wor"`` the exact
        :math:`Q_2(H) = x - s \sum_{i \in H} q_i/(1 - q_i)` (``n = 2``) and the exponential-clock quadrature
        of :func:`theory._wor.wor_prefix_inclusion` (``n >= 3``, error < 1e-12), evaluated on only as many
        prefixes as a branch and bound needs (:func:`theory._wor.wor_prefix_minimiser`). For ``"greedy"`` and
        ``"spechub"`` the closed form :math:`p(T) + \sum_{x \notin T} \min(p(x), q(x)/(1 - q(T)))`, ``T`` the
        top ``n - 1`` tokens of ``q``. Not available for ``"independent"`` (the ratio order is not always
        optimal there).
        ``"lp"``: the primal OT linear programme with scipy's HiGHS. ``"pot"``: ``1 - ot.emd2`` with the
        membership cost :math:`1[y \notin \bar x]`. ``"cvxpy"``: the dual LP
        :math:`\min P \cdot u + p \cdot v` s.t. :math:`u_{\bar x} + v_y \ge 1[y \in \bar x]`. ``"maxflow"``:
        networkx max flow source -> tuple (capacity :math:`P(\bar x)`) -> its tokens -> sink (capacity
        ``p``). ``"enumerate"``: all :math:`2^V` subsets (``V <= 20``). The oracles enumerate the draft law
        and loop over batch rows. ``"auto"``: ``"sorted"``, or for ``"independent"`` ``"enumerate"``
        (``V <= 20``) and else ``"lp"``.

    Returns
    -------
    float for a single pair, else an array of the batch shape.

    Raises
    ------
    ValueError
        For invalid distributions, ``n < 1``, an unknown ``draft`` or ``method``, a method that does not apply
        to the law, ``"spechub"`` with ``n != 2``, or ``"wor"``/``"greedy"``/``"spechub"`` with fewer than
        ``n`` tokens of positive ``q`` in some row.

    Examples
    --------
    >>> optimal_acceptance([0.5, 0.5, 0.0], [1/3, 1/3, 1/3], 2)   # 1 + min_H [p(H) - q(H)^2]
    0.8888888888888888
    """
    method = as_choice(method, "method", METHODS)
    p, q, n, draft, batch_shape = _prepare(p, q, n, draft)
    if method == "auto":
        method = _auto_method(draft, p.shape[-1])
    if method == "sorted":
        if draft == "independent":
            raise ValueError(
                "method='sorted' does not apply to draft='independent' (the ratio order is not always "
                "optimal for different draft distributions); use 'enumerate', 'lp', 'pot', 'cvxpy' or 'maxflow'"
            )
        values = (
            _closed_form(p, q, n, draft)[0] if draft in ("greedy", "spechub") else _sorted(p, q, n, draft)
        )
    else:
        if method == "enumerate" and p.shape[-1] > MAX_ENUMERATE_VOCAB:
            raise ValueError(
                f"method='enumerate' visits all 2**V token sets and supports V <= {MAX_ENUMERATE_VOCAB}; "
                f"got V = {p.shape[-1]}"
            )
        solve = _ORACLES[method]
        values = np.array(
            [solve(*enumerate_drafts(q_row, n, draft), p_row) for p_row, q_row in zip(p, q, strict=True)]
        )
    return _scalar_or_array(values.reshape(batch_shape))


def optimal_acceptance_certificate(p, q, n, *, draft: str = "iid") -> AcceptanceCertificate:
    r"""Optimal acceptance of one pair with a minimising token set and, for small laws, an optimal coupling.

    ``value`` and ``token_set`` come from the fastest exact method (ratio prefix, closed form, or for
    ``"independent"`` enumeration / min cut). When the law has at most :data:`MAX_CERTIFICATE_DRAFTS` tuples,
    the coupling is built from a maximum bipartite flow of accepted mass :math:`a(\bar x, y)`, ``y`` in
    :math:`\bar x` (HiGHS), made exactly feasible (negatives clipped, rows and columns scaled under their
    marginals), and completed with the product of the leftover marginals:
    :math:`\pi = a + r c^\top / \sum c`, ``r = P - a 1``, ``c = p - a^\top 1``. Its marginals then hold to
    round-off (~1e-16) and it accepts :math:`\alpha^*`.

    Parameters
    ----------
    p : array_like (V,)
    q : array_like (V,), or (n, V) for ``draft="independent"``
    n : int
    draft : str, as in :func:`optimal_acceptance`.

    Returns
    -------
    AcceptanceCertificate

    Raises
    ------
    ValueError
        For the inputs :func:`optimal_acceptance` rejects, and for a batch of pairs.
    """
    p, q, n, draft, batch_shape = _prepare(p, q, n, draft)
    if batch_shape != ():
        raise ValueError(f"p and q must be a single pair for a certificate; got batch shape {batch_shape}")
    p, q = p[0], q[0]
    vocab = p.shape[-1]
    if draft == "independent":
        tuples, probabilities = enumerate_drafts(q, n, draft)
        if vocab <= MAX_ENUMERATE_VOCAB:
            value, token_set = _enumerate_subsets(tuples, probabilities, p, with_set=True)
        else:
            value, token_set = _maxflow(tuples, probabilities, p, with_set=True)
    else:
        if draft in ("greedy", "spechub"):
            values, in_set = _closed_form(p[None], q[None], n, draft)
            token_set = np.flatnonzero(in_set[0])
        else:
            values, (token_set,) = _sorted(p[None], q[None], n, draft, with_sets=True)
        value = float(values[0])
        tuples = probabilities = None
        if _law_size(q, n, draft) <= MAX_CERTIFICATE_DRAFTS:
            tuples, probabilities = enumerate_drafts(q, n, draft)
    if tuples is None or len(tuples) > MAX_CERTIFICATE_DRAFTS:
        return AcceptanceCertificate(value=float(value), token_set=np.asarray(token_set, dtype=np.int64))
    coupling = _optimal_coupling(tuples, probabilities, p)
    return AcceptanceCertificate(
        value=float(value),
        token_set=np.asarray(token_set, dtype=np.int64),
        drafts=tuples,
        draft_probabilities=probabilities,
        coupling=coupling,
    )


# ----------------------------------------------------------------------------------------------------------
# Input handling


def _prepare(p, q, n, draft):
    """Validate; return float64 ``p (B, V)``, ``q (B, V)`` or ``(B, n, V)``, ``n``, ``draft``, batch shape.

    Rows are renormalised to sum to exactly 1 (they are within the validation tolerance already) so that
    every method solves the same problem.
    """
    draft = as_choice(draft, "draft", DRAFT_LAWS)
    n = as_count(n, "n")
    if draft == "independent":
        p = as_distribution(p, "p")
        q = as_distribution(q, "q")
        if q.ndim < 2 or q.shape[-2] != n:
            raise ValueError(
                f"q must have shape (..., n, V) = (..., {n}, V) for draft='independent', got {q.shape}"
            )
        if p.shape[-1] != q.shape[-1]:
            raise ValueError(
                f"p and q must share the vocabulary axis: p has {p.shape[-1]} tokens, q has {q.shape[-1]}"
            )
        try:
            batch_shape = np.broadcast_shapes(p.shape[:-1], q.shape[:-2])
        except ValueError:
            raise ValueError(
                f"p and q have batch shapes that do not broadcast: {p.shape[:-1]} and {q.shape[:-2]}"
            ) from None
        p = np.broadcast_to(p, (*batch_shape, p.shape[-1])).reshape(-1, p.shape[-1])
        q = np.broadcast_to(q, (*batch_shape, *q.shape[-2:])).reshape(-1, n, q.shape[-1])
    else:
        p, q = as_distribution_pair(p, q)
        batch_shape = p.shape[:-1]
        p = p.reshape(-1, p.shape[-1])
        q = q.reshape(-1, q.shape[-1])
        if p.shape[0] > 0:
            # The row with the smallest support decides whether the law can draw n distinct tokens.
            check_draft_count(draft, n, int(np.count_nonzero(q, axis=-1).min()), "a row of q")
    p = p / p.sum(axis=-1, keepdims=True)
    q = q / q.sum(axis=-1, keepdims=True)
    return p, q, n, draft, batch_shape


def _auto_method(draft: str, vocab: int) -> str:
    if draft != "independent":
        return "sorted"
    return "enumerate" if vocab <= MAX_ENUMERATE_VOCAB else "lp"


def _scalar_or_array(values: np.ndarray) -> float | np.ndarray:
    return float(values) if values.ndim == 0 else values


# ----------------------------------------------------------------------------------------------------------
# Sort-based methods (in cache-sized blocks of rows) and closed forms (vectorised over the batch)


def _sorted(p: np.ndarray, q: np.ndarray, n: int, draft: str, with_sets: bool = False):
    r"""Ratio-prefix form :math:`\alpha^* = 1 + \min_{k=0..V} [P_k - Q(H_k)]` for ``"iid"`` and ``"wor"``.

    ``H_k`` is the ``k`` tokens of smallest :math:`p/q` (``p = 0 < q`` first, ``q = 0`` last).

    Blocks of about :data:`SORTED_BLOCK_ELEMENTS` entries (one row at LM vocabulary sizes): every pass after
    the sort (gathers, cumulative sums, the power and the minimum) then reads arrays that are still in cache,
    about twice as fast as the same passes over a whole (256, 49152) batch
    (``docs/benchmarks/optimal_acceptance.md``), while small vocabularies keep batched passes.

    Returns the values (B,) and, if ``with_sets``, a list with the minimising prefix (token ids) of each row.
    """
    rows, vocab = p.shape
    values = np.empty(rows)
    token_sets = []
    block = max(1, SORTED_BLOCK_ELEMENTS // vocab)
    offsets = (np.arange(min(block, rows)) * vocab)[:, None]
    for start in range(0, rows, block):
        p_block, q_block = p[start : start + block], q[start : start + block]
        order = _ratio_order(p_block, q_block)
        flat = order + offsets[: len(order)]  # gathers through flat indices: take_along_axis is slower
        p_sorted, q_sorted = p_block.ravel()[flat], q_block.ravel()[flat]
        target_mass = np.zeros((len(order), vocab + 1))
        np.cumsum(p_sorted, axis=-1, out=target_mass[:, 1:])
        if draft == "iid" or n == 1:
            draft_mass = np.zeros_like(target_mass)
            np.cumsum(q_sorted, axis=-1, out=draft_mass[:, 1:])
            gap = np.subtract(target_mass, np.power(draft_mass, n, out=draft_mass), out=draft_mass)
            size = np.argmin(gap, axis=-1)
        else:
            gap = target_mass - _wor_inclusion(target_mass, q_sorted, n)
            size = np.nanargmin(gap, axis=-1)
        values[start : start + block] = np.take_along_axis(gap, size[:, None], axis=-1)[:, 0]
        if with_sets:
            token_sets.extend(np.sort(row[:k]) for row, k in zip(order, size, strict=True))
    values = np.clip(1.0 + values, 0.0, 1.0)
    return (values, token_sets) if with_sets else values


def _ratio_order(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Tokens by ascending ``p/q`` per row: ``p = 0 < q`` first (ratio 0), ``q = 0`` last (ratio +inf).

    ``0/0`` is mapped to +inf rather than left NaN: numpy's argsort is about five times slower on arrays
    that hold NaNs. The order among ``q = 0`` tokens does not matter (they add to ``p(H)`` and not to
    ``Q(H)``), nor does the order within exact ties (the gap is concave along a tie).
    """
    # p/q of a subnormal q overflows to inf, which is where such a token belongs.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = np.divide(p, q)
    np.fmin(ratio, np.inf, out=ratio)  # NaN (0/0) -> inf
    return np.argsort(ratio, axis=-1)


#: Bounds on :math:`Q_n(H)` that differ by at most this are taken as its value where the quadrature cannot go.
BOUNDS_AGREE = 1e-13


def _wor_inclusion(target_mass: np.ndarray, q_sorted: np.ndarray, n: int, dust=None) -> np.ndarray:
    r""":math:`Q_n(H_k)` of successive sampling on the prefixes (B, V + 1) that decide the minimum, else NaN.

    ``n = 2``: the exact :math:`O(V)` formula on every prefix. ``n >= 3``: bounds from the exact :math:`Q_2`
    discard prefixes that cannot be minimisers, and :func:`theory._wor.wor_prefix_minimiser` evaluates the
    quadrature on as few of the others as it needs (rows without such a candidate cost no Python step). Given the first ``j`` draws in ``H`` with
    drawn mass ``D``, the next draw stays in ``H`` with probability :math:`(x - D)/(1 - D) = 1 - s/(s + x - D)`,
    decreasing in ``D``; ``D`` is at most :math:`\min(j\,m, T_j, x)` with ``m`` the largest ``q`` in ``H`` and
    :math:`T_j` the sum of the ``j`` largest ``q`` of the row. So
    :math:`Q_2 \prod_{j=2}^{n-1} (1 - s/(s + x - \min(jm, T_j, x))) \le Q_n \le Q_2\, x^{n-2}`. A prefix
    whose lower bound on :math:`P_k - Q_n` exceeds the smallest upper bound cannot be the minimiser. ``dust``:
    (B,) Poisson dust rates inside every prefix (:func:`theory._wor.wor_prefix_inclusion`; ``m``, ``T_j`` stay
    the tokens' since a dust point draws no mass: both bounds are the ``M -> oo`` limits of ``r/M`` tokens').
    """
    suffix = np.zeros_like(target_mass)
    suffix[:, :-1] = np.cumsum(q_sorted[:, ::-1], axis=-1)[:, ::-1]
    inclusion_two = wor_prefix_inclusion_two(q_sorted, suffix, dust)
    if n == 2:
        return inclusion_two
    mass = 1.0 - suffix
    largest = np.zeros_like(mass)
    np.maximum.accumulate(q_sorted, axis=-1, out=largest[:, 1:])
    top_sums = np.cumsum(-np.sort(-q_sorted, axis=-1)[:, : n - 1], axis=-1)  # T_j, j = 1..n-1
    upper = inclusion_two * mass ** (n - 2)
    lower = inclusion_two.copy()
    for drawn in range(2, n):
        drawn_mass = np.minimum(np.minimum(drawn * largest, top_sums[:, drawn - 1 : drawn]), mass)
        room = mass - drawn_mass
        with np.errstate(invalid="ignore", divide="ignore"):
            lower *= np.where(room > 0, 1.0 - suffix / (suffix + room), 0.0)
    if dust is None:
        # Fewer than n tokens (every token of q > 0 comes before every q = 0 one; dust would supply more):
        # Q is exactly 0. Set here rather than trusting the bounds, which can round to the other end: with
        # q = (1e-18, a, b, c) and n = 4 the prefix {a, b, c} has x = 1 - 1e-18 = 1.0 and T_3 = a + b + c an
        # ulp below 1, so its "room" after three draws was 1.1e-16 and its bounds [0.991, 1]; their best
        # upper bound then ruled out the true minimiser, the whole support (alpha* 0.997 reported as 1).
        upper[:, :n] = 0.0
        lower[:, :n] = 0.0
    best_upper = (target_mass - lower).min(axis=-1, keepdims=True)
    candidates = target_mass - upper <= best_upper + 1e-10  # slack for round-off in the bounds
    # The quadrature's grid cannot reach 1/s for a complement below SMALLEST_COMPLEMENT (it would lose up to
    # all of Q there): such prefixes take the bounds when they agree, and are refused when they do not.
    beyond = candidates & (suffix > 0) & (suffix < SMALLEST_COMPLEMENT)
    if dust is None:
        beyond[:, :n] = False  # fewer than n tokens: Q is 0, filled by the minimiser
    loose = beyond & (upper - lower > BOUNDS_AGREE)
    if loose.any():
        row, prefix = np.argwhere(loose)[0]
        raise ValueError(
            f"draft='wor' with n = {n}: after the {prefix} tokens of lowest p/q in row {row} the draft mass "
            f"left is {suffix[row, prefix]:.3g}, below the {SMALLEST_COMPLEMENT:g} the quadrature resolves, "
            f"and the bounds on its inclusion disagree ([{lower[row, prefix]:.6g}, {upper[row, prefix]:.6g}]); "
            "q is too peaked in float64 for draft='wor' at this n (n = 2 is exact at any mass)"
        )
    inclusion = wor_prefix_minimiser(target_mass, q_sorted, suffix, n, candidates & ~beyond, upper, dust)
    inclusion[beyond] = upper[beyond]
    return inclusion


def _top_tokens_batched(q: np.ndarray, count: int) -> np.ndarray:
    """Per row, the ``count`` largest entries of ``q``, as :func:`theory.draft_laws.top_tokens` orders them.

    Successive ``argmax`` (first index on ties) is the same stable order at ``O(count * V)`` instead of a sort.
    """
    if q.shape[0] == 1:
        return top_tokens(q[0], count)[None]
    remaining = q.copy()
    chosen = np.empty((q.shape[0], count), dtype=np.int64)
    rows = np.arange(q.shape[0])
    for rank in range(count):
        chosen[:, rank] = np.argmax(remaining, axis=-1)
        remaining[rows, chosen[:, rank]] = -1.0
    return chosen


def _closed_form(p: np.ndarray, q: np.ndarray, n: int, draft: str):
    r"""Greedy (and SpecHub, its ``n = 2`` case) optimum :math:`p(T) + \sum_{x \notin T} \min(p(x), q'(x))`.

    ``T`` is the top ``n - 1`` tokens of ``q`` and :math:`q' = q / (1 - q(T))` off ``T`` (Hu et al., ICLR
    2025, arXiv:2502.18779; SpecHub, Sun et al., EMNLP 2024, arXiv:2411.05289). Only sets ``H`` containing
    ``T`` have :math:`Q(H) = q'(H \setminus T) > 0`, so the minimiser is
    :math:`H = T \cup \{x \notin T : p(x) < q'(x)\}` (or the empty set when that does not go below 1).

    Returns the values (B,) and a boolean (B, V) mask of the minimising set.
    """
    top = np.zeros(p.shape, dtype=bool)
    if n > 1:
        np.put_along_axis(top, _top_tokens_batched(q, n - 1), True, axis=-1)
    rest = np.where(top, 0.0, q)
    rest = rest / rest.sum(axis=-1, keepdims=True)
    values = np.where(top, p, np.minimum(p, rest)).sum(axis=-1)
    in_set = top | (~top & (p < rest))
    in_set &= (values < 1.0)[:, None]
    return np.clip(values, 0.0, 1.0), in_set


# ----------------------------------------------------------------------------------------------------------
# Exact oracles on the enumerated draft law (one pair at a time)


def _law_size(q: np.ndarray, n: int, draft: str) -> int:
    """Number of tuples :func:`enumerate_drafts` returns, without enumerating them."""
    support = int(np.count_nonzero(q))
    if draft == "iid":
        return support**n
    if draft == "wor":
        return int(np.prod(np.arange(support - n + 1, support + 1, dtype=float)))
    if draft == "greedy":
        return support - (n - 1)
    return 2 * (support - 1)  # spechub


def _membership(tuples: np.ndarray, vocab: int) -> np.ndarray:
    """(M, V) boolean matrix ``y in x̄``."""
    member = np.zeros((len(tuples), vocab), dtype=bool)
    np.put_along_axis(member, tuples, True, axis=-1)
    return member


#: HiGHS' default feasibility tolerances (1e-7) admit a vertex 1e-8 off the optimum; the methods must agree
#: to 1e-9.
_HIGHS_TOLERANCES = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}


def _lp(tuples, probabilities, p) -> float:
    """Primal OT LP with HiGHS; one target-marginal row is implied by the others and dropped.

    ``p`` is rescaled to the exact total of the draft law and the dropped row is the largest ``p``'s, so
    that round-off in either marginal cannot make HiGHS declare the problem infeasible.
    """
    from scipy.optimize import linprog
    from scipy.sparse import eye, kron, vstack

    drafts, vocab = len(tuples), p.shape[-1]
    p = p * (probabilities.sum() / p.sum())
    kept = np.flatnonzero(np.arange(vocab) != np.argmax(p))
    row_sums = kron(eye(drafts), np.ones((1, vocab)))
    column_sums = kron(np.ones((1, drafts)), eye(vocab)).tocsr()
    constraints = vstack([row_sums, column_sums[kept]]).tocsr()
    bounds = np.concatenate([probabilities, p[kept]])
    result = linprog(
        -_membership(tuples, vocab).ravel().astype(float),
        A_eq=constraints,
        b_eq=bounds,
        bounds=(0, None),
        method="highs",
        options=_HIGHS_TOLERANCES,
    )
    if result.status != 0:
        raise RuntimeError(f"HiGHS failed on the optimal-acceptance LP: {result.message}")
    return float(-result.fun)


def _pot(tuples, probabilities, p) -> float:
    """``1 - ot.emd2(P, p, M)`` with ``M = 1[y not in x̄]`` (network simplex, exact)."""
    import ot

    cost = (~_membership(tuples, p.shape[-1])).astype(np.float64)
    return float(1.0 - ot.emd2(probabilities, p, cost, numItermax=10_000_000))


def _cvxpy(tuples, probabilities, p) -> float:
    """The dual LP :math:`\\min P \\cdot u + p \\cdot v` s.t. :math:`u_{\\bar x} + v_y \\ge 1[y \\in \\bar x]`."""
    import cvxpy as cp

    member = _membership(tuples, p.shape[-1]).astype(float)
    u = cp.Variable(len(tuples))
    v = cp.Variable(p.shape[-1])
    # The constraint matrix is totally unimodular and some optimum has u, v in {0, 1} (the subset form), so
    # u, v >= 0 loses nothing; it bounds the objective below, which pinning one v_y = 0 did not when HiGHS
    # met draft-tuple probabilities near its tolerances (it reported "unbounded" on a bounded problem).
    constraints = [u[:, None] + v[None, :] >= member, u >= 0, v >= 0]
    problem = cp.Problem(cp.Minimize(probabilities @ u + p @ v), constraints)
    problem.solve(solver=cp.HIGHS, **_HIGHS_TOLERANCES)
    if problem.status != cp.OPTIMAL:
        raise RuntimeError(f"cvxpy/HiGHS failed on the dual optimal-acceptance LP: {problem.status}")
    return float(problem.value)


def _maxflow(tuples, probabilities, p, with_set: bool = False):
    """networkx max flow = min cut: source -> x̄ (P(x̄)), x̄ -> y in x̄ (uncapacitated), y -> sink (p(y)).

    The source side of a minimum cut holds the tokens of a minimising ``H``.
    """
    import networkx as nx

    graph = nx.DiGraph()
    for index, (drafts, probability) in enumerate(zip(tuples.tolist(), probabilities, strict=True)):
        graph.add_edge("source", ("draft", index), capacity=float(probability))
        for token in set(drafts):
            graph.add_edge(("draft", index), ("token", token))  # no capacity attribute: infinite
    for token, mass in enumerate(p):
        graph.add_edge(("token", token), "sink", capacity=float(mass))
    value, (source_side, _) = nx.minimum_cut(graph, "source", "sink")
    if not with_set:
        return float(value)
    token_set = sorted(node[1] for node in source_side if isinstance(node, tuple) and node[0] == "token")
    return float(value), np.array(token_set, dtype=np.int64)


def _subset_sums(weights_by_mask: np.ndarray, vocab: int) -> np.ndarray:
    """Zeta transform: ``out[H] = sum over S subset of H of weights_by_mask[S]`` (bitmask indices)."""
    out = weights_by_mask.copy()
    for bit in range(vocab):
        view = out.reshape(-1, 2, 1 << bit)
        view[:, 1, :] += view[:, 0, :]
    return out


def _enumerate_subsets(tuples, probabilities, p, with_set: bool = False):
    r"""Brute force :math:`1 + \min_H [p(H) - Q(H)]` over all :math:`2^V` token sets (bitmasks)."""
    vocab = p.shape[-1]
    masks = np.bitwise_or.reduce(np.left_shift(1, tuples), axis=-1)
    inclusion = _subset_sums(np.bincount(masks, weights=probabilities, minlength=1 << vocab), vocab)
    singletons = np.zeros(1 << vocab)
    singletons[1 << np.arange(vocab)] = p
    gap = _subset_sums(singletons, vocab) - inclusion
    best = int(np.argmin(gap))
    value = float(np.clip(1.0 + gap[best], 0.0, 1.0))
    if not with_set:
        return value
    return value, np.flatnonzero((best >> np.arange(vocab)) & 1)


_ORACLES = {"lp": _lp, "pot": _pot, "cvxpy": _cvxpy, "maxflow": _maxflow, "enumerate": _enumerate_subsets}


# ----------------------------------------------------------------------------------------------------------
# Optimal coupling


def _optimal_coupling(tuples, probabilities, p) -> np.ndarray:
    """An exactly feasible optimal plan ``pi (M, V)``: maximum accepted flow plus the product of leftovers."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_array, vstack

    drafts, vocab = len(tuples), p.shape[-1]
    # One variable per (tuple, distinct token in it): the mass accepted on that token.
    pairs = np.array(sorted({(i, y) for i, row in enumerate(tuples.tolist()) for y in row}), dtype=np.int64)
    count = len(pairs)
    rows = coo_array((np.ones(count), (pairs[:, 0], np.arange(count))), shape=(drafts, count))
    columns = coo_array((np.ones(count), (pairs[:, 1], np.arange(count))), shape=(vocab, count))

    result = linprog(
        -np.ones(count),
        A_ub=vstack([rows, columns]).tocsr(),
        b_ub=np.concatenate([probabilities, p]),
        bounds=(0, None),
        method="highs",
        options=_HIGHS_TOLERANCES,
    )
    if result.status != 0:
        raise RuntimeError(f"HiGHS failed on the accepted-flow LP: {result.message}")
    accepted = np.zeros((drafts, vocab))
    accepted[pairs[:, 0], pairs[:, 1]] = np.clip(result.x, 0.0, None)
    # Scale rows, then columns, under their marginals so that both leftovers are >= 0.
    with np.errstate(divide="ignore", invalid="ignore"):
        row_total = accepted.sum(axis=1)
        accepted *= np.where(row_total > probabilities, probabilities / row_total, 1.0)[:, None]
        column_total = accepted.sum(axis=0)
        accepted *= np.where(column_total > p, p / column_total, 1.0)[None, :]
    row_left = np.clip(probabilities - accepted.sum(axis=1), 0.0, None)
    column_left = np.clip(p - accepted.sum(axis=0), 0.0, None)
    total_left = column_left.sum()
    if total_left > 0:
        accepted += np.outer(row_left, column_left / total_left)
    return accepted
