r"""A run-time optimal multi-draft verifier for i.i.d. drafts: exactly lossless, reaching :math:`\alpha^*`.

Drafts :math:`X_1, \dots, X_n` are i.i.d. from ``q``, the target is ``p``. The best acceptance of any lossless
verifier is :math:`\alpha^* = 1 + \min_H [p(H) - q(H)^n]`, attained by a prefix :math:`H^*` of the tokens sorted
by increasing :math:`p/q` (:func:`theory.optimal_acceptance`). The verifier built here (reference note
``optimal_verifier.md``, checked by enumeration in ``tests/theory/test_optimal_verifier.py``) has two stages:

1. **Select one draft.** The *tight prefixes* (ratio prefixes whose gap :math:`p(H_k) - q(H_k)^n` is within
   :data:`TIGHT` of the minimum) cut the ratio order into *classes*. Among the drafts, only those in the highest
   class present (the most under-proposed tokens) compete, in an exponential race with one weight per token
   group (:mod:`theory._race`). Since the drafts are independent, the selection marginal ``r`` has the exact
   one-dimensional integral form of :func:`theory._race.race_marginal`; a class of one token has
   :math:`r = q_{hi}^n - q_{lo}^n`.
2. **One single-draft speculative step against r.** Accept the selected ``y`` with probability
   :math:`\min(1, p(y)/r(y))`, otherwise output a draw from :math:`(p - r)_+ / \|(p - r)_+\|_1`. Whatever the
   selection rule, this outputs exactly ``p`` when ``r`` is its true marginal (Khisti, Ebrahimi, Dbouk, Behboodi,
   Memisevic, Louizos, "Multi-Draft Speculative Sampling: Canonical Architectures and Theoretical Limits",
   arXiv 2410.18234), and its acceptance is :math:`\sum_y \min(p(y), r(y))`.

Every class ``C`` between cuts :math:`q_{lo} = q(\text{lower classes})` and :math:`q_{hi} = q_{lo} + q(C)` is
selected with probability :math:`R_C = q_{hi}^n - q_{lo}^n` (computed as
:math:`q(C) \sum_j q_{hi}^j q_{lo}^{n-1-j}`, without cancellation). When :math:`R_C \le p(C)` (classes above the
minimiser) the weights aim at the water-filled target :math:`r^* = \min(p, c\, q)`, otherwise (below it) at
:math:`r^* = \max(p, c\, q)`, with ``c`` solved exactly on the sorted class. With those marginals
:math:`\sum \min(p, r) = \alpha^*` (structure theorem of the note, section 2). Tokens share weights in *units*:
each token its own unit in small classes; in large ones the capped tokens form one unit, tokens with
:math:`\max(p, q) \ge` :data:`OWN_UNIT_MASS` their own, and the rest :data:`BINS` bins of :math:`\log(p/q)`,
at most :data:`MAX_UNITS` per class (:mod:`theory._class_units`: neighbours in target ratio merged). The
fit decides the acceptance only: ``shortfall`` :math:`= \alpha^* - \sum \min(p, r)` is known at build time, and a
build whose shortfall exceeds :data:`RETRY_SHORTFALL` is redone once with :data:`RETRY_BINS` bins, then (with
``item_fit``) once more with one weight per item in the large classes (:mod:`theory._token_race`, started from
the unit fit's weights): units sharing :math:`r/q` cannot follow ``p`` token by token, which a class with no
room asks for (:math:`\alpha^*` at 1, or within the units' loss of it, as close full-vocabulary drafts give).

Round-off: prefix sums over the ratio order are blockwise (float64 inside blocks of
:data:`theory._buckets.BLOCK` tokens, the block offsets in extended precision), complements are sums of the
other entries, never ``1 - x``, and ``c`` comes from the piecewise-linear fill, not a bisection (which loses
all resolution at :math:`\max p/q \sim 10^{20}`).

Tokens with :math:`0 < q <` :data:`NEGLIGIBLE_Q` (for ``n >= 2``) join the tokens with ``q = 0`` in the lowest
class, with weight 1: a draft of one loses to every other draft, and a tuple of them only picks uniformly. Their
exact marginal :math:`q_y Q^{n-1}` (``Q`` their total mass) is 0 in float64, the other tokens' marginals move by
a relative :math:`O(nQ)`, far below round-off, and the acceptance given up is at most :math:`nQ`. Left in the
race, their ratios :math:`p/q` overflow and the fit, with masses 1e300 times apart, stopped short (0.014 of
acceptance on a token with q = 5e-324).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from theory import _buckets, _native
from theory._buckets import head_sums, prefix_sums, tail_sums
from theory._class_units import (
    MAX_OWN_UNITS,
    MAX_UNITS,
    OWN_UNIT_MASS,
    TIGHT,
    _cap_units,
    _compact,
    _fill_level,
    _unit_targets,
    _units,
)
from theory._race import NATIVE_CONSTANTS as RACE_CONSTANTS
from theory._race import _power_difference, fit_log_weights, single_threaded_blas
from theory._token_race import fit_item_log_weights
from theory.checks import as_count, distribution_pair_with_sums
from theory.verifiers import Verifier

__all__ = ["OptimalVerifier", "RuntimeOptimalVerifier", "optimal_tables", "optimal_verifier"]

#: Bins of ``log(p/q)`` for the other uncapped tokens of a large class, first and on retry.
BINS, RETRY_BINS = 96, 384
#: A build whose shortfall exceeds this is rebuilt once with ``RETRY_BINS``.
RETRY_SHORTFALL = 1e-9
#: Drafts with ``0 < q`` below this are demoted below every other draft (module docstring).
NEGLIGIBLE_Q = 1e-300
#: Grouped builds only where 1 - alpha* is at least this. With less room than the shortfall allowed, a grouped
#: fit that misses is rebuilt token by token anyway: on a logged SmolLM2 pair with 1 - alpha* = 1.8e-10 (n = 8)
#: the grouping missed and the build took 39 ms instead of the exact path's 16.
GROUPED_MIN_ROOM = RETRY_SHORTFALL
#: Default ``group_below`` of :func:`optimal_verifier`: lighter tokens may share a ratio-bucket item.
GROUP_BELOW = OWN_UNIT_MASS
#: Rows whose draft support is below this fraction of the vocabulary are cut to it before the grouped build
#: (:func:`_build_row`). On 196 logged pairs of the default head (V = 49,152, support 9,705) the median build
#: went from 4.05 / 6.72 / 7.34 ms to 3.00 / 5.34 / 5.88 ms at n = 2 / 4 / 8 (interleaved, same tables).
CUT_SUPPORT_BELOW = 0.5


@dataclass(frozen=True)
class _Tables:
    """Per-row tables: everything the sampler and the conditional law need.

    ``item_class`` and ``item_log_weight`` are per *item* (a ratio bucket's group or a single token) and
    ``item`` (V,) maps every token to its item (``None``: the two are already per token). The per-token
    :attr:`class_id` and :attr:`log_weight` are gathered on first use only: the executor needs them at the
    drafts alone, and two vocabulary-sized gathers were a fifth of the build.
    """

    marginal: np.ndarray  # r (V,)
    item_class: np.ndarray  # int, -1 where q = 0; larger = higher priority
    item_log_weight: np.ndarray  # race log-weights, -inf where q = 0
    acceptance: float  # sum min(p, r)
    alpha_star: float
    minimiser_size: int
    item: np.ndarray | None = None  # (V,) int64 item of each token

    @cached_property
    def class_id(self) -> np.ndarray:
        return self.item_class if self.item is None else self.item_class[self.item]

    @cached_property
    def log_weight(self) -> np.ndarray:
        return self.item_log_weight if self.item is None else self.item_log_weight[self.item]


class OptimalVerifier:
    r"""A built optimal verifier for one pair or a batch of pairs (leading axes of ``p`` and ``q``).

    Attributes
    ----------
    p, q : ndarray (..., V)
        Target and draft distributions (float64).
    n : int
        Drafts per step.
    marginal : ndarray (..., V)
        The selection marginal ``r`` (exact: the race integral of the final weights).
    acceptance : float or ndarray
        :math:`\sum_y \min(p(y), r(y))`, the exact acceptance rate.
    alpha_star : float or ndarray
        :math:`1 + \min_k [P_k - X_k^n]` over ratio prefixes.
    shortfall : float or ndarray
        :math:`\alpha^* - ` ``acceptance`` (clipped at 0 against round-off).
    class_id, log_weight : ndarray (..., V)
        Priority class of each token (``-1`` where ``q = 0``) and its race log-weight.
    accept_probability : ndarray (..., V)
        :math:`\min(1, p/r)` (1 where ``r = 0``; computed on first use).
    residual : ndarray (..., V)
        :math:`(p - r)_+ / \|(p - r)_+\|_1` (``p`` where ``p = r``, a row never reached; computed on first
        use).
    """

    def __init__(self, p: np.ndarray, q: np.ndarray, n: int, tables: list[_Tables], batch_shape: tuple):
        vocab = p.shape[-1]
        self.p, self.q, self.n, self.batch_shape = p, q, n, batch_shape
        shape = (*batch_shape, vocab)
        self._tables, self._shape = tables, shape
        self.marginal = _stack([t.marginal for t in tables]).reshape(shape)
        alpha = np.array([t.alpha_star for t in tables]).reshape(batch_shape)
        accepted = np.array([t.acceptance for t in tables]).reshape(batch_shape)
        self.acceptance = _scalar(accepted)
        self.alpha_star = _scalar(alpha)
        self.shortfall = _scalar(np.maximum(alpha - accepted, 0.0))
        self.minimiser_size = _scalar(np.array([t.minimiser_size for t in tables]).reshape(batch_shape))

    @cached_property
    def class_id(self) -> np.ndarray:
        return _stack([t.class_id for t in self._tables]).reshape(self._shape)

    @cached_property
    def log_weight(self) -> np.ndarray:
        return _stack([t.log_weight for t in self._tables]).reshape(self._shape)

    @cached_property
    def accept_probability(self) -> np.ndarray:
        r = self.marginal
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # p / subnormal r = inf: 1
            return np.where(r > 0, np.minimum(1.0, self.p / np.where(r > 0, r, 1.0)), 1.0)

    @cached_property
    def residual(self) -> np.ndarray:
        excess = np.maximum(self.p - self.marginal, 0.0)
        total = excess.sum(axis=-1, keepdims=True)
        return np.where(total > 0, excess / np.where(total > 0, total, 1.0), self.p)

    def __repr__(self) -> str:
        return f"OptimalVerifier(n={self.n}, batch_shape={self.batch_shape}, shortfall={self.shortfall})"

    # -- draft tuples ----------------------------------------------------------------------------------
    def _tuples(self, drafts) -> tuple[np.ndarray, tuple]:
        """Drafts as (B, M, n) int, with the shape of the leading axes beyond the batch (``()`` or ``(M,)``)."""
        array = np.asarray(drafts)
        if not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"drafts must be integer token ids, got dtype {array.dtype}")
        depth = len(self.batch_shape)
        if array.ndim not in (depth + 1, depth + 2) or array.shape[:depth] != self.batch_shape:
            raise ValueError(
                f"drafts must have shape {(*self.batch_shape, 'n')} or {(*self.batch_shape, 'M', 'n')}, "
                f"got {array.shape}"
            )
        if array.shape[-1] != self.n:
            raise ValueError(f"drafts must hold n = {self.n} drafts per tuple, got {array.shape[-1]}")
        extra = array.shape[depth:-1]
        tuples = array.reshape(-1, int(np.prod(extra, dtype=np.int64)), self.n).astype(np.int64)
        vocab = self.p.shape[-1]
        if tuples.size and (tuples.min() < 0 or tuples.max() >= vocab):
            raise ValueError(
                f"drafts must be token ids in [0, {vocab}), got [{tuples.min()}, {tuples.max()}]"
            )
        q = self.q.reshape(-1, vocab)
        if tuples.size and np.any(np.take_along_axis(q, tuples.reshape(q.shape[0], -1), axis=-1) <= 0):
            raise ValueError("drafts contains a token with q = 0, which i.i.d. drafts from q never propose")
        return tuples, extra

    def selection(self, drafts) -> np.ndarray:
        r"""Probability that each draft position is selected: :math:`w(X_i)/\sum_{j \in top} w(X_j)` on the top class.

        ``drafts`` is ``(*batch, n)`` or ``(*batch, M, n)``; returns float arrays of the same shape.
        """
        tuples, extra = self._tuples(drafts)
        vocab = self.p.shape[-1]
        classes = np.take_along_axis(
            self.class_id.reshape(-1, vocab), tuples.reshape(tuples.shape[0], -1), -1
        )
        logs = np.take_along_axis(self.log_weight.reshape(-1, vocab), tuples.reshape(tuples.shape[0], -1), -1)
        classes, logs = classes.reshape(tuples.shape), logs.reshape(tuples.shape)
        top = classes == classes.max(axis=-1, keepdims=True)
        logs = np.where(top, logs, -np.inf)
        weights = np.exp(logs - logs.max(axis=-1, keepdims=True))
        chosen = weights / weights.sum(axis=-1, keepdims=True)
        return chosen.reshape(*self.batch_shape, *extra, self.n)

    def conditional(self, drafts) -> np.ndarray:
        r"""Exact output law :math:`\pi(\cdot \mid \bar x)` given ordered drafts.

        .. math:: \pi(\cdot \mid \bar x) = \sum_i s_i(\bar x) [a(x_i) \delta_{x_i} + (1 - a(x_i))\,
                  \mathrm{res}], \quad a = \min(1, p/r),

        ``s`` the race's selection probabilities. ``drafts`` is ``(*batch, n)`` -> ``(*batch, V)`` or
        ``(*batch, M, n)`` -> ``(*batch, M, V)``.
        """
        tuples, extra = self._tuples(drafts)
        vocab = self.p.shape[-1]
        rows = tuples.shape[0]
        chosen = self.selection(drafts).reshape(tuples.shape)
        accept = np.take_along_axis(
            self.accept_probability.reshape(rows, vocab), tuples.reshape(rows, -1), -1
        ).reshape(tuples.shape)
        out = (chosen * (1.0 - accept)).sum(axis=-1)[..., None] * self.residual.reshape(rows, 1, vocab)
        index = np.arange(rows)[:, None, None], np.arange(tuples.shape[1])[None, :, None], tuples
        np.add.at(out, index, chosen * accept)
        return out.reshape(*self.batch_shape, *extra, vocab)

    def sample(self, drafts, rng: np.random.Generator, *, return_selected: bool = False):
        """Run the verifier once per draft tuple with explicit coin flips; returns the output tokens.

        The race is run as a categorical draw with probabilities :meth:`selection` (the law of the first
        exponential clock to ring), then the accept coin, then a residual draw on rejection. ``drafts`` is
        ``(*batch, n)`` (returns ``batch``-shaped ints) or ``(*batch, M, n)`` (``(*batch, M)``); with
        ``return_selected`` also the selected draft token of each tuple (its law is ``marginal``).
        """
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng must be a numpy.random.Generator, got {rng!r}")
        tuples, extra = self._tuples(drafts)
        rows, count, vocab = tuples.shape[0], tuples.shape[1], self.p.shape[-1]
        chosen = self.selection(drafts).reshape(rows, count, self.n)
        cumulative = np.cumsum(chosen, axis=-1)
        u = rng.random((rows, count, 1)) * cumulative[..., -1:]
        position = np.minimum((cumulative <= u).sum(axis=-1), self.n - 1)
        selected = np.take_along_axis(tuples, position[..., None], -1)[..., 0]
        accept = np.take_along_axis(self.accept_probability.reshape(rows, vocab), selected, -1)
        keep = rng.random((rows, count)) < accept
        residual_cdf = np.cumsum(self.residual.reshape(rows, vocab), axis=-1)
        v = rng.random((rows, count)) * residual_cdf[:, -1:]
        fallback = np.array(
            [np.searchsorted(c, vr, side="right") for c, vr in zip(residual_cdf, v, strict=True)]
        )
        fallback = np.minimum(fallback.reshape(rows, count), vocab - 1)
        out = np.where(keep, selected, fallback).reshape((*self.batch_shape, *extra))
        return (out, selected.reshape(out.shape)) if return_selected else out


def optimal_verifier(
    p, q, n: int, *, group_below: float | None = None, item_fit: bool = True
) -> OptimalVerifier:
    r"""Build the run-time optimal verifier for ``n`` i.i.d. drafts from ``q`` and target ``p``.

    Exactly lossless for any weights (the single-draft step runs against the exact selection marginal
    ``r``; Khisti et al., arXiv 2410.18234), with acceptance :math:`\sum \min(p, r)` equal to
    :math:`\alpha^* = 1 + \min_H [p(H) - q(H)^n]` (Hu et al., ICLR 2025, arXiv 2502.18779) up to the reported
    ``shortfall`` (reference note ``optimal_verifier.md``; see the module docstring for the construction).

    Parameters
    ----------
    p, q : array_like (..., V)
        Target and draft distributions; leading axes broadcast and are built row by row.
    n : int
        Drafts per step, ``>= 1`` (``n = 1`` is speculative sampling, ``r = q``).
    group_below : float, optional
        Tokens with ``max(p, q)`` below this that lie provably far from every nearly tight prefix share a
        ratio-bucket item (:mod:`theory._buckets`; default :data:`GROUP_BELOW` when ``V >``
        :data:`MAX_OWN_UNITS`, else 0; ``0`` builds token by token in the exact ratio order, the reference
        path). Exactness never depends on it; if grouping would cost more than
        :data:`RETRY_SHORTFALL` of acceptance, the row is rebuilt token by token.
    item_fit : bool
        When the unit fits miss :math:`\alpha^*` by more than :data:`RETRY_SHORTFALL`, fit the large classes
        with one weight per item (default). It reaches :math:`\alpha^*` to ~1e-14 on close full-vocabulary
        drafts, where the units stop 3e-5 to 4e-4 short, but costs 0.3-1 s a row at V = 49,152 there
        (docs/benchmarks/optimal_verifier.md); the executor builds without it.

    Returns
    -------
    OptimalVerifier

    Examples
    --------
    >>> import numpy as np
    >>> v = optimal_verifier([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 2)
    >>> bool(abs(v.acceptance - v.alpha_star) < 1e-12), round(float(v.acceptance), 6)
    (True, 0.86)
    """
    p, q, p_sums, q_sums = distribution_pair_with_sums(p, q)
    n = as_count(n, "n")
    # Rows off 1 by more than 1e-13 (within the 1e-6 validation tolerance) renormalised, as optimal_tables does:
    # the same rows give bitwise the same tables on both paths, and the usual rows are not copied.
    p, q = _renormalised(p, p_sums), _renormalised(q, q_sums)
    batch_shape = p.shape[:-1]
    flat_p, flat_q = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1])
    if group_below is None:
        group_below = GROUP_BELOW if p.shape[-1] > MAX_OWN_UNITS else 0.0
    elif not 0.0 <= group_below <= np.inf:
        raise ValueError(f"group_below must be a mass >= 0 (0 disables grouping), got {group_below!r}")
    if not isinstance(item_fit, bool):
        raise ValueError(f"item_fit must be True or False, got {item_fit!r}")
    with _blas_limit():
        tables = [
            _build_row(row_p, row_q, n, float(group_below), item_fit)
            for row_p, row_q in zip(flat_p, flat_q, strict=True)
        ]
    return OptimalVerifier(p, q, n, tables, batch_shape)


def optimal_tables(
    p: np.ndarray, q: np.ndarray, n: int, *, group_below: float | None = None, item_fit: bool = True
) -> _Tables:
    """The build of :func:`optimal_verifier` for one row, without its input checks: the executor's entry point.

    ``p``, ``q`` are float64 arrays ``(V,)`` already known to be distributions (renormalised here only if
    their sums are off by more than 1e-13), ``n >= 1``. Returns the row's tables: ``marginal``, ``class_id``,
    ``log_weight``, ``acceptance``, ``alpha_star``, ``minimiser_size``.
    """
    p_sum, q_sum = float(p.sum()), float(q.sum())
    if abs(p_sum - 1.0) > 1e-13:
        p = p / p_sum
    if abs(q_sum - 1.0) > 1e-13:
        q = q / q_sum
    if group_below is None:
        group_below = GROUP_BELOW if p.shape[-1] > MAX_OWN_UNITS else 0.0
    with _blas_limit():
        return _build_row(p, q, n, float(group_below), bool(item_fit))


def _blas_limit():
    """The BLAS limit of a build (:func:`theory._race.single_threaded_blas`), for numpy's race matrices: held
    around the whole build when its fits run in numpy. A native build takes none (taking it cost 0.03-0.15 ms
    of a ~2 ms build); a numpy fit inside it (a refused native fit, an item fit) takes its own."""
    return contextlib.nullcontext() if _native.available() else single_threaded_blas()


def _renormalised(x: np.ndarray, sums: np.ndarray) -> np.ndarray:
    """``x`` with the rows whose ``sums`` (the checks' row sums) are off 1 by more than 1e-13 divided by them."""
    off = np.abs(sums - 1.0) > 1e-13
    return np.where(off[..., None], x / sums[..., None], x) if off.any() else x


def _stack(rows: list[np.ndarray]) -> np.ndarray:
    return rows[0] if len(rows) == 1 else np.stack(rows)


def _scalar(value: np.ndarray):
    return float(value) if np.ndim(value) == 0 else value


# ----------------------------------------------------------------------------------------------------------
# Build of one row


def _build_row(p: np.ndarray, q: np.ndarray, n: int, group_below: float, item_fit: bool) -> _Tables:
    vocab = p.shape[-1]
    if n == 1:
        class_id = np.where(q > 0, 0, -1)
        log_weight = np.where(q > 0, 0.0, -np.inf)
        alpha = float(np.minimum(p, q).sum())
        return _Tables(q.copy(), class_id, log_weight, alpha, alpha, int(np.sum(p < q)))
    if group_below > 0:
        # The grouped build in one native call where it is built (None: the Python below builds the row).
        constants = _build_row_constants(), _buckets.NATIVE_CONSTANTS, _build_constants()
        native = _native.build_row(p, q, n, group_below, *constants)
        if native is not None:
            return _Tables(*native)
    positive = q >= NEGLIGIBLE_Q
    full = bool(positive.all())  # a full-vocabulary draft: no gathers and scatters over the vocabulary
    support = None if full else np.flatnonzero(positive)
    # The grouped path passes over every token it is given (~15 times). A draft that leaves out most of the
    # vocabulary (a drafter with a reduced vocabulary: 9,705 of SmolLM2's 49,152 tokens for the default head)
    # is cut to its support first; a row with fewer absent tokens is passed whole, the absent ones rekeyed
    # by bucketed (no copy). Both give the same tables (the same sums over the same tokens in the same order).
    cut = support is not None and support.shape[0] < CUT_SUPPORT_BELOW * vocab
    ps, qs = (p[support], q[support]) if cut else (p, q)
    built = None
    if group_below > 0:
        absent = np.flatnonzero(~positive) if support is not None and not cut else None
        built = _build_items(
            _buckets.bucketed(ps, qs, n, group_below, TIGHT, absent), n, GROUPED_MIN_ROOM, item_fit
        )
        if built is not None and built[5] - built[4] > RETRY_SHORTFALL:  # the grouping cost acceptance
            built = None  # the exact path instead
        elif built is not None and absent is not None:  # the tokens left out already point at one extra item
            r, classes, logs, item, accepted, alpha, minimiser = built
            return _Tables(r, np.append(classes, -1), np.append(logs, 0.0), accepted, alpha, minimiser, item)
    if built is None:
        if support is not None and not cut:
            ps, qs = p[support], q[support]
        built = _build_items(_buckets.singletons(ps, qs), n, item_fit=item_fit)
    r_support, classes, logs, item_support, accepted, alpha, minimiser = built
    if full:
        return _Tables(r_support, classes, logs, accepted, alpha, minimiser, item_support)
    # Tokens with q = 0 or negligible share one extra item: class -1, log-weight 0, r = 0 (module docstring).
    r = np.zeros(vocab)
    item = np.full(vocab, classes.shape[0], dtype=np.int64)
    r[support], item[support] = r_support, item_support
    return _Tables(r, np.append(classes, -1), np.append(logs, 0.0), accepted, alpha, minimiser, item)


def _build_items(items: _buckets.Items, n: int, min_room: float = 0.0, item_fit: bool = True):
    """Marginal of every support token, class and log-weight of every item (in ratio order), the item of every
    support token, the acceptance sum(min(p, r)), alpha* and the minimiser's size in tokens; ``None`` when
    1 - alpha* < ``min_room``. Runs as C++ where it is built (:mod:`theory._native`: the first unit fit; rows
    that need numpy's retries come back here), else :func:`_build_items_in_numpy`."""
    built = _native.build_items(items, n, min_room, _build_constants())
    if built is _native.NO_ROOM:
        return None
    return built if built is not None else _build_items_in_numpy(items, n, min_room, item_fit)


def _build_items_in_numpy(items: _buckets.Items, n: int, min_room: float = 0.0, item_fit: bool = True):
    """:func:`_build_items` in numpy: the specification of its native twin (``theory/csrc/build.cpp``), which
    runs the first fit only (``fit(BINS)``) and hands the retries back here."""
    ps, qs = items.p, items.q
    size = ps.shape[0]
    target_mass = prefix_sums(ps)
    draft_mass = np.minimum(prefix_sums(qs), 1.0)
    gap = target_mass - draft_mass**n
    best = gap.min()
    if -best < min_room:
        return None
    alpha = float(np.clip(1.0 + best, 0.0, 1.0))
    cuts = np.flatnonzero(gap <= best + TIGHT)
    minimiser = int(head_sums(items.count)[cuts[np.argmin(gap[cuts])]])
    # Slack of each item: how far the gap at the nearer of its two prefixes is above the minimum.
    slack = np.minimum(gap[:-1], gap[1:]) - best
    bounds = np.unique(np.concatenate(([0], cuts, [size])))
    lows, highs = bounds[:-1], bounds[1:]
    low_mass, high_mass = draft_mass[lows], draft_mass[highs]
    class_q = np.add.reduceat(qs, lows)
    selected = _power_difference(high_mass, low_mass, class_q, n)
    classes = np.repeat(np.arange(lows.shape[0]), highs - lows)
    r_items, logs = np.zeros(size), np.zeros(size)

    def fit(bins):
        for index, (a, b) in enumerate(zip(lows, highs, strict=True)):
            if b - a == 1 and items.single[a]:
                r_items[a] = selected[index]
            elif bins is None:  # one weight per item where units were used, from their weights
                if b - a > MAX_OWN_UNITS:
                    r_items[a:b], logs[a:b] = _fit_class_by_item(
                        items, a, b, low_mass[index], selected[index], n, logs[a:b]
                    )
            elif bins == BINS or b - a > MAX_OWN_UNITS or not items.single[a:b].all():
                r_items[a:b], logs[a:b] = _fit_class(
                    items, a, b, slack[a:b], low_mass[index], selected[index], n, bins
                )
        # r_y = q_y r_i / q_i: a group's tokens share its selection in proportion to q (exact for a single).
        scale = np.zeros(size + 1)  # item ``size``: tokens with q = 0 in a whole row (r = 0)
        np.divide(r_items, qs, out=scale[:size])
        r = np.take(scale, items.item)
        r *= items.q_tokens
        return r, float(np.minimum(items.p_tokens, r, out=_buckets.scratch(r.shape[0])[0]).sum())

    r, accepted = fit(BINS)
    # Short of alpha*: finer units, then (item_fit) one weight per item; each kept only if it accepts more.
    for fallback in (RETRY_BINS, None) if item_fit else (RETRY_BINS,):
        if alpha - accepted <= RETRY_SHORTFALL or size <= MAX_OWN_UNITS:
            break
        first = r_items.copy(), logs.copy()
        again, again_accepted = fit(fallback)
        if again_accepted > accepted:
            r, accepted = again, again_accepted
        else:
            r_items[:], logs[:] = first
    return r, classes, logs, items.item, accepted, alpha, minimiser


def _fit_class(items, a: int, b: int, slack, lower: float, mass: float, n: int, bins: int):
    r"""Marginal ``r`` and log-weights of the items ``a:b`` of one class (items in increasing ratio).

    Targets: the water-filled :math:`r^* = \min(p, c q)` when ``mass <= p(C)`` (``above``), else
    :math:`\max(p, c q)`, with the ratio of a grouped item replaced by its bound (the smallest ratio of its
    tokens above, the largest below), so that :math:`r \le p` (above) or :math:`r \ge p` (below) holds on every
    token of the group. Each item is its own unit in classes of at most :data:`MAX_OWN_UNITS` items. In larger
    classes a unit (:func:`_units`) gets the target :math:`\rho_u Q_u` with :math:`\rho_u = \min(m_u, c')`,
    :math:`m_u` the smallest ratio bound in the unit and :math:`c'` refilled at unit level (mirror image below:
    largest, ``max``); units at the level :math:`c'` are merged. When no level reaches ``mass``
    (:math:`\alpha^*` close to 1 leaves too little room) the unit targets fall back to the unit sums of
    :math:`r^*`, a feasible point whose acceptance loss is the reported shortfall.
    """
    qs = items.q[a:b]
    above, capped, ratio = _fill_view(items, a, b, mass)
    size = qs.shape[0]
    if size <= MAX_OWN_UNITS:
        unit_target = _item_targets(capped, ratio, qs, mass, above)
        labels, unit_q = np.arange(size), qs
    else:
        made = _native.class_units(capped, qs, ratio, slack, mass, above, lower, n, bins, UNIT_CONSTANTS)
        if made is None:
            made = _class_units(capped, qs, ratio, slack, mass, above, lower, n, bins)
        labels, unit_q, unit_target = made
        labels, unit_q, unit_target = _cap_units(labels, qs, unit_q, unit_target, MAX_UNITS)
    # Positive targets summing to the class mass, so that the weights stay finite.
    unit_target = np.maximum(unit_target, 1e-300)
    unit_target *= mass / unit_target.sum()
    log_weights, unit_r = fit_log_weights(lower, unit_q, unit_target, n)
    unit_r *= mass / unit_r.sum()  # the exact marginal sums to mass; removes the common-mode quadrature error
    return qs * (unit_r / unit_q)[labels], log_weights[labels]


#: The constants :func:`_class_units` hands to its native twin (:mod:`theory._native`).
UNIT_CONSTANTS = {"OWN_UNIT_MASS": OWN_UNIT_MASS, "MAX_OWN_UNITS": MAX_OWN_UNITS, "TIGHT": TIGHT}


def _build_constants() -> dict:
    """The constants :func:`_build_items` hands to its native twin (:mod:`theory._native`), read when called, so
    that the module's constants, as set (tests change some), are the ones both builds see; the units get
    :data:`UNIT_CONSTANTS`, as :func:`_fit_class` gives them."""
    return {
        "TIGHT": TIGHT,
        "RETRY_SHORTFALL": RETRY_SHORTFALL,
        "BINS": BINS,
        "MAX_OWN_UNITS": MAX_OWN_UNITS,
        "MAX_UNITS": MAX_UNITS,
        **{f"UNIT_{name}": value for name, value in UNIT_CONSTANTS.items()},
        **RACE_CONSTANTS,
    }


def _build_row_constants() -> dict:
    """The constants the native grouped build of a row reads besides the buckets' and the build's
    (:data:`theory._native.ROW_CONSTANT_NAMES`), read when called, as :func:`_build_constants`."""
    return {
        "NEGLIGIBLE_Q": NEGLIGIBLE_Q,
        "CUT_SUPPORT_BELOW": CUT_SUPPORT_BELOW,
        "GROUPED_MIN_ROOM": GROUPED_MIN_ROOM,
        "TIGHT": TIGHT,
    }


def _class_units(capped, qs, ratio, slack, mass: float, above: bool, lower: float, n: int, bins: int):
    """Labels, unit masses and unit targets of a large class before the cap (:func:`_fit_class`); the
    specification of the native twin (``theory/csrc/units.cpp``)."""
    labels = _units(capped, qs, slack, bins)
    for attempt in range(4):
        labels, unit_q, unit_target = _unit_targets(labels, qs, ratio, capped, mass, above)
        if attempt == 3:
            break
        # Targets that leave the race polytope on a chain of units sorted by target/Q (units straddling a
        # nearly tight prefix: r(T) >= (x + Q(T))^n - x^n above, r(T) <= mass - ((x + Q(C \ T))^n - x^n)
        # below) are repaired by splitting every unit of several items up to the last violated prefix.
        wrong = _chain_violations(unit_q, unit_target, lower, mass, n, above)
        wrong &= np.bincount(labels, minlength=unit_q.shape[0]) > 1
        if not wrong.any():
            break
        split = wrong[labels]
        labels = np.where(split, labels.max() + 1 + np.arange(qs.shape[0]), labels)
        labels = _compact(labels)
    return labels, unit_q, unit_target


def _fill_view(items, a: int, b: int, mass: float):
    """``above`` (``mass <= p(C)``), and ``p`` and the ratio as the fill sees them on the items ``a:b``: exact
    on single tokens, the ratio bound (and bound * q) on groups (:func:`_fit_class`)."""
    ps, qs, single = items.p[a:b], items.q[a:b], items.single[a:b]
    above = mass <= ps.sum()
    bound = items.low[a:b] if above else items.high[a:b]
    return above, np.where(single, ps, bound * qs), np.where(single, ps / qs, bound)


def _item_targets(capped, ratio, qs, mass: float, above: bool) -> np.ndarray:
    r"""The water-filled target of every item: :math:`\min(p, c q)` (above) or :math:`\max(p, c q)`."""
    order = np.argsort(ratio, kind="stable")
    level = _fill_level(ratio[order], qs[order], mass, above)
    return np.minimum(capped, level * qs) if above else np.maximum(capped, level * qs)


def _fit_class_by_item(items, a: int, b: int, lower: float, mass: float, n: int, start: np.ndarray):
    r"""Marginal and log-weights of the items ``a:b`` of a large class with one weight per item
    (:func:`theory._token_race.fit_item_log_weights`, from the unit fit's log-weights ``start``): the
    water-filled target of every item, which units sharing :math:`r/q` cannot follow when the class has
    little room (reference note, section 5; docs/benchmarks/optimal_verifier.md, close drafts)."""
    qs = items.q[a:b]
    above, capped, ratio = _fill_view(items, a, b, mass)
    target = np.maximum(_item_targets(capped, ratio, qs, mass, above), 1e-300)
    target *= mass / target.sum()
    log_weights, r = fit_item_log_weights(lower, qs, target, n, start)
    r *= mass / r.sum()  # as in _fit_class: the exact marginal sums to mass
    return r, log_weights


def _chain_violations(unit_q, unit_target, lower: float, mass: float, n: int, above: bool) -> np.ndarray:
    """Units on the chain (by target/Q, ascending above, descending below) up to its last prefix whose
    target leaves the race polytope."""
    unit_target = unit_target * (mass / unit_target.sum())  # as fitted: the sum is the whole-class equality
    order = np.argsort(unit_target / unit_q)
    if not above:
        order = order[::-1]
    head_q = np.cumsum(unit_q[order])
    head_t = np.cumsum(unit_target[order])
    if above:
        deficit = _power_difference(lower + head_q, np.full_like(head_q, lower), head_q, n) - head_t
    else:
        rest = tail_sums(unit_q[order])[1:]  # Q(C \ T_k) as a sum
        deficit = head_t - (mass - _power_difference(lower + rest, np.full_like(rest, lower), rest, n))
    bad = np.flatnonzero(deficit[:-1] > 1e-15 * mass)  # the whole class (last prefix) is not a constraint
    wrong = np.zeros(unit_q.shape[0], dtype=bool)
    if bad.size:
        wrong[order[: bad[-1] + 1]] = True
    return wrong


class RuntimeOptimalVerifier(Verifier):
    r"""``verifier("optimal")`` for i.i.d. drafts: the run-time construction of :func:`optimal_verifier`.

    Attains :math:`\alpha^*` (to the build's ``shortfall``, ~1e-14 on real pairs) at any vocabulary size and is
    exactly lossless. The last build is cached, since tests and :meth:`sample` ask for the same pair; the LP
    coupling (``verifier("optimal", method="lp")``) remains as the small-V oracle. It builds as the executor
    does (``item_fit=False``: the unit fit alone), so that its exact acceptance is the executor's, the twin
    that replays and :func:`theory.check_lossless` check.
    """

    name, draft = "optimal", "iid"

    def __init__(self):
        self._cache: tuple[bytes, OptimalVerifier] | None = None

    def build(self, p, q, n: int) -> OptimalVerifier:
        # The shape too: a batch of pairs and its transpose can hold the same bytes.
        key = repr(p.shape).encode() + p.tobytes() + q.tobytes() + n.to_bytes(4, "little")
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, optimal_verifier(p, q, n, item_fit=False))
        return self._cache[1]

    def _acceptance(self, p, q, n):
        return self.build(p, q, n).acceptance

    def _conditional(self, p, q, drafts):
        return self.build(p, q, drafts.shape[1]).conditional(drafts)

    def _simulate(self, p, q, drafts, rng):
        return int(self.build(p, q, drafts.shape[0]).sample(drafts, rng))
