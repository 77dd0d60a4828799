"""The SpecDec++ Markov decision process of adaptive draft length, solved exactly."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from theory.checks import as_count
from theory.length.evaluation import RuleEvaluation, evaluate_rule
from theory.length.models import AcceptanceModel, LengthCosts
from theory.length.rules import DraftState, _Memoryless


@dataclass(frozen=True)
class PolicyRow:
    """One state of the optimal policy's table: after ``drafted`` tokens with the given predicted
    probabilities."""

    drafted: int
    prob_all_accepted: float
    #: pi_k * mean acceptance of token k+1; kept instead of its complement so tiny values survive rounding
    next_acceptance_probability: float
    continue_drafting: bool

    @property
    def next_rejection_probability(self) -> float:
        """SpecDec++'s quantity: the probability that some token is rejected if one more is drafted."""
        return 1.0 - self.next_acceptance_probability


class _TableRule(_Memoryless):
    """Memoryless rule read from a table of (drafted, prob_all_accepted, continue) rows.

    The rule only sees ``(k, pi_k)``; within a length the nearest tabulated ``pi`` decides (states with equal
    ``pi`` share their decision, since the future depends on the past only through ``pi``).
    """

    name = "table rule"

    def __init__(self, rows: Iterable[PolicyRow]):
        by_length: dict = {}
        for row in rows:
            by_length.setdefault(row.drafted, []).append((row.prob_all_accepted, row.continue_drafting))
        lookup = {}
        for drafted, entries in by_length.items():
            entries.sort()
            lookup[drafted] = (np.array([e[0] for e in entries]), np.array([e[1] for e in entries]))
        object.__setattr__(self, "_lookup", lookup)  # LengthPolicy is a frozen dataclass

    def should_continue(self, state: DraftState, memory=None) -> bool:
        if state.drafted not in self._lookup:
            return False
        probs, decisions = self._lookup[state.drafted]
        position = int(np.searchsorted(probs, state.prob_all_accepted))
        candidates = [i for i in (position - 1, position) if 0 <= i < probs.shape[0]]
        nearest = min(candidates, key=lambda i: abs(probs[i] - state.prob_all_accepted))
        return bool(decisions[nearest])


@dataclass(frozen=True, eq=False)
class LengthPolicy(_TableRule):
    """The optimal draft-length policy of :func:`optimal_length_policy`; itself a :class:`LengthRule`.

    Attributes
    ----------
    table : tuple of PolicyRow
        The decision at every reachable state below the horizon (at the horizon the policy always stops).
    is_threshold_rule : bool
        Whether the table continues exactly on the states whose ``next_rejection_probability`` :math:`1 -
        \\prod_{j \\le k} a_j \\cdot \\bar a_{k+1}` is below :attr:`threshold` (checked on the table).
    threshold : float
        :math:`h^* = 1 - (t_{draft} + c_{discard}) / (\\lambda^* + c_{discard})`.
    rejection_threshold : float or None
        For stationary models (i.i.d., confidence buckets): the equivalent SpecDec++ ``h`` on the probability
        that some *drafted* token is rejected, :math:`1 - (1 - h^*)/\\bar a`; pass it to
        :func:`specdecpp_threshold` to reproduce the policy. ``None`` for per-position models.
    evaluation : RuleEvaluation
        Tokens per step, cost per step and per token (:math:`\\lambda^*`), speedup.
    iterations : int
        Dinkelbach iterations used.
    """

    table: tuple
    is_threshold_rule: bool
    threshold: float
    rejection_threshold: float | None
    evaluation: RuleEvaluation
    iterations: int
    name: str = "optimal (MDP)"

    def __post_init__(self):
        _TableRule.__init__(self, self.table)

    @property
    def tokens_per_step(self) -> float:
        return self.evaluation.tokens_per_step

    @property
    def cost_per_step(self) -> float:
        return self.evaluation.cost_per_step

    @property
    def cost_per_token(self) -> float:
        return self.evaluation.cost_per_token

    @property
    def speedup(self) -> float:
        return self.evaluation.speedup


def _reachable_states(model: AcceptanceModel) -> list[dict]:
    """Per length k, every reachable bucket-count vector and its predicted ``prob_all_accepted``."""
    levels = [{(): 1.0}]
    for drafted in range(model.horizon):
        law = model.law(drafted + 1)
        following: dict = {}
        for counts, prob in levels[-1].items():
            base = counts or (0,) * law.probability.shape[0]
            for bucket in np.flatnonzero(law.probability):
                key = base[:bucket] + (base[bucket] + 1,) + base[bucket + 1 :]
                following.setdefault(key, prob * law.acceptance[bucket])
        levels.append(following)
    return levels


