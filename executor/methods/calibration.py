"""Measurements on calibration prompts that the methods' theory needs: per-layer exit agreement, acceptance
vectors and forward-pass costs.

:func:`exit_profile` runs the target once over a prompt and its continuation with a forward hook on every
decoder layer, so each layer's exit prediction (final norm and LM head on its hidden state: LayerSkip's early
exit, Elhoushi et al., ACL 2024, arXiv 2404.16710) is read from the *same* forward pass as the final one.
For each continuation position ``t`` and exit layer ``l`` it returns

* ``match[l, t]`` = 1 if the exit argmax equals the final argmax (greedy acceptance),
* ``accept[l, t]`` = :math:`\\sum_x \\min(p_t(x), q_{l,t}(x))` at the sampling temperature (the acceptance
  probability of speculative sampling, Leviathan et al., ICML 2023; equals ``match`` at temperature 0),
* ``confidence[l, t]`` = the exit distribution's top probability at temperature 1 (Kangaroo's signal),
* ``rank[l, t]`` = rank of the final argmax in the exit distribution (Sequoia's positional acceptance at
  temperature 0: the ``k``-th child is accepted iff the rank is ``k - 1``).

:func:`depth_acceptance` estimates, from the step logs of any tree (or chain) decoding, the acceptance of the
``k``-th child at depth ``d`` given that its parent was accepted: the per-depth table the tree methods'
predictions read (:func:`theory.tree_expected_tokens`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from executor.sampling import logits_to_probs
from theory.checks import as_count

__all__ = [
    "DepthAcceptance",
    "ExitProfile",
    "continuation",
    "default_exit_head",
    "depth_acceptance",
    "exit_profile",
    "forward_time_ratio",
    "model_key",
    "positional_acceptance",
    "run_lengths",
]

#: ``head(layer, hidden) -> logits``: the exit head of ``layer`` (the shared final norm + LM head by default).
ExitHead = Callable[[int, torch.Tensor], torch.Tensor]


def default_exit_head(model) -> ExitHead:
    """The untrained early exit: the model's final RMSNorm and (tied) LM head on any layer's hidden state."""
    weight = model.tok_embeddings.weight if model.output is None else model.output.weight

    def head(layer: int, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(model.norm(hidden), weight).float()

    return head


@dataclass
class ExitProfile:
    """Per exit layer (rows, in ``layers`` order) and continuation position (columns) statistics."""

    layers: list[int]
    match: np.ndarray
    accept: np.ndarray
    confidence: np.ndarray
    rank: np.ndarray

    def row(self, layer: int) -> int:
        return self.layers.index(layer)

    @staticmethod
    def concatenate(profiles: Sequence[ExitProfile]) -> ExitProfile:
        first = profiles[0]
        return ExitProfile(
            first.layers,
            *(np.concatenate([getattr(p, k) for p in profiles], axis=1) for k in ("match", "accept")),
            np.concatenate([p.confidence for p in profiles], axis=1),
            np.concatenate([p.rank for p in profiles], axis=1),
        )


_CONTINUATIONS: dict = {}


def model_key(model) -> tuple:
    """A key for memoising measurements on ``model``: its identity and two weight checksums (a model whose
    weights changed in place gets a new key)."""
    return (id(model), float(model.norm.weight.sum()), float(model.tok_embeddings.weight[0].sum()))


def continuation(
    model, prompt_ids: list[int], max_new_tokens: int, temperature: float, seed: int
) -> list[int]:
    """Plain decoding's continuation (greedy at temperature 0, sampled otherwise) used as calibration text.

    Memoised per (model, prompt, length, temperature, seed): several methods calibrate on the same text.
    """
    from executor.decoders import AutoregressiveDecoder, Sampling

    key = (model_key(model), tuple(prompt_ids), max_new_tokens, float(temperature), seed)
    if key in _CONTINUATIONS:
        return list(_CONTINUATIONS[key])

    decoder = AutoregressiveDecoder(model, sampling=Sampling(temperature=temperature))
    generator = torch.Generator(device=model.tok_embeddings.weight.device).manual_seed(seed)
    tokens = decoder.generate(prompt_ids, max_new_tokens, generator=generator).token_ids
    _CONTINUATIONS[key] = list(tokens)
    return tokens


def exit_profile(
    model,
    tokens: list[int],
    start: int,
    layers: Sequence[int],
    temperature: float = 0.0,
    head: ExitHead | None = None,
    max_rank: int = 64,
) -> ExitProfile:
    """Exit statistics of ``layers`` at the positions predicting ``tokens[start:]`` (one forward pass).

    ``layers`` are exit layers in ``[1, n_layers)`` (the number of layers run before the exit head).
    """
    if not 1 <= start < len(tokens):
        raise ValueError(f"start must be in [1, {len(tokens)}), got {start}")
    head = default_exit_head(model) if head is None else head
    captured: dict[int, torch.Tensor] = {}
    handles = [
        model.layers[layer - 1].register_forward_hook(
            lambda module, args, output, layer=layer: captured.__setitem__(layer, output)
        )
        for layer in layers
    ]
    try:
        with torch.no_grad():
            model.setup_cache(len(tokens))
            final = model(torch.tensor([tokens]), torch.arange(len(tokens)))[0, start - 1 : -1]
    finally:
        for handle in handles:
            handle.remove()
    target = final.argmax(-1)
    p = logits_to_probs(final, temperature) if temperature > 0 else None
    rows = {k: [] for k in ("match", "accept", "confidence", "rank")}
    with torch.no_grad():
        for layer in layers:
            logits = head(layer, captured[layer][0, start - 1 : -1])
            match = (logits.argmax(-1) == target).double()
            rows["match"].append(match.numpy())
            if p is None:
                rows["accept"].append(match.numpy())
            else:
                q = logits_to_probs(logits, temperature)
                rows["accept"].append(torch.minimum(p, q).sum(-1).double().numpy())
            rows["confidence"].append(logits.softmax(-1).max(-1).values.double().numpy())
            better = (logits > logits.gather(-1, target[:, None])).sum(-1)
            rows["rank"].append(better.clamp_max(max_rank).numpy())
    return ExitProfile(list(layers), *(np.stack(rows[k]) for k in ("match", "accept", "confidence", "rank")))


def run_lengths(match: np.ndarray) -> np.ndarray:
    """For each position, how many consecutive matches start there (greedy chain accepted length, no cap)."""
    out = np.zeros(match.shape[-1], dtype=np.int64)
    count = 0
    for t in range(match.shape[-1] - 1, -1, -1):
        count = count + 1 if match[t] else 0
        out[t] = count
    return out


def positional_acceptance(runs: np.ndarray, gamma: int) -> np.ndarray:
    """Conditional acceptance of chain positions ``1..gamma`` from run lengths: P(run >= j | run >= j - 1)."""
    alphas = []
    for j in range(1, gamma + 1):
        reached = np.sum(runs >= j - 1)
        alphas.append(float(np.sum(runs >= j) / reached) if reached else 0.0)
    return np.array(alphas)


def forward_time_ratio(
    model, exit_layer: int | None, tokens: int = 1, repeats: int = 5, context: int = 64
) -> float:
    """Seconds of a pass over ``tokens`` new positions through ``exit_layer`` layers (and the head) divided by
    a full one-token pass, timed interleaved (median of ``repeats``) so machine load affects both alike."""
    device = model.tok_embeddings.weight.device
    model.setup_cache(context + tokens + 1)
    ids = torch.zeros(1, context, dtype=torch.long, device=device)
    with torch.no_grad():
        model(ids, torch.arange(context, device=device))
        ratios = []
        for _ in range(repeats):
            start = time.perf_counter()
            model(ids[:, :1], torch.tensor([context], device=device))
            full = time.perf_counter() - start
            start = time.perf_counter()
            model(
                ids[:, :tokens], torch.arange(context, context + tokens, device=device), exit_layer=exit_layer
            )
            part = time.perf_counter() - start
            ratios.append(part / full)
    return float(np.median(ratios))


#: Fewest trials (steps whose accepted path reached a parent at depth ``d - 1`` that had children) for the
#: acceptance at depth ``d`` to be estimated on its own; shallower than that, deeper depths are pooled.
#: With 5 trials a proportion's standard error is at most 0.22, about the fall in acceptance from one depth to
#: the next that the estimate must resolve; the a-priori loop's calibration uses the same count
#: (``experiments.apriori.calibrate.MIN_EVENTS``). The predictions move little with it (1, 3 or 5 change the
#: quick run's predicted tau by at most 0.22); the number of calibration steps is what limits them.
MIN_DEPTH_SAMPLES = 5


@dataclass(frozen=True)
class DepthAcceptance:
    """Acceptance by depth and sibling rank, estimated by :func:`depth_acceptance`.

    Attributes
    ----------
    table : numpy.ndarray
        ``(max_depth, width)``: ``table[d-1, k-1]`` = P(the ``k``-th child at depth ``d`` is the accepted one |
        its parent was accepted), after pooling; the per-depth acceptance of :func:`theory.tree_expected_tokens`.
    accepted, trials : numpy.ndarray
        ``(max_depth, width)`` counts before pooling: times the ``k``-th child at depth ``d`` was accepted, and
        times the accepted path reached a depth-``d - 1`` node with at least ``k`` children.
    pooled_from : int
        The first depth (1-based) whose row is pooled with every deeper one; ``max_depth + 1`` if none is.
    """

    table: np.ndarray
    accepted: np.ndarray
    trials: np.ndarray
    pooled_from: int

    @property
    def by_depth(self) -> list[float]:
        """P(some child accepted | the parent accepted and has ``width`` children), per depth: row sums."""
        return self.table.sum(axis=1).tolist()

    def details(self) -> dict:
        """JSON-ready fields for a :class:`executor.methods.base.Prediction`."""
        return {
            "acceptance_table": self.table.tolist(),
            "acceptance_trials": self.trials[:, 0].tolist(),
            "pooled_from_depth": self.pooled_from,
            "calibration_by_depth": self.by_depth,
        }


def depth_acceptance(steps, max_depth: int, width: int, *, min_samples: int = MIN_DEPTH_SAMPLES):
    """Sequoia's positional acceptance per depth, :math:`p_{d,k}`, from step logs (:class:`executor.logs.StepLog`).

    For every step and depth ``d``: if the accepted path reached its depth-``d - 1`` node ``u`` and ``u`` has
    ``m`` children, each of its first ``min(m, width)`` children is a trial at ``(d, k)``, a success if it is
    the accepted one. Then

    .. math:: \\hat p_{d,k} = \\frac{\\#\\{k\\text{-th child at depth } d \\text{ accepted}\\}}
                               {\\#\\{\\text{parent at depth } d-1 \\text{ accepted, with} \\ge k
                               \\text{ children}\\}},

    the conditional acceptance of depth ``d`` given the parent accepted (Chen et al., Sequoia, NeurIPS 2024,
    arXiv 2402.12374, Def. 3.1 and App. F.1.1 for the depth). Whether the ``k``-th child is the accepted one
    does not depend on the siblings after it (children are verified in order), so nodes with fewer children
    give unbiased trials for the ranks they have. A chain (``width = 1``) gives the per-position conditional
    acceptance :math:`\\alpha_d` of :func:`theory.expected_tokens`.

    Fallback: depth ``d`` is estimated on its own while it and every shallower depth have at least
    ``min_samples`` trials (at rank 1); from the first depth with fewer, that depth and every deeper one are
    pooled into the last well-estimated depth (their counts summed with it, one row for all of them); if even
    depth 1 has fewer, every depth is pooled (one acceptance law for all depths, the depth-independent model).
    A rank never tried at a depth takes its estimate pooled over all depths (0 if never drafted); a row that
    sums above 1 (possible only when ranks have different trial counts) is scaled down to 1.
    """
    max_depth = as_count(max_depth, "max_depth")
    width = as_count(width, "width")
    min_samples = as_count(min_samples, "min_samples")
    accepted = np.zeros((max_depth, width), dtype=np.int64)
    trials = np.zeros((max_depth, width), dtype=np.int64)
    for index, step in enumerate(steps):
        try:
            parents, path = list(step.parents), list(step.accepted_path)
        except AttributeError:
            raise ValueError(f"steps[{index}] must be a StepLog (parents and accepted_path)") from None
        children: dict[int, list[int]] = {}
        for node, parent in enumerate(parents[1:], start=1):
            children.setdefault(parent, []).append(node)
        for depth in range(1, min(len(path), max_depth) + 1):
            kids = children.get(path[depth - 1], [])[:width]
            if not kids:
                break
            trials[depth - 1, : len(kids)] += 1
            if depth < len(path) and path[depth] in kids:
                accepted[depth - 1, kids.index(path[depth])] += 1
    if not trials[0, 0]:
        raise ValueError("steps: no step drafted a child of the root; nothing to estimate acceptance from")
    thin = np.flatnonzero(trials[:, 0] < min_samples)
    pooled_from = int(thin[0]) + 1 if thin.size else max_depth + 1
    start = max(pooled_from - 2, 0)  # the last well-estimated depth (0-based row) absorbs the deeper ones
    rows_accepted, rows_trials = accepted.astype(np.float64), trials.astype(np.float64)
    if thin.size:
        rows_accepted[start:] = accepted[start:].sum(axis=0)
        rows_trials[start:] = trials[start:].sum(axis=0)
        pooled_from = start + 1
    overall = accepted.sum(axis=0) / np.maximum(trials.sum(axis=0), 1)
    table = np.where(rows_trials > 0, rows_accepted / np.maximum(rows_trials, 1), overall)
    sums = table.sum(axis=1, keepdims=True)
    table = np.where(sums > 1, table / np.maximum(sums, 1), table)
    return DepthAcceptance(table, accepted, trials, pooled_from)
