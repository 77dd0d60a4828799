"""Length rules: what a rule sees after each drafted token, and the rules in use (fixed, heuristic,
SpecDec++ threshold, Kangaroo confidence, entropy stop)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from theory.checks import as_count, as_nonnegative, as_probabilities


@dataclass(frozen=True)
class DraftState:
    """What a length rule sees after ``drafted`` tokens of the current step.

    ``prob_all_accepted`` is the predicted probability that every drafted token is accepted, :math:`\\prod_{j
    \\le k} a_j` (1 when nothing is drafted); ``1 - prob_all_accepted`` is SpecDec++'s "probability that some
    drafted token is rejected". ``last_*`` describe the newest drafted token (``None`` before the first);
    ``next_acceptance`` is the mean acceptance of the next position (``None`` at the horizon).
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
    model's horizon) so that the chain is finite; :func:`evaluate_rule` uses its stationary law exactly.
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

    After drafting token ``k``, stop when :math:`1 - \\prod_{i \\le k} \\hat P_i > h`, with :math:`\\hat P_i`
    the acceptance-prediction head's output, here the model's acceptance of the token's bucket (a calibrated
    head). ``min_length`` / ``max_length`` are the paper's bounds ``[K_min, K_max]``. (The released code
    evaluates the head one token late; this is the paper's rule.)
    """
    threshold = float(as_probabilities(threshold, "threshold"))
    min_length, max_length = _bounds(min_length, max_length)
    return _SpecDecPP(min_length, max_length, threshold=threshold, name=f"SpecDec++ h={threshold:g}")


def kangaroo_confidence_stop(threshold: float = 0.6, *, max_length: int | None = 6) -> LengthRule:
    """Kangaroo's second early exit (Liu et al., NeurIPS 2024, arXiv:2404.18911).

    Draft greedily; after a token whose top-1 draft probability is below ``threshold`` (eta, 0.6 in the
    README), stop -- the low-confidence token is still verified -- or stop after ``max_length`` (gamma = 6)
    tokens. DEL's dynamic draft exit (arXiv:2504.05598) is the same rule with its threshold tau estimated
    online.
    """
    threshold = float(as_probabilities(threshold, "threshold"))
    _, max_length = _bounds(0, max_length)
    return _ConfidenceStop(0, max_length, threshold=threshold, name=f"Kangaroo eta={threshold:g}")


def entropy_stop(
    min_bound: float = 0.7, *, coefficient: float = 0.15, max_length: int | None = None
) -> LengthRule:
    """Entropy stop of SVIP (Zhang et al., EMNLP 2025, arXiv:2411.18462) and AdaEDL (arXiv:2410.18351).

    Both bound the acceptance of a token drafted from ``q`` by :math:`1 - \\sqrt{\\gamma H(q)}` (Pinsker plus
    a cross-entropy proxy, entropy in nats); drafting stops after the token for which the bound falls below
    ``min_bound``. SVIP: ``coefficient = 0.15``, ``min_bound = 1 - 0.3 = 0.7`` (stop when :math:`\\sqrt{0.15
    H} > 0.3`, i.e. H > 0.6 nats), cap 40. AdaEDL: ``coefficient = 0.2`` and its lambda as ``min_bound``. Not
    modelled: AdaEDL's look-ahead (it reads the entropy of the *next* position, paying one draft pass when it
    stops) and its online update of lambda.
    """
    min_bound = float(as_probabilities(min_bound, "min_bound"))
    coefficient = as_nonnegative(coefficient, "coefficient")
    _, max_length = _bounds(0, max_length)
    return _EntropyStop(
        0, max_length, min_bound=min_bound, coefficient=coefficient, name=f"entropy bound<{min_bound:g}"
    )
