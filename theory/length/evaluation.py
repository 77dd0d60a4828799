"""Exact evaluation of a length rule by renewal-reward, and its Monte Carlo twin."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from theory.checks import as_count
from theory.length.models import AcceptanceModel, LengthCosts
from theory.length.rules import DraftState, LengthRule


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
    expected number of accepted tokens.
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

    A memoryless rule's steps are i.i.d., so by the renewal-reward theorem the cost per token is ``E[cost] /
    E[tokens]``. For a rule with memory (a Markov chain over its finite memory values reached from
    ``initial_memory``), the expectations are taken under the chain's stationary law. Tokens per step count
    the target's bonus/correction token (plain decoding = 1).
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
