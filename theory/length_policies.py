"""Adaptive draft length: the SpecDec++ Markov decision process, solved exactly, and the stopping rules in
use.

One speculative step drafts tokens one at a time; after each drafted token a *length rule* sees what the draft
model reveals (how many tokens are drafted, their predicted acceptance, the draft's confidence or entropy) and
chooses *stop* (call the target to verify) or *continue* (draft one more). The step yields the accepted prefix
plus one target-generated token. Costs per step (SpecDec++, Huang, Guo and Wang, arXiv:2405.19715, Section 3):

.. math:: \\mathrm{cost} = K\\,t_{draft} + t_{target} + c_{discard}\\,(K - A),

with ``K`` drafted and ``A`` accepted tokens. Steps are independent given the rule's memory, so by the
renewal-reward theorem the long-run cost per generated token is ``E[cost] / E[tokens]`` (averaged over the
stationary law of the memory for rules that carry one, such as the Hugging Face "heuristic" schedule).

Acceptance models (how the draft's signals and acceptances are distributed):

* :class:`IIDAcceptance` -- every drafted token is accepted with probability ``alpha`` (Leviathan et al.).
* :class:`PositionalAcceptance` -- token ``j`` is accepted with conditional probability ``alphas[j-1]``.
* :class:`ConfidenceBuckets` -- each drafted token falls in a confidence bucket ``b`` (i.i.d., with
  ``bucket_probabilities``), which the rule observes; its acceptance probability is
  ``acceptance_per_bucket[b]``.

Rules (:func:`fixed_length_rule`, :func:`heuristic_schedule`, :func:`specdecpp_threshold`,
:func:`kangaroo_confidence_stop`, :func:`entropy_stop`, the :func:`optimal_length_policy` itself) share one
small
interface (:class:`LengthRule`) and one exact evaluator, :func:`evaluate_rule`; :func:`simulate_rule` is
its Monte
Carlo twin. :func:`del_exit_choice` is DEL's joint choice of exit layer and draft length.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from numbers import Real
from typing import Protocol, runtime_checkable

import numpy as np

from theory.checks import as_count, as_distribution, as_nonnegative, as_probabilities

__all__ = [
    "ConfidenceBuckets",
    "DraftState",
    "ExitChoice",
    "IIDAcceptance",
    "LengthCosts",
    "LengthPolicy",
    "LengthRule",
    "PolicyRow",
    "PositionalAcceptance",
    "RuleEvaluation",
    "SimulationResult",
    "del_exit_choice",
    "entropy_stop",
    "evaluate_rule",
    "fixed_length_rule",
    "heuristic_schedule",
    "kangaroo_confidence_stop",
    "optimal_length_policy",
    "rank_rules",
    "simulate_rule",
    "specdecpp_threshold",
]

#: Default cap on the number of drafted tokens for models without a natural horizon.
DEFAULT_MAX_LENGTH = 32


# ---------------------------------------------------------------------------------------- acceptance models
@dataclass(frozen=True)
class _BucketLaw:
    """What the draft reveals at one position: bucket probabilities and, per bucket, its signals."""

    probability: np.ndarray
    acceptance: np.ndarray
    confidence: np.ndarray
    entropy: np.ndarray | None

    @property
    def mean_acceptance(self) -> float:
        return float(self.probability @ self.acceptance)


def _optional_signal(value, name: str, shape: tuple[int, ...], *, probability: bool) -> np.ndarray | None:
    if value is None:
        return None
    array = as_probabilities(value, name) if probability else np.asarray(value, dtype=np.float64)
    if array.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {array.shape}")
    if not probability and (not np.all(np.isfinite(array)) or np.any(array < 0)):
        raise ValueError(f"{name} must be finite and non-negative (entropies in nats)")
    return array


class AcceptanceModel:
    """Base of the acceptance models: a horizon and, per drafted position ``1..horizon``, a
    :class:`_BucketLaw`.

    A model is either *stationary* (the same law at every position) or has a single bucket per position; the
    evaluators rely on this to identify states by their bucket counts.
    """

    horizon: int
    stationary: bool

    def law(self, position: int) -> _BucketLaw:  # pragma: no cover - overridden
        raise NotImplementedError


class IIDAcceptance(AcceptanceModel):
    """Every drafted token is accepted with probability ``alpha`` given the previous ones were (Leviathan
    et al.).

    ``confidence`` (the draft's top-1 probability the rules observe) defaults to ``alpha``: the draft is
    assumed
    calibrated, as in EAGLE-2. ``entropy`` (nats) is only needed by :func:`entropy_stop`.
    """

    stationary = True

    def __init__(self, alpha: float, *, max_length: int = DEFAULT_MAX_LENGTH, confidence=None, entropy=None):
        if isinstance(alpha, bool) or not isinstance(alpha, Real):
            raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
        self.alpha = float(as_probabilities(alpha, "alpha"))
        self.horizon = as_count(max_length, "max_length")
        acceptance = np.array([self.alpha])
        self._law = _BucketLaw(
            probability=np.ones(1),
            acceptance=acceptance,
            confidence=acceptance
            if confidence is None
            else _optional_signal([confidence], "confidence", (1,), probability=True),
            entropy=_optional_signal(
                None if entropy is None else [entropy], "entropy", (1,), probability=False
            ),
        )

    def law(self, position: int) -> _BucketLaw:
        return self._law

    def __repr__(self) -> str:
        return f"IIDAcceptance(alpha={self.alpha:g}, max_length={self.horizon})"


class PositionalAcceptance(AcceptanceModel):
    """Token ``j`` is accepted with conditional probability ``alphas[j-1]`` (horizon = ``len(alphas)``).

    ``confidences`` default to ``alphas`` (calibrated draft); ``entropies`` (nats) are optional.
    """

    stationary = False

    def __init__(self, alphas, *, confidences=None, entropies=None):
        self.alphas = as_probabilities(alphas, "alphas")
        if self.alphas.ndim != 1 or self.alphas.shape[0] == 0:
            raise ValueError(f"alphas must be a non-empty 1-D vector, got shape {self.alphas.shape}")
        self.horizon = self.alphas.shape[0]
        shape = self.alphas.shape
        conf = _optional_signal(confidences, "confidences", shape, probability=True)
        conf = self.alphas if conf is None else conf
        ent = _optional_signal(entropies, "entropies", shape, probability=False)
        self._laws = [
            _BucketLaw(
                np.ones(1), self.alphas[j : j + 1], conf[j : j + 1], None if ent is None else ent[j : j + 1]
            )
            for j in range(self.horizon)
        ]

    def law(self, position: int) -> _BucketLaw:
        return self._laws[position - 1]

    def __repr__(self) -> str:
        return f"PositionalAcceptance(alphas={np.round(self.alphas, 4).tolist()})"


class ConfidenceBuckets(AcceptanceModel):
    """Each drafted token's confidence bucket is drawn i.i.d.; its acceptance depends on the bucket.

    Parameters
    ----------
    confidences : array_like, shape (B,)
        The draft's top-1 probability in each bucket (what Kangaroo's stop observes).
    acceptance_per_bucket : array_like, shape (B,)
        Probability that a token of that bucket is accepted (given its predecessors were).
    bucket_probabilities : array_like, shape (B,)
        Frequency of each bucket; a probability vector.
    entropies : array_like, shape (B,), optional
        Entropy of the draft distribution in each bucket, in nats (for :func:`entropy_stop`).
    max_length : int
        Cap on the number of drafted tokens.
    """

    stationary = True

    def __init__(
        self,
        confidences,
        acceptance_per_bucket,
        bucket_probabilities,
        *,
        entropies=None,
        max_length: int = DEFAULT_MAX_LENGTH,
    ):
        probability = as_distribution(bucket_probabilities, "bucket_probabilities")
        if probability.ndim != 1:
            raise ValueError(f"bucket_probabilities must be 1-D, got shape {probability.shape}")
        shape = probability.shape
        acceptance = _optional_signal(acceptance_per_bucket, "acceptance_per_bucket", shape, probability=True)
        confidence = _optional_signal(confidences, "confidences", shape, probability=True)
        self.horizon = as_count(max_length, "max_length")
        self._law = _BucketLaw(
            probability,
            acceptance,
            confidence,
            _optional_signal(entropies, "entropies", shape, probability=False),
        )

    def law(self, position: int) -> _BucketLaw:
        return self._law

    def __repr__(self) -> str:
        law = self._law
        return (
            f"ConfidenceBuckets(confidences={law.confidence.tolist()}, acceptance={law.acceptance.tolist()}, "
            f"probabilities={law.probability.tolist()}, max_length={self.horizon})"
        )


@dataclass(frozen=True)
class LengthCosts:
    """Costs of one speculative step: ``K * draft_time + target_time + discard_cost * (K - A)``.

    ``draft_time`` is one draft forward, ``target_time`` one target (verification) call, both > 0 for the
    target and >= 0 for the draft; ``discard_cost`` is SpecDec++'s extra penalty per drafted token that is
    thrown away (0 for pure wall time). Speedups are against plain decoding, which pays ``target_time`` per
    token.
    """

    draft_time: float
    target_time: float = 1.0
    discard_cost: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "draft_time", as_nonnegative(self.draft_time, "draft_time"))
        target = as_nonnegative(self.target_time, "target_time")
        if target == 0:
            raise ValueError("target_time must be positive (it is the unit of plain decoding)")
        object.__setattr__(self, "target_time", target)
        object.__setattr__(self, "discard_cost", as_nonnegative(self.discard_cost, "discard_cost"))

    def per_step(self, drafted: float, accepted: float) -> float:
        return drafted * self.draft_time + self.target_time + self.discard_cost * (drafted - accepted)


# ------------------------------------------------------------------------------------------------ the rules
@dataclass(frozen=True)
class DraftState:
    """What a length rule sees after ``drafted`` tokens of the current step.

    ``prob_all_accepted`` is the predicted probability that every drafted token is accepted,
    :math:`\\prod_{j \\le k} a_j` (1 when nothing is drafted); ``1 - prob_all_accepted`` is SpecDec++'s
    "probability that some drafted token is rejected". ``last_*`` describe the newest drafted token (``None``
    before the first); ``next_acceptance`` is the mean acceptance of the next position (``None`` at the
    horizon).
    """

    drafted: int
    prob_all_accepted: float
    last_acceptance: float | None
    last_confidence: float | None
    last_entropy: float | None
    next_acceptance: float | None


@runtime_checkable
class LengthRule(Protocol):
    """A draft-length rule: a stop/continue decision per drafted token and an optional memory across steps.

    Memoryless rules use ``initial_memory = None`` and return ``None`` from ``next_memory``. Rules that adapt
    (the Hugging Face schedule) keep a finite memory that evolves with the outcome of each step; the evaluator
    averages over its stationary law. Evaluation always stops at the model's horizon.
    """

    name: str
    initial_memory: Hashable

    def should_continue(self, state: DraftState, memory: Hashable) -> bool: ...

    def next_memory(self, memory: Hashable, drafted: int, all_accepted: bool, horizon: int) -> Hashable: ...


class _Memoryless:
    initial_memory = None

    def next_memory(self, memory, drafted, all_accepted, horizon):
        return None


@dataclass(frozen=True)
class _FixedLength(_Memoryless):
    length: int
    name: str = ""

    def should_continue(self, state, memory):
        return state.drafted < self.length


@dataclass(frozen=True)
class _HeuristicSchedule:
    start: int
    increase: int
    decrease: int
    minimum: int
    maximum: int | None
    name: str = ""

    @property
    def initial_memory(self):
        return self.start

    def should_continue(self, state, memory):
        return state.drafted < memory

    def next_memory(self, memory, drafted, all_accepted, horizon):
        # The schedule is a Markov chain over K; it is capped so that the chain is finite.
        cap = min(horizon, self.maximum) if self.maximum is not None else horizon
        proposed = memory + self.increase if all_accepted else memory - self.decrease
        return int(min(max(proposed, self.minimum), max(cap, self.minimum)))


@dataclass(frozen=True)
class _Bounded(_Memoryless):
    """A stop criterion on the newest state, with SpecDec++-style bounds ``min_length <= K <= max_length``."""

    min_length: int
    max_length: int | None

    def should_continue(self, state, memory):
        if state.drafted < self.min_length:
            return True
        if self.max_length is not None and state.drafted >= self.max_length:
            return False
        return state.drafted == 0 or not self.stops(state)


@dataclass(frozen=True)
class _SpecDecPP(_Bounded):
    threshold: float = 0.0
    name: str = ""

    def stops(self, state):
        return 1.0 - state.prob_all_accepted > self.threshold


@dataclass(frozen=True)
class _ConfidenceStop(_Bounded):
    threshold: float = 0.0
    name: str = ""

    def stops(self, state):
        return state.last_confidence < self.threshold


@dataclass(frozen=True)
class _EntropyStop(_Bounded):
    min_bound: float = 0.0
    coefficient: float = 0.15
    name: str = ""

    def stops(self, state):
        if state.last_entropy is None:
            raise ValueError("entropy_stop needs an acceptance model with entropies (pass entropies=...)")
        return 1.0 - np.sqrt(self.coefficient * state.last_entropy) < self.min_bound


def _bounds(min_length: int, max_length: int | None) -> tuple[int, int | None]:
    min_length = as_count(min_length, "min_length", minimum=0)
    if max_length is not None:
        max_length = as_count(max_length, "max_length")
        if max_length < min_length:
            raise ValueError(f"max_length ({max_length}) must be at least min_length ({min_length})")
    return min_length, max_length


def fixed_length_rule(length: int) -> LengthRule:
    """Draft exactly ``length`` tokens (``K``) every step, as in Leviathan et al. (arXiv:2211.17192)."""
    length = as_count(length, "length", minimum=0)
    return _FixedLength(length, name=f"fixed K={length}")


def heuristic_schedule(
    start: int = 5, *, increase: int = 2, decrease: int = 1, minimum: int = 1, maximum: int | None = None
) -> LengthRule:
    """Hugging Face assisted generation's "heuristic" schedule: a Markov chain over the draft length ``K``.

    Draft ``K`` tokens; next step ``K + increase`` if all were accepted, else ``max(minimum, K - decrease)``
    (transformers ``num_assistant_tokens_schedule="heuristic"``: start 5, +2, -1, floor 1; the baseline of
    SpecDec++, arXiv:2405.19715, and SVIP, arXiv:2411.18462). ``K`` is capped at ``maximum`` (default: the
    model's
    horizon) so that the chain is finite; :func:`evaluate_rule` uses its stationary law exactly.
    """
    start = as_count(start, "start")
    increase = as_count(increase, "increase", minimum=0)
    decrease = as_count(decrease, "decrease", minimum=0)
    minimum = as_count(minimum, "minimum")
    if maximum is not None:
        maximum = as_count(maximum, "maximum")
    return _HeuristicSchedule(start, increase, decrease, minimum, maximum, name="heuristic (+2/-1)")


def specdecpp_threshold(
    threshold: float, *, min_length: int = 0, max_length: int | None = None
) -> LengthRule:
    """SpecDec++ (Huang, Guo, Wang, arXiv:2405.19715): stop once the predicted rejection probability
    exceeds h.

    After drafting token ``k``, stop when :math:`1 - \\prod_{i \\le k} \\hat P_i > h`, with :math:`\\hat
    P_i` the
    acceptance-prediction head's output, here the model's acceptance of the token's bucket (a calibrated
    head).
    ``min_length`` / ``max_length`` are the paper's bounds ``[K_min, K_max]``. (The released code evaluates
    the
    head one token late; this is the paper's rule.)
    """
    threshold = float(as_probabilities(threshold, "threshold"))
    min_length, max_length = _bounds(min_length, max_length)
    return _SpecDecPP(min_length, max_length, threshold=threshold, name=f"SpecDec++ h={threshold:g}")


def kangaroo_confidence_stop(threshold: float = 0.6, *, max_length: int | None = 6) -> LengthRule:
    """Kangaroo's second early exit (Liu et al., NeurIPS 2024, arXiv:2404.18911).

    Draft greedily; after a token whose top-1 draft probability is below ``threshold`` (eta, 0.6 in the
    README),
    stop -- the low-confidence token is still verified -- or stop after ``max_length`` (gamma = 6) tokens.
    DEL's
    dynamic draft exit (arXiv:2504.05598) is the same rule with its threshold tau estimated online.
    """
    threshold = float(as_probabilities(threshold, "threshold"))
    _, max_length = _bounds(0, max_length)
    return _ConfidenceStop(0, max_length, threshold=threshold, name=f"Kangaroo eta={threshold:g}")


def entropy_stop(
    min_bound: float = 0.7, *, coefficient: float = 0.15, max_length: int | None = None
) -> LengthRule:
    """Entropy stop of SVIP (Zhang et al., EMNLP 2025, arXiv:2411.18462) and AdaEDL (arXiv:2410.18351).

    Both bound the acceptance of a token drafted from ``q`` by :math:`1 - \\sqrt{\\gamma H(q)}` (Pinsker
    plus a
    cross-entropy proxy, entropy in nats); drafting stops after the token for which the bound falls below
    ``min_bound``. SVIP: ``coefficient = 0.15``, ``min_bound = 1 - 0.3 = 0.7`` (stop when
    :math:`\\sqrt{0.15 H} > 0.3`, i.e. H > 0.6 nats), cap 40. AdaEDL: ``coefficient = 0.2`` and its lambda as
    ``min_bound``. Not modelled: AdaEDL's look-ahead (it reads the entropy of the *next* position, paying one
    draft pass when it stops) and its online update of lambda.
    """
    min_bound = float(as_probabilities(min_bound, "min_bound"))
    coefficient = as_nonnegative(coefficient, "coefficient")
    _, max_length = _bounds(0, max_length)
    return _EntropyStop(
        0, max_length, min_bound=min_bound, coefficient=coefficient, name=f"entropy bound<{min_bound:g}"
    )


# ----------------------------------------------------------------------------------------- exact evaluation
@dataclass(frozen=True)
class RuleEvaluation:
    """Long-run performance of a rule: per-step means, cost per generated token and speedup over plain
    decoding."""

    name: str
    tokens_per_step: float
    drafted_per_step: float
    cost_per_step: float
    cost_per_token: float
    speedup: float


@dataclass
class _StepStatistics:
    drafted: float = 0.0
    accepted: float = 0.0
    # (drafted K, all accepted?) -> probability that the step ends that way
    outcomes: dict = field(default_factory=dict)


def _state(model: AcceptanceModel, drafted: int, prob: float, last: int | None) -> DraftState:
    if last is None:
        last_acceptance = last_confidence = last_entropy = None
    else:
        law = model.law(drafted)
        last_acceptance = float(law.acceptance[last])
        last_confidence = float(law.confidence[last])
        last_entropy = None if law.entropy is None else float(law.entropy[last])
    next_acceptance = model.law(drafted + 1).mean_acceptance if drafted < model.horizon else None
    return DraftState(drafted, prob, last_acceptance, last_confidence, last_entropy, next_acceptance)


def _step_statistics(rule: LengthRule, memory, model: AcceptanceModel) -> _StepStatistics:
    """Exact per-step means for one memory value, by forward enumeration of the reachable draft states.

    States are merged by (bucket counts, newest bucket): for a stationary model the counts fix the predicted
    probability that all drafted tokens are accepted, and a one-bucket-per-position model has one state per
    length. Each drafted token ``j`` adds its survival probability :math:`\\prod_{i \\le j} a_i` to the
    expected
    number of accepted tokens.
    """
    stats = _StepStatistics()
    level = {(None, None): (1.0, 1.0)}  # (counts, newest bucket) -> (probability mass, prob_all_accepted)
    for drafted in range(model.horizon + 1):
        following: dict = {}
        law = model.law(drafted + 1) if drafted < model.horizon else None
        for (counts, last), (mass, prob) in level.items():
            state = _state(model, drafted, prob, last)
            if law is None or not rule.should_continue(state, memory):
                for all_accepted, weight in ((True, prob), (False, 1.0 - prob)):
                    key = (drafted, all_accepted)
                    stats.outcomes[key] = stats.outcomes.get(key, 0.0) + mass * weight
                continue
            base = counts if counts is not None else (0,) * law.probability.shape[0]
            for bucket in np.flatnonzero(law.probability):
                branch = mass * law.probability[bucket]
                survival = prob * law.acceptance[bucket]
                stats.drafted += branch
                stats.accepted += branch * survival
                key = (base[:bucket] + (base[bucket] + 1,) + base[bucket + 1 :], int(bucket))
                previous_mass, _ = following.get(key, (0.0, survival))
                following[key] = (previous_mass + branch, survival)
        level = following
    return stats


def _stationary_law(transition: np.ndarray) -> np.ndarray:
    """The stationary distribution of a finite unichain transition matrix (rows sum to 1)."""
    size = transition.shape[0]
    system = np.vstack([transition.T - np.eye(size), np.ones((1, size))])
    rhs = np.concatenate([np.zeros(size), [1.0]])
    law, *_ = np.linalg.lstsq(system, rhs, rcond=None)
    law = np.clip(law, 0.0, None)
    return law / law.sum()


def evaluate_rule(rule: LengthRule, model: AcceptanceModel, costs: LengthCosts) -> RuleEvaluation:
    """Exact long-run tokens per step, cost per step, cost per token and speedup of ``rule`` under ``model``.

    A memoryless rule's steps are i.i.d., so by the renewal-reward theorem the cost per token is
    ``E[cost] / E[tokens]``. For a rule with memory (a Markov chain over its finite memory values reached from
    ``initial_memory``), the expectations are taken under the chain's stationary law. Tokens per step count
    the
    target's bonus/correction token (plain decoding = 1).
    """
    if not isinstance(rule, LengthRule):
        raise ValueError(f"rule must implement the LengthRule interface, got {rule!r}")
    if not isinstance(model, AcceptanceModel):
        raise ValueError(f"model must be an acceptance model (IIDAcceptance, ...), got {model!r}")
    if not isinstance(costs, LengthCosts):
        raise ValueError(f"costs must be a LengthCosts, got {costs!r}")
    memories = [rule.initial_memory]
    index = {rule.initial_memory: 0}
    statistics = []
    edges = []
    while len(statistics) < len(memories):
        memory = memories[len(statistics)]
        stats = _step_statistics(rule, memory, model)
        statistics.append(stats)
        for (drafted, all_accepted), weight in stats.outcomes.items():
            successor = rule.next_memory(memory, drafted, all_accepted, model.horizon)
            if successor not in index:
                index[successor] = len(memories)
                memories.append(successor)
            edges.append((index[memory], index[successor], weight))
    transition = np.zeros((len(memories), len(memories)))
    for source, target, weight in edges:
        transition[source, target] += weight
    weights = _stationary_law(transition) if len(memories) > 1 else np.ones(1)
    drafted = float(weights @ [s.drafted for s in statistics])
    accepted = float(weights @ [s.accepted for s in statistics])
    tokens = 1.0 + accepted
    cost = costs.per_step(drafted, accepted)
    return RuleEvaluation(
        name=getattr(rule, "name", type(rule).__name__),
        tokens_per_step=tokens,
        drafted_per_step=drafted,
        cost_per_step=cost,
        cost_per_token=cost / tokens,
        speedup=costs.target_time * tokens / cost,
    )


def rank_rules(
    rules: Iterable[LengthRule], model: AcceptanceModel, costs: LengthCosts
) -> list[RuleEvaluation]:
    """Evaluate every rule exactly and return the evaluations from the cheapest cost per token up."""
    return sorted((evaluate_rule(rule, model, costs) for rule in rules), key=lambda e: e.cost_per_token)


# ----------------------------------------------------------------------------------------- Monte Carlo twin
@dataclass(frozen=True)
class SimulationResult:
    """Per-step samples of a simulated rule: ``tokens[i]`` and ``cost[i]`` for step ``i``."""

    tokens: np.ndarray
    cost: np.ndarray

    @property
    def tokens_per_step(self) -> float:
        return float(self.tokens.mean())

    @property
    def cost_per_token(self) -> float:
        return float(self.cost.sum() / self.tokens.sum())


def simulate_rule(
    rule: LengthRule, model: AcceptanceModel, costs: LengthCosts, *, steps: int, rng: np.random.Generator
) -> SimulationResult:
    """Run ``rule`` for ``steps`` speculative steps, drawing buckets and acceptances with ``rng``.

    Each drafted token's bucket is drawn from the model's law at its position; it is accepted with its
    bucket's acceptance probability if all earlier tokens of the step were. The rule sees the same
    :class:`DraftState` as in :func:`evaluate_rule`. Used to check the exact evaluation.
    """
    steps = as_count(steps, "steps")
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {rng!r}")
    tokens = np.empty(steps)
    cost = np.empty(steps)
    memory = rule.initial_memory
    for step in range(steps):
        drafted, accepted, prob, last, alive = 0, 0, 1.0, None, True
        while drafted < model.horizon and rule.should_continue(_state(model, drafted, prob, last), memory):
            law = model.law(drafted + 1)
            last = int(rng.choice(law.probability.shape[0], p=law.probability))
            prob *= law.acceptance[last]
            drafted += 1
            alive = alive and rng.random() < law.acceptance[last]
            accepted += alive
        tokens[step] = 1 + accepted
        cost[step] = costs.per_step(drafted, accepted)
        memory = rule.next_memory(memory, drafted, accepted == drafted, model.horizon)
    return SimulationResult(tokens, cost)


# ------------------------------------------------------------------------ the SpecDec++ MDP, solved exactly
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
        Whether the table continues exactly on the states whose ``next_rejection_probability``
        :math:`1 - \\prod_{j \\le k} a_j \\cdot \\bar a_{k+1}` is below :attr:`threshold` (checked on the
        table).
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
                continuation += law.probability[bucket] * (
                    per_token - gain * prob * law.acceptance[bucket] + value_next[key]
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
    minimises :math:`g(\\lambda) = \\min_\\pi E[\\mathrm{cost} - \\lambda\\,\\mathrm{tokens}]`; the ratio
    of the
    minimiser becomes the next :math:`\\lambda`. The sequence decreases strictly and stops, after finitely
    many
    iterations (finitely many deterministic policies), at :math:`\\lambda^*` with :math:`g(\\lambda^*) = 0`:
    the optimal cost per token.

    Why a threshold: drafting token ``k+1`` changes the parametric objective by
    :math:`t_{draft} + c_{discard} - (\\lambda^* + c_{discard})\\,\\pi_k \\bar a_{k+1}`. This one-step term
    only
    grows along a step (:math:`\\pi_k` cannot increase), so the problem is *monotone* and the one-step
    look-ahead rule is optimal: continue iff :math:`1 - \\pi_k \\bar a_{k+1} < h^*` with
    :math:`h^* = 1 - (t_{draft} + c_{discard})/(\\lambda^* + c_{discard})` -- a threshold on the probability
    that some token is rejected, the form of SpecDec++'s Theorem 3.1. The returned table is computed by the
    induction, not from this formula; :attr:`LengthPolicy.is_threshold_rule` checks the property on it.

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


# ---------------------------------------------------------------------------------------- DEL's exit choice
@dataclass(frozen=True)
class ExitChoice:
    """DEL's choice: the exit layer and draft length with the most tokens per layer evaluated.

    ``tokens_per_layer[layer][gamma]`` is the TPL table; ``evaluation`` is the chosen pair's
    :class:`RuleEvaluation` (costs in layer-time units, speedup against the full model).
    """

    exit_layer: int
    gamma: int
    evaluation: RuleEvaluation
    tokens_per_layer: dict


def del_exit_choice(
    layer_models: Mapping[int, AcceptanceModel | float],
    n_layers: int,
    *,
    max_gamma: int = 18,
    layer_time: float = 1.0,
    discard_cost: float = 0.0,
) -> ExitChoice:
    """DEL's joint choice of exit layer and draft length (Zarch et al., COLM 2025, arXiv:2504.05598).

    Drafting with the first ``l`` of ``L = n_layers`` layers costs ``l`` layer passes per token and the
    verification ``L``; DEL picks :math:`(l^*, \\gamma^*) = \\arg\\max TPL(l, \\gamma)` over
    :math:`\\gamma \\in \\{0, \\dots, \\gamma_{max} - 1\\}` with the tokens-per-layer criterion

    .. math:: TPL(l, \\gamma) = \\frac{\\tau(\\alpha_l, \\gamma)}{\\gamma l + L},

    i.e. Leviathan's model with :math:`c = l/L`. Here :math:`\\tau` is evaluated exactly under each exit
    layer's
    acceptance model (a float means :class:`IIDAcceptance`), so per-position profiles are allowed. Ties go to
    the shallower layer, then the shorter draft.
    """
    n_layers = as_count(n_layers, "n_layers", minimum=2)
    max_gamma = as_count(max_gamma, "max_gamma")
    layer_time = as_nonnegative(layer_time, "layer_time")
    if layer_time == 0:
        raise ValueError("layer_time must be positive")
    if not isinstance(layer_models, Mapping) or not layer_models:
        raise ValueError("layer_models must be a non-empty mapping from exit layer to acceptance model")
    table: dict = {}
    best = None
    for layer in sorted(layer_models):
        layer = as_count(layer, "exit layer")
        if layer >= n_layers:
            raise ValueError(f"exit layer {layer} must be below n_layers = {n_layers}")
        model = layer_models[layer]
        if not isinstance(model, AcceptanceModel):
            model = IIDAcceptance(model, max_length=max(1, max_gamma - 1))
        costs = LengthCosts(layer * layer_time, n_layers * layer_time, discard_cost)
        table[layer] = {}
        for gamma in range(min(max_gamma - 1, model.horizon) + 1):
            evaluation = evaluate_rule(fixed_length_rule(gamma), model, costs)
            table[layer][gamma] = layer_time / evaluation.cost_per_token
            if best is None or evaluation.cost_per_token < best[2].cost_per_token * (1 - 1e-12):
                best = (layer, gamma, evaluation)
    layer, gamma, evaluation = best
    return ExitChoice(layer, gamma, replace(evaluation, name=f"DEL exit l={layer}, K={gamma}"), table)
