"""Predict whether a peer's prompt lookup pays, from its measured ``t(n)`` and an acceptance measured elsewhere.

Prompt lookup decoding (Saxena 2023) drafts, at every step, the tokens that followed an earlier occurrence of
the context's last n-gram, at most ``K`` of them -- sometimes fewer (the match sits near the end of the
context) and sometimes none (no match: the step is a plain one-token pass). A step that drafts ``k`` tokens
verifies ``k + 1`` in one target pass of time :math:`t(k + 1)` and emits the accepted prefix plus one token.
Steps are renewals, so the decoding time per token is

.. math:: c_K = \\frac{E[t(k + 1)] + d}{E[\\tau_k]}, \\qquad
          E[\\tau_k] = \\sum_k P(k)\\,\\Big(1 + \\sum_{t=1}^{k} \\prod_{j \\le t} \\alpha_j\\Big)

(the per-position chain formula of Leviathan et al., ICML 2023, arXiv 2211.17192, Eq. 1, generalised to
per-position rates: :func:`theory.expected_tokens`), with ``P(k)`` the distribution of the drafted length,
:math:`\\alpha_j` the conditional acceptance of the ``j``-th drafted token given the ``j - 1`` before it were
accepted, and ``d`` the lookup's own time per step. Plain decoding costs :math:`c_0 = t(1)` per token, so the
predicted speedup is :math:`c_0 / c_K`. Both sides may pay a per-token overhead ``s`` (sampling, the Python
loop), added to each emitted token.

``P(k)`` and :math:`\\alpha_j` are measured by *our* prompt-lookup drafter on *other* prompts than the ones
predicted (:func:`held_out_prediction`: leave one prompt out). This assumes that the peer proposes the same
tokens as our drafter (the same rule: longest suffix n-gram first, its first earlier occurrence, the tokens
after it) and that its greedy text is the same as ours (true in float32; an approximation in 4-bit weights).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["LookupModel", "held_out_prediction", "lookup_model", "predict_speedup", "steps_of"]


class LookupModel:
    """``P(k)`` over drafted lengths ``0..K`` and the conditional acceptance ``alpha[j - 1]``, ``j = 1..K``."""

    def __init__(self, drafted: Sequence[float], alpha: Sequence[float]) -> None:
        drafted = np.asarray(drafted, dtype=np.float64)
        alpha = np.asarray(alpha, dtype=np.float64)
        if drafted.ndim != 1 or drafted.size < 1 or np.any(drafted < 0) or abs(drafted.sum() - 1) > 1e-9:
            raise ValueError(f"drafted must be a probability vector over lengths 0..K, got {drafted}")
        if alpha.shape != (drafted.size - 1,) or np.any((alpha < 0) | (alpha > 1)):
            raise ValueError(f"alpha must hold K = {drafted.size - 1} rates in [0, 1], got {alpha}")
        self.drafted = drafted
        self.alpha = alpha

    @property
    def max_length(self) -> int:
        return self.drafted.size - 1

    def expected_tokens(self) -> float:
        """:math:`E[\\tau_k]`: tokens emitted per step, bonus included."""
        from theory import expected_tokens

        return float(
            sum(p * expected_tokens(self.alpha, k) for k, p in enumerate(self.drafted) if p > 0 and k > 0)
            + self.drafted[0]
        )

    def to_json(self) -> dict:
        return {"drafted": self.drafted.tolist(), "alpha": self.alpha.tolist()}


def steps_of(result) -> list[tuple[int, int]]:
    """``(drafted, accepted)`` of every step of an :class:`executor.logs.GenerationResult`."""
    return [(step.n_drafted, step.n_accepted) for step in result.steps]


def lookup_model(steps: Sequence[tuple[int, int]], max_length: int) -> LookupModel:
    """The :class:`LookupModel` of observed steps ``(drafted, accepted)`` (drafts longer than ``max_length``
    are not allowed).

    :math:`\\alpha_j` = steps that accepted at least ``j`` / steps that drafted at least ``j`` and accepted at
    least ``j - 1`` (1 where no step reached position ``j``: it is then never used with positive weight).
    """
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be an integer >= 1, got {max_length!r}")
    array = np.asarray(steps, dtype=np.int64).reshape(-1, 2)
    if array.shape[0] == 0:
        raise ValueError("steps is empty")
    drafted, accepted = array[:, 0], array[:, 1]
    if np.any(drafted < 0) or np.any(drafted > max_length) or np.any((accepted < 0) | (accepted > drafted)):
        raise ValueError(f"steps must hold 0 <= accepted <= drafted <= {max_length}")
    histogram = np.bincount(drafted, minlength=max_length + 1) / drafted.size
    alpha = []
    for j in range(1, max_length + 1):
        reached = np.count_nonzero((drafted >= j) & (accepted >= j - 1))
        alpha.append(np.count_nonzero(accepted >= j) / reached if reached else 1.0)
    return LookupModel(histogram, alpha)


def _times(times: Mapping[int, float], needed: int) -> dict[int, float]:
    missing = [n for n in range(1, needed + 1) if n not in times]
    if missing:
        raise ValueError(f"times must give t(n) for n = 1..{needed}; missing {missing}")
    for n in range(1, needed + 1):
        if not np.isfinite(times[n]) or times[n] <= 0:
            raise ValueError(f"times must be positive seconds, got t({n}) = {times[n]!r}")
    return {n: float(times[n]) for n in range(1, needed + 1)}


def predict_speedup(
    times: Mapping[int, float], model: LookupModel, *, lookup_time: float = 0.0, token_time: float = 0.0
) -> dict:
    """Predicted decoding speedup of prompt lookup over plain decoding (module docstring).

    ``times[n]`` = :math:`t(n)` in seconds for ``n = 1 .. K + 1`` (e.g.
    :func:`experiments.profiling.profile_target_times` of a profile); ``lookup_time`` = ``d``, seconds of one
    lookup per step; ``token_time`` = ``s``, seconds per emitted token paid by both decoders. Returns the
    tokens per step, the seconds per token of both and their ratio ``speedup``.
    """
    for name, value in (("lookup_time", lookup_time), ("token_time", token_time)):
        if not np.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be non-negative seconds, got {value!r}")
    t = _times(times, model.max_length + 1)
    tokens = model.expected_tokens()
    step = sum(p * t[k + 1] for k, p in enumerate(model.drafted)) + lookup_time
    per_token = step / tokens + token_time
    plain = t[1] + token_time
    return {
        "tokens_per_step": tokens,
        "seconds_per_token": per_token,
        "plain_seconds_per_token": plain,
        "speedup": plain / per_token,
    }


def held_out_prediction(
    times: Mapping[int, float],
    steps_per_prompt: Sequence[Sequence[tuple[int, int]]],
    tokens_per_prompt: Sequence[int],
    max_length: int,
    *,
    lookup_time: float = 0.0,
    token_time: float = 0.0,
) -> dict:
    """Leave-one-out prediction over a prompt set: prompt ``i`` is predicted from the steps of the others.

    The predicted time of prompt ``i`` is its tokens times the predicted seconds per token; the set's speedup
    is the plain decoding time over the prompt-lookup time, both summed over the prompts (tokens/s over the
    set, as the bench reports it). Needs at least two prompts.
    """
    if len(steps_per_prompt) < 2 or len(steps_per_prompt) != len(tokens_per_prompt):
        raise ValueError("steps_per_prompt needs >= 2 prompts, one per entry of tokens_per_prompt")
    plain_total = lookup_total = 0.0
    per_prompt = []
    for i, tokens in enumerate(tokens_per_prompt):
        others = [s for j, steps in enumerate(steps_per_prompt) if j != i for s in steps]
        prediction = predict_speedup(
            times, lookup_model(others, max_length), lookup_time=lookup_time, token_time=token_time
        )
        plain_total += tokens * prediction["plain_seconds_per_token"]
        lookup_total += tokens * prediction["seconds_per_token"]
        per_prompt.append(prediction["speedup"])
    pooled = lookup_model([s for steps in steps_per_prompt for s in steps], max_length)
    return {
        "speedup": plain_total / lookup_total,
        "per_prompt": per_prompt,
        "model": pooled.to_json(),
    }
