r"""The run-time optimal verifier for drafts drawn *without replacement* (successive sampling), small supports.

Drafts :math:`X_1, \dots, X_n` are ``n`` successive draws without replacement from ``q`` (the law ``"wor"`` of
:mod:`theory.draft_laws`); the best acceptance of a lossless verifier is
:math:`\alpha^*_{wor} = 1 + \min_H [p(H) - Q(H)]`, :math:`Q(H) = P(\{X_1..X_n\} \subseteq H)`, attained by a
prefix of the ratio order (Hu et al., ICLR 2025, arXiv 2502.18779; :func:`theory.optimal_acceptance` with
``draft="wor"``). The construction is the one of :func:`theory.optimal_verifier` with the draft law changed:

1. **Select one draft.** Tight prefixes (gap within :data:`TIGHT` of the minimum) cut the ratio order into
   classes; only the drafts of the highest class present compete, in an exponential race with one weight per
   token (the winner is draft ``i`` with probability :math:`w(X_i)/\sum_j w(X_j)`). The race is the same; what
   changes is the selection marginal. The drafts are no longer independent, so instead of the one-dimensional
   integral of :mod:`theory._race` the marginal is the exact sum over the draft *sets* ``S``:

   .. math:: r(y) = \sum_{S \ni y,\ \mathrm{top}(S) = C(y)} P(S)\, \frac{w_y}{\sum_{z \in S \cap C(y)} w_z},
             \qquad P(S) = \sum_{\text{orders of } S} \prod_j \frac{q(x_j)}{q(\text{tokens not yet drawn})}.

2. **One single-draft step against r** (Khisti et al., arXiv 2410.18234): accept ``y`` with probability
   :math:`\min(1, p(y)/r(y))`, else draw from :math:`(p - r)_+`. Lossless whatever the weights.

Targets. A class ``C`` above lower classes ``L`` is on top with probability :math:`R_C = Q(L \cup C) - Q(L)`
(summed over the sets directly, no cancellation). Its achievable marginals form the base polytope of the
coverage function :math:`g(T) = P(S \cap T \ne \emptyset,\ \mathrm{top}(S) = C)` (:math:`r(T) \le g(T)`,
:math:`r(C) = R_C`); the race reaches every interior point, since :math:`r = \nabla_\lambda \Psi` with the convex
:math:`\Psi(\lambda) = E[\log \sum_{i \in S \cap C} e^{\lambda(X_i)};\ \mathrm{top} = C]`. Unlike the i.i.d.
case, ``g`` is not a function of ``q(T)`` alone, so the water-filled ``min(p, c q)`` may leave the polytope; the
target is found by two small linear programmes per class (HiGHS): the largest :math:`\sum_y \min(p_y, r_y)`
over the polytope, then, at that acceptance, the point deepest inside it (so that the weights stay finite).
The weights then solve :math:`\nabla \Psi = r^*` by damped Newton steps with the exact Hessian.

Scope: the sets are enumerated, so the support must have at most :data:`MAX_SETS` ``n``-subsets and classes at
most :data:`MAX_CLASS_TOKENS` tokens (the LP has :math:`2^{|C|}` rows). ``shortfall`` reports
:math:`\alpha^*_{wor} - \sum \min(p, r)` exactly. An LM-sized version needs a closed form of the set sum
(a two-dimensional integral over the race clock and the successive-sampling clock), not done here.
"""

from __future__ import annotations

import itertools
from math import comb, factorial

import numpy as np
from scipy.optimize import linprog

from theory._race import newton_fit
from theory.checks import as_count, as_distribution_pair
from theory.draft_laws import check_draft_law
from theory.optimal_verifier import NEGLIGIBLE_Q, TIGHT, OptimalVerifier, _Tables

__all__ = ["optimal_verifier_wor"]