def _parametric_decisions(
    model: AcceptanceModel, costs: LengthCosts, ratio: float, levels: list[dict]
) -> list:
    """Backward induction for ``min E[cost - ratio * tokens]`` over stopping rules; ties stop.

    Drafting token ``k+1`` in bucket ``b`` from a state with ``prob_all_accepted = pi`` adds
    ``t_draft + c_discard - (ratio + c_discard) * pi * a_b`` to the step's cost-minus-ratio-times-tokens.
    """
    per_token = costs.draft_time + costs.discard_cost
    gain = ratio + costs.discard_cost
    value_next: dict = {counts: 0.0 for counts in levels[-1]}
    decisions: list = [None] * model.horizon
    for drafted in range(model.horizon - 1, -1, -1):
        law = model.law(drafted + 1)
        value, decision = {}, {}
        for counts, prob in levels[drafted].items():
            base = counts or (0,) * law.probability.shape[0]
            continuation = 0.0
            for bucket in np.flatnonzero(law.probability):
                key = base[:bucket] + (base[bucket] + 1,) + base[bucket + 1 :]
                # pi * a first, as the table records it: gain * pi * a could stay a subnormal where pi * a
                # underflows to 0, and a row recorded at 0 would then continue (no threshold rule).
                continuation += law.probability[bucket] * (
                    per_token - gain * (prob * law.acceptance[bucket]) + value_next[key]
                )
            decision[counts] = continuation < 0.0
            value[counts] = min(0.0, continuation)
        decisions[drafted] = decision
        value_next = value
    return decisions


def optimal_length_policy(
    model: AcceptanceModel, costs: LengthCosts, *, max_iterations: int = 100
) -> LengthPolicy:
    """The stop/continue rule that minimises expected cost per generated token, solved exactly.

    SpecDec++ (Huang, Guo, Wang, arXiv:2405.19715) casts draft-length selection as a Markov decision process:
    after drafting ``k`` tokens the policy sees their predicted acceptances and chooses *stop* or *continue*;
    each drafted token costs ``draft_time``, each target call ``target_time`` and each discarded token
    ``discard_cost``. The state the policy needs is ``k`` and the probability that all drafted tokens are
    accepted, :math:`\\pi_k = \\prod_{j \\le k} a_j` (the bucket history matters only through it).

    The objective is a ratio, ``E[cost per step] / E[tokens per step]`` (renewal reward). It is solved with
    Dinkelbach's method: for a trial ratio :math:`\\lambda`, backward induction over the finite state space
    minimises :math:`g(\\lambda) = \\min_\\pi E[\\mathrm{cost} - \\lambda\\,\\mathrm{tokens}]`; the ratio of
    the minimiser becomes the next :math:`\\lambda`. The sequence decreases strictly and stops, after finitely
    many iterations (finitely many deterministic policies), at :math:`\\lambda^*` with :math:`g(\\lambda^*) =
    0`: the optimal cost per token.

    Why a threshold: drafting token ``k+1`` changes the parametric objective by :math:`t_{draft} + c_{discard}
    - (\\lambda^* + c_{discard})\\,\\pi_k \\bar a_{k+1}`. This one-step term only grows along a step
    (:math:`\\pi_k` cannot increase), so the problem is *monotone* and the one-step look-ahead rule is
    optimal: continue iff :math:`1 - \\pi_k \\bar a_{k+1} < h^*` with :math:`h^* = 1 - (t_{draft} +
    c_{discard})/(\\lambda^* + c_{discard})` -- a threshold on the probability that some token is rejected,
    the form of SpecDec++'s Theorem 3.1. The returned table is computed by the induction, not from this
    formula; :attr:`LengthPolicy.is_threshold_rule` checks the property on it.

    Parameters
    ----------
    model : IIDAcceptance, PositionalAcceptance or ConfidenceBuckets
    costs : LengthCosts
    max_iterations : int
        Bound on Dinkelbach iterations (a safeguard; a handful suffice).

    Returns
    -------
    LengthPolicy
    """
    if not isinstance(model, AcceptanceModel):
        raise ValueError(f"model must be an acceptance model (IIDAcceptance, ...), got {model!r}")
    if not isinstance(costs, LengthCosts):
        raise ValueError(f"costs must be a LengthCosts, got {costs!r}")
    max_iterations = as_count(max_iterations, "max_iterations")
    levels = _reachable_states(model)
    ratio = costs.target_time  # the ratio of never drafting: one target call per token
    for iteration in range(1, max_iterations + 1):  # noqa: B007 (reported after the loop)
        decisions = _parametric_decisions(model, costs, ratio, levels)
        rows = tuple(
            PolicyRow(
                k, float(prob), float(prob * model.law(k + 1).mean_acceptance), bool(decisions[k][counts])
            )
            for k in range(model.horizon)
            for counts, prob in levels[k].items()
        )
        evaluation = evaluate_rule(_TableRule(rows), model, costs)
        # Dinkelbach stops when the minimiser at ratio lambda has ratio lambda, i.e. g(lambda) = 0.
        if evaluation.cost_per_token >= ratio * (1.0 - 1e-12):
            break
        ratio = evaluation.cost_per_token
    threshold = 1.0 - (costs.draft_time + costs.discard_cost) / (
        evaluation.cost_per_token + costs.discard_cost
    )
    # A threshold rule on the rejection probability is one on the acceptance probability, compared exactly.
    go = [row.next_acceptance_probability for row in rows if row.continue_drafting]
    stop = [row.next_acceptance_probability for row in rows if not row.continue_drafting]
    mean_acceptance = model.law(1).mean_acceptance
    rejection_threshold = None
    if model.stationary and mean_acceptance > 0:
        rejection_threshold = 1.0 - (1.0 - threshold) / mean_acceptance
    return LengthPolicy(
        table=rows,
        is_threshold_rule=bool(not go or not stop or min(go) > max(stop)),
        threshold=threshold,
        rejection_threshold=rejection_threshold,
        evaluation=replace(evaluation, name="optimal (MDP)"),
        iterations=iteration,
    )