#: Largest number of ``n``-subsets of the draft's support (times ``n!`` orders) that is enumerated.
MAX_SETS = 200_000
#: Largest class (tokens) whose target LP is built (``2**tokens`` rows).
MAX_CLASS_TOKENS = 14
#: Newton stops when ``sum |r - r*|`` is below this.
TOLERANCE = 1e-15
MAX_ITERATIONS, MAX_HALVINGS = 100, 40
#: HiGHS without presolve: its presolve declared a real pair's class (set masses from 1e-91 to 0.3) infeasible.
#: Feasibility tolerances 1e-10 (default 1e-7, in units of the class mass): at 1e-7 a token with p = 5.6e-8 got
#: the target 1e-9, which the race could not reach (shortfall 1e-3); at 1e-10 its target is p and the shortfall 0.
LP_OPTIONS = {"presolve": False, "primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}


class OptimalVerifierWor(OptimalVerifier):
    """:class:`theory.optimal_verifier.OptimalVerifier` for drafts without replacement (distinct drafts)."""

    draft = "wor"

    def _tuples(self, drafts):
        tuples, extra = super()._tuples(drafts)
        ordered = np.sort(tuples, axis=-1)
        if self.n > 1 and np.any(ordered[..., 1:] == ordered[..., :-1]):
            raise ValueError(
                "drafts must be distinct within a tuple: drafts without replacement never repeat"
            )
        return tuples, extra


def optimal_verifier_wor(p, q, n: int) -> OptimalVerifierWor:
    r"""Build the optimal verifier for ``n`` drafts drawn without replacement from ``q``, target ``p``.

    Exactly lossless (the single-draft step runs against the exact selection marginal), with acceptance
    :math:`\sum \min(p, r)` equal to :math:`\alpha^*_{wor}` up to the reported ``shortfall`` (module
    docstring). ``p``, ``q``: ``(..., V)``, built row by row; ``n``: at most the size of ``q``'s support.
    Rows with some ``0 < q <`` :data:`theory.optimal_verifier.NEGLIGIBLE_Q` are refused (ValueError).

    Examples
    --------
    >>> v = optimal_verifier_wor([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 2)
    >>> round(float(v.alpha_star), 6), bool(v.shortfall < 1e-12)
    (0.985714, True)
    """
    p, q = as_distribution_pair(p, q)
    n = as_count(n, "n")
    p = p / p.sum(axis=-1, keepdims=True)
    q = q / q.sum(axis=-1, keepdims=True)
    batch_shape = p.shape[:-1]
    flat_p, flat_q = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1])
    tables = []
    for row_p, row_q in zip(flat_p, flat_q, strict=True):
        check_draft_law(row_q, n, "wor")
        negligible = row_q[(row_q > 0) & (row_q < NEGLIGIBLE_Q)]
        if negligible.size:
            raise ValueError(
                f"q has {negligible.size} token(s) with 0 < q < {NEGLIGIBLE_Q:g} (smallest {negligible.min():.3g}), "
                "whose draft-set probabilities underflow in the enumerated construction: set them to 0, or use "
                "optimal_verifier (i.i.d. drafts), which demotes them exactly"
            )
        tables.append(_build_row(row_p, row_q, n))
    return OptimalVerifierWor(p, q, n, tables, batch_shape)


def _set_probabilities(q: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """All ``n``-subsets of ``range(len(q))`` (``(M, n)``) and their successive-sampling probabilities.

    The mass not yet drawn is the sum of the other entries (a matrix product of non-negative terms), never
    ``1 - drawn``, which cancels when ``q`` is peaked."""
    size = q.shape[0]
    if comb(size, n) * factorial(n) > MAX_SETS:
        raise ValueError(
            f"q has {size} tokens with q > 0: {comb(size, n)} draft sets of n = {n} (times {factorial(n)} orders) "
            f"exceed {MAX_SETS}, the enumerated construction's limit"
        )
    sets = np.array(list(itertools.combinations(range(size), n)), dtype=np.int64).reshape(-1, n)
    orders = np.array(list(itertools.permutations(range(n))), dtype=np.int64)
    ordered = sets[:, orders]  # (M, n!, n)
    remaining = np.ones((*ordered.shape[:2], size))
    probability = np.ones(ordered.shape[:2])
    for j in range(n):
        token = ordered[..., j]
        rest = remaining @ q
        probability *= q[token] / rest
        np.put_along_axis(remaining, token[..., None], 0.0, axis=-1)
    return sets, probability.sum(axis=1)


def _build_row(p: np.ndarray, q: np.ndarray, n: int) -> _Tables:
    vocab = p.shape[0]
    if n == 1:  # one draft: speculative sampling, r = q
        alpha = float(np.minimum(p, q).sum())
        positive = q > 0
        return _Tables(q.copy(), np.where(positive, 0, -1), np.where(positive, 0.0, -np.inf), alpha, alpha, 0)
    support = np.flatnonzero(q > 0)
    ps, qs = p[support], q[support]
    with np.errstate(divide="ignore", over="ignore"):  # p/q of a subnormal q: inf, ordered last
        order = np.argsort(ps / qs, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    sets, set_p = _set_probabilities(qs, n)
    size = qs.shape[0]
    # Q(H_k) for every ratio prefix: a set lies in H_k iff its largest rank is below k.
    top_rank = rank[sets].max(axis=1)
    inclusion = np.r_[0.0, np.cumsum(np.bincount(top_rank, weights=set_p, minlength=size))]
    target_mass = np.r_[0.0, np.cumsum(ps[order])]
    gap = target_mass - inclusion
    best = float(gap.min())
    alpha = float(np.clip(1.0 + best, 0.0, 1.0))
    cuts = np.flatnonzero(gap <= best + TIGHT)
    minimiser = int(cuts[np.argmin(gap[cuts])])
    bounds = np.unique(np.r_[0, cuts, size])
    token_class = np.searchsorted(bounds, rank, side="right") - 1  # class of each support token
    set_class = token_class[sets].max(axis=1)
    r = np.zeros(size)
    logs = np.zeros(size)
    for index in range(bounds.shape[0] - 1):
        members = order[bounds[index] : bounds[index + 1]]
        on_top = set_class == index
        if not on_top.any():
            continue
        mass = float(set_p[on_top].sum())
        if members.shape[0] == 1:
            r[members] = mass
            continue
        # Membership of each on-top set's class-C drafts in the class's local token order.
        local = np.full(size, -1)
        local[members] = np.arange(members.shape[0])
        inside = local[sets[on_top]]
        member = np.zeros((inside.shape[0], members.shape[0]), dtype=bool)
        rows, cols = np.nonzero(inside >= 0)
        member[rows, inside[rows, cols]] = True
        target = _class_target(member, set_p[on_top], ps[members], mass)
        logs[members], r[members] = _fit(member, set_p[on_top], target)
    accepted = float(np.minimum(ps, r).sum())
    marginal = np.zeros(vocab)
    marginal[support] = r
    class_id = np.full(vocab, -1, dtype=np.int64)
    class_id[support] = token_class
    log_weight = np.full(vocab, -np.inf)
    log_weight[support] = logs
    return _Tables(marginal, class_id, log_weight, accepted, alpha, int(minimiser))


def _class_target(member: np.ndarray, weight: np.ndarray, p: np.ndarray, mass: float) -> np.ndarray:
    r"""Target marginal of one class: largest :math:`\sum \min(p, r)` over the base polytope of
    :math:`g(T) = \sum_S P(S) [S \cap T \ne \emptyset]`, then the point at that value deepest inside it."""
    tokens = member.shape[1]
    if tokens > MAX_CLASS_TOKENS:
        raise ValueError(f"a priority class of {tokens} tokens exceeds the LP limit of {MAX_CLASS_TOKENS}")
    # h(U) = P(S ∩ C = U); g(T) = mass - sum_{U ∩ T = ∅} h(U) = mass - zeta(h)(C \ T), zeta the subset sum.
    codes = member @ (1 << np.arange(tokens))
    full = (1 << tokens) - 1
    zeta = np.bincount(codes, weights=weight, minlength=full + 1)
    for bit in range(tokens):
        has = (np.arange(full + 1) >> bit) & 1 == 1
        zeta[has] += zeta[~has]
    subsets = np.arange(1, full)  # proper non-empty T
    # The LP in units of the class mass (HiGHS's tolerances are absolute, ~1e-7: masses can be ~1e-18).
    coverage = (mass - zeta[full ^ subsets]) / mass
    scaled_p = p / mass
    incidence = ((subsets[:, None] >> np.arange(tokens)[None, :]) & 1).astype(np.float64)
    # Variables (r, a, eps): stage 1 maximises sum a (a <= r, a <= p) with eps = 0; stage 2 maximises eps.
    zero = np.zeros((subsets.shape[0], tokens))
    polytope = np.hstack([incidence, zero, np.ones((subsets.shape[0], 1))])
    below_r = np.hstack([-np.eye(tokens), np.eye(tokens), np.zeros((tokens, 1))])
    equal = np.r_[np.ones(tokens), np.zeros(tokens), 0.0][None, :]
    bounds = [(0, None)] * tokens + [(0, float(x)) for x in scaled_p] + [(0, 0)]
    first = linprog(
        np.r_[np.zeros(tokens), -np.ones(tokens), 0.0],
        A_ub=np.vstack([polytope, below_r]),
        b_ub=np.r_[coverage, np.zeros(tokens)],
        A_eq=equal,
        b_eq=[1.0],
        bounds=bounds,
        method="highs",
        options=LP_OPTIONS,
    )
    if first.status != 0:  # not met in the tests; lossless anyway, the loss shows in the shortfall
        return _race(member, weight, np.zeros(tokens))[0]
    accepted = -first.fun
    keep = np.r_[np.zeros(tokens), -np.ones(tokens), 0.0][
        None, :
    ]  # sum a >= accepted (to the LP's tolerance)
    bounds[-1] = (0, 1.0)
    second = linprog(
        np.r_[np.zeros(2 * tokens), -1.0],
        A_ub=np.vstack([polytope, below_r, keep]),
        b_ub=np.r_[coverage, np.zeros(tokens), -accepted + 1e-9],
        A_eq=equal,
        b_eq=[1.0],
        bounds=bounds,
        method="highs",
        options=LP_OPTIONS,
    )
    target = np.maximum((second.x if second.status == 0 else first.x)[:tokens], 0.0)
    # Polish to round-off: the side of p the structure theorem asks for (r <= p when the class is selected less
    # often than p(C), else r >= p) holds exactly, the sum is 1; the moves are at the LP's tolerance, far
    # inside the margin of the deepest point.
    above = 1.0 <= scaled_p.sum()
    if above:
        target = np.minimum(target, scaled_p)
        room = scaled_p - target
        if room.sum() > 0:
            target = target + room * ((1.0 - target.sum()) / room.sum())
    else:
        target = np.maximum(target, scaled_p)
        room = target - scaled_p
        if room.sum() > 0:
            target = target - room * ((target.sum() - 1.0) / room.sum())
    # The singleton bounds (a token wins alone, or whenever drafted), in units of the class mass: HiGHS's
    # tolerance left targets 2.5e-10 above the most a token can win, which no weights reach.
    alone, drafted = _singleton_bounds(member, weight)
    target = _into_singleton_bounds(target, alone / mass, drafted / mass, scaled_p, above)
    target = np.maximum(target, 1e-300)
    return target * (mass / target.sum())


def _singleton_bounds(member: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per token, the probability that it is drafted alone and that it is drafted, with the class on top: the
    least and the most of the class's selection a token can win (the bounds of any race marginal)."""
    counts = member.T.astype(np.float64)
    return counts @ (weight * (member.sum(axis=1) == 1)), counts @ weight


def _into_singleton_bounds(target, low, high, p, above: bool) -> np.ndarray:
    r"""``target`` clipped into :math:`[\ell_y, h_y]` per token, the mass moved by the clip given back to the
    tokens with room, so that the sum is unchanged.

    The mass moved is the sum of the clipped amounts (each a difference of nearby numbers, exact to round-off),
    not ``sum - target.sum()``, which cancels. Tokens receive it in proportion to their room below
    :math:`\min(h, p)` (``above``: the side of ``p`` the acceptance needs) or give it in proportion to their
    room above :math:`\max(\ell, p)` (below the minimiser); when that room falls short, the room to the
    bound alone (lossless anyway: only the acceptance shows it). A room short of the excess by round-off only
    (a few ulps of the masses: the room exactly fills it, computed along another path) still counts as enough;
    its tokens then pass their side of ``p`` by that round-off.
    """
    clipped = np.minimum(np.maximum(target, low), high)
    moved = target - clipped
    excess = float(moved[moved > 0].sum()) - float(-moved[moved < 0].sum())  # clipped down minus raised
    if excess > 0:  # give the excess to tokens below their ceiling
        rooms = (np.minimum(high, p) if above else high) - clipped, high - clipped
    elif excess < 0:  # take the deficit from tokens above their floor
        rooms = clipped - (low if above else np.maximum(low, p)), clipped - low
    else:
        return clipped
    round_off = 4.0 * np.finfo(np.float64).eps * (1.0 + float(np.abs(clipped).sum()))
    for room in rooms:
        room = np.maximum(room, 0.0)
        total = float(room.sum())
        if total > 0.0 and total >= abs(excess) - round_off:
            return clipped + np.sign(excess) * room * (abs(excess) / total)
    # Room short of the excess (by round-off when the bounds are tight): all of it, the rest is restored by the
    # caller's normalisation. Returning ``clipped`` here lost 0.25 of mass when the room fell 6e-17 short.
    return clipped + np.sign(excess) * room


def _race(member: np.ndarray, weight: np.ndarray, log_weights: np.ndarray, hessian: bool = False):
    """Selection marginal of the race over the enumerated sets (and its Jacobian, and the potential Psi)."""
    logs = np.where(member, log_weights[None, :], -np.inf)
    top = logs.max(axis=1, keepdims=True)
    share = np.exp(logs - top)
    total = share.sum(axis=1, keepdims=True)
    share /= total
    r = weight @ share
    potential = float(weight @ (top[:, 0] + np.log(total[:, 0])))
    if not hessian:
        return r, potential
    jacobian = np.diag(r) - (share * weight[:, None]).T @ share
    return r, potential, jacobian


def _fit(member: np.ndarray, weight: np.ndarray, target: np.ndarray):
    """Log-weights whose race marginal is ``target`` and the exact marginal of the weights returned (the one
    :func:`_race` computes for them, alike with or without the Jacobian): the shared damped Newton
    (:func:`theory._race.newton_fit`) on the convex Psi - target . lambda, its logit step between the
    singleton bounds (a token wins alone, or whenever drafted). A token whose target is a 1e-167 share of its
    class's (tied in p/q with tokens of mass 1/3) is reached with the others: the plain Newton loop used
    before could not move its log-weight that far and stopped 8e-7 short on the others, so such tokens were
    set apart as losers (``DEAD_SHARE``); the shared loop needs no such rule."""
    alone, counts = _singleton_bounds(member, weight)
    return newton_fit(
        lambda lw: _race(member, weight, lw, hessian=True)[::2],
        lambda lw: _race(member, weight, lw)[1],
        target,
        np.log(target / np.maximum(counts, 1e-300)),
        (alone, counts),
        tolerance=TOLERANCE,
        max_iterations=MAX_ITERATIONS,
        max_halvings=MAX_HALVINGS,
    )
