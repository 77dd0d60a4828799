"""Speed model of layer-parallel ("fuzzy") drafting across devices, after EasySpec.

EasySpec (Wu et al., NeurIPS 2025, arXiv:2502.02493) runs groups of consecutive draft layers at the same time
on different devices: every member of a group computes its attention from the group's *input* hidden state (in
parallel; an all-gather shares the outputs) and the MLPs then run one after the other on the exact residual
stream (policy ``ATTN_ONLY`` of the authors' code; ``DIRECT_MLP`` also parallelises the MLPs). Groups larger
than the device count are split into chunks of at most that many layers. The approximation lowers the draft's
acceptance (the paper reports a drop of at most 7%); after each draft-and-verify iteration one exact,
sequential, multi-token draft pass ("bonus calibration") rewrites the fuzzy KV cache and yields the first
draft token of the next round.

Model used here, per chain step with ``gamma`` drafts:

* sequential drafting: ``gamma`` exact passes of time ``T_seq``; every token accepted with probability alpha
  (or, per depth, position ``d`` with the conditional acceptance ``alpha_d``);
* layer-parallel drafting: one exact calibration pass, ``T_seq * (1 + calibration_overhead)``, then
  ``gamma - 1`` fuzzy passes of time ``T_par``; the first token keeps alpha, the fuzzy ones
  ``alpha - alpha_drop`` (per depth: ``alpha_d - alpha_drop_d``).

Speedups are against plain target decoding (``target_time`` per token), as in Leviathan et al. (ICML 2023,
arXiv:2211.17192).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real

import numpy as np
from scipy.optimize import brentq

from theory.checks import as_count, as_nonnegative, as_probabilities
from theory.length import expected_tokens

__all__ = [
    "LayerParallelSpeedup",
    "break_even_alpha_drop",
    "layer_parallel_draft_time",
    "layer_parallel_speedup",
]


def _as_fraction(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(as_probabilities(value, name))


def _group_time(
    size: int, devices: int, layer_time: float, parallel_fraction: float, sync_time: float
) -> float:
    """Time of one group of ``size`` layers run in chunks of at most ``devices`` layers.

    A chunk of ``m`` layers costs ``layer_time * (f + (1 - f) * m)`` (the parallel part once, the sequential
    part ``m`` times) plus one synchronisation when ``m > 1``.
    """
    chunks = [devices] * (size // devices) + ([size % devices] if size % devices else [])
    return sum(
        layer_time * (parallel_fraction + (1.0 - parallel_fraction) * m) + (sync_time if m > 1 else 0.0)
        for m in chunks
    )


def layer_parallel_draft_time(
    layer_time: float,
    n_layers: int,
    n_devices: int,
    *,
    sync_time: float = 0.0,
    parallel_group: int | None = None,
    parallel_fraction: float = 1.0,
    sequential_layers: int = 0,
    head_time: float = 0.0,
) -> float:
    """Time of one fuzzy draft pass with ``n_layers`` draft layers and ``n_devices`` devices available.

    The first/last ``sequential_layers`` layers stay exact and sequential (EasySpec's code example keeps 4 +
    4); the rest are cut into consecutive groups of ``parallel_group`` layers (default ``n_devices``). A group
    runs in chunks of at most ``d`` layers, each chunk costing

    .. math:: t_{layer}\\,(f + (1 - f)\\,m) + t_{sync}\\,[m > 1],

    with ``f = parallel_fraction`` the share of a layer's time that runs in parallel (attention only under
    ``ATTN_ONLY``; 1 under ``DIRECT_MLP``). Each group uses the best ``d <= n_devices`` -- a scheduler never
    has to use a device that does not help -- so more devices never slow drafting down and ``n_devices = 1``
    is the sequential time ``n_layers * layer_time``. ``head_time`` (embedding + LM head) is added once per
    pass. Wu et al., EasySpec, NeurIPS 2025, arXiv:2502.02493.
    """
    layer_time = as_nonnegative(layer_time, "layer_time")
    n_layers = as_count(n_layers, "n_layers")
    n_devices = as_count(n_devices, "n_devices")
    sync_time = as_nonnegative(sync_time, "sync_time")
    head_time = as_nonnegative(head_time, "head_time")
    parallel_fraction = _as_fraction(parallel_fraction, "parallel_fraction")
    sequential_layers = as_count(sequential_layers, "sequential_layers", minimum=0)
    if sequential_layers > n_layers:
        raise ValueError(f"sequential_layers ({sequential_layers}) exceeds n_layers ({n_layers})")
    group = n_devices if parallel_group is None else as_count(parallel_group, "parallel_group")
    grouped = n_layers - sequential_layers
    sizes = [group] * (grouped // group) + ([grouped % group] if grouped % group else [])
    total = sequential_layers * layer_time + head_time
    for size in sizes:
        total += min(
            _group_time(size, d, layer_time, parallel_fraction, sync_time)
            for d in range(1, min(size, n_devices) + 1)
        )
    return total


@dataclass(frozen=True)
class LayerParallelSpeedup:
    """Sequential against layer-parallel drafting for one chain step of ``gamma`` drafts.

    Times are per draft pass; tokens per step count the bonus token; speedups are against plain decoding.
    """

    speedup: float
    sequential_speedup: float
    tokens_per_step: float
    sequential_tokens_per_step: float
    draft_time: float
    sequential_draft_time: float

    @property
    def pays_off(self) -> bool:
        """Whether layer-parallel drafting beats sequential drafting of the same length."""
        return self.speedup > self.sequential_speedup


def _per_position(alpha, alpha_drop, gamma: int) -> tuple[np.ndarray, np.ndarray]:
    """``alpha`` and ``alpha_drop`` as per-position vectors of length ``gamma`` (a number repeats), validated:
    each drop at a fuzzy position (2..gamma) within [0, alpha there]; the first position's drop is unused."""
    vectors = []
    for value, name in ((alpha, "alpha"), (alpha_drop, "alpha_drop")):
        if isinstance(value, bool):
            raise ValueError(f"{name} must be a number or a vector in [0, 1], got {value!r}")
        array = as_probabilities(value, name)
        if array.ndim == 0:
            array = np.full(gamma, float(array))
        elif array.ndim != 1 or array.size < gamma:
            raise ValueError(
                f"{name} must be a number or a vector with an entry per drafted position (>= {gamma}), "
                f"got shape {array.shape}"
            )
        vectors.append(array[:gamma])
    if np.ndim(alpha) == 0 and np.ndim(alpha_drop) == 0 and float(alpha_drop) > float(alpha):
        raise ValueError(f"alpha_drop ({alpha_drop}) cannot exceed alpha ({alpha})")
    alpha, alpha_drop = vectors
    if gamma > 1 and np.any(alpha_drop[1:] > alpha[1:]):
        d = int(np.argmax(alpha_drop[1:] > alpha[1:])) + 2
        raise ValueError(
            f"alpha_drop ({alpha_drop[d - 1]}) cannot exceed alpha ({alpha[d - 1]}) at position {d}"
        )
    return alpha, alpha_drop


def _step_tokens(alpha: np.ndarray, alpha_drop: np.ndarray, gamma: int) -> float:
    # The calibration pass drafts the first token exactly; the rest are fuzzy.
    if not gamma:
        return 1.0
    return expected_tokens(np.concatenate([alpha[:1], alpha[1:] - alpha_drop[1:]]), gamma)


def layer_parallel_speedup(
    alpha,
    alpha_drop,
    gamma: int,
    draft_layers: int,
    devices: int,
    *,
    layer_time: float,
    target_time: float,
    sync_time: float = 0.0,
    parallel_group: int | None = None,
    parallel_fraction: float = 1.0,
    sequential_layers: int = 0,
    head_time: float = 0.0,
    calibration_overhead: float = 0.0,
) -> LayerParallelSpeedup:
    """Speedup of EasySpec-style drafting and of sequential drafting, under one cost model.

    .. math::
        S_{seq} = \\frac{\\tau(\\alpha, \\gamma)\\, T}{\\gamma T_{seq} + T}, \\qquad
        S_{par} = \\frac{\\tau([\\alpha, \\alpha - \\delta, \\dots, \\alpha - \\delta])\\, T}
                       {T_{seq}(1 + \\kappa) + (\\gamma - 1) T_{par} + T},

    with ``T = target_time``, ``T_seq = draft_layers * layer_time + head_time``, ``T_par`` from
    :func:`layer_parallel_draft_time`, :math:`\\delta` = ``alpha_drop`` (absolute drop of per-token acceptance
    for fuzzy-drafted tokens, ``0 <= alpha_drop <= alpha``) and :math:`\\kappa` = ``calibration_overhead``
    (relative extra cost of the multi-token calibration pass, about 0 when memory-bound). :math:`\\tau` is
    :func:`theory.length.expected_tokens`. Wu et al., EasySpec, NeurIPS 2025, arXiv:2502.02493.

    Acceptance that depends on the depth: ``alpha`` may be the vector :math:`\\alpha_1, \\dots,
    \\alpha_\\gamma` of per-position conditional acceptances of the exact drafter (position ``d`` accepted
    given ``d - 1`` was) and ``alpha_drop`` a number or the vector of per-position drops; then
    :math:`\\tau = 1 + \\sum_t \\prod_{j \\le t} a_j` with :math:`a_1 = \\alpha_1` and
    :math:`a_j = \\alpha_j - \\delta_j` for the fuzzy positions (numbers give the formula above bitwise).
    """
    gamma = as_count(gamma, "gamma", minimum=0)
    alpha, alpha_drop = _per_position(alpha, alpha_drop, gamma)
    target_time = as_nonnegative(target_time, "target_time")
    if target_time == 0:
        raise ValueError("target_time must be positive")
    calibration_overhead = as_nonnegative(calibration_overhead, "calibration_overhead")
    parallel = layer_parallel_draft_time(
        layer_time,
        draft_layers,
        devices,
        sync_time=sync_time,
        parallel_group=parallel_group,
        parallel_fraction=parallel_fraction,
        sequential_layers=sequential_layers,
        head_time=head_time,
    )
    sequential = layer_parallel_draft_time(layer_time, draft_layers, 1, head_time=head_time)
    sequential_tokens = _step_tokens(alpha, np.zeros_like(alpha), gamma)
    tokens = _step_tokens(alpha, alpha_drop, gamma)
    parallel_step = sequential * (1.0 + calibration_overhead) + (gamma - 1) * parallel if gamma else 0.0
    return LayerParallelSpeedup(
        speedup=tokens * target_time / (parallel_step + target_time),
        sequential_speedup=sequential_tokens * target_time / (gamma * sequential + target_time),
        tokens_per_step=tokens,
        sequential_tokens_per_step=sequential_tokens,
        draft_time=parallel,
        sequential_draft_time=sequential,
    )


def break_even_alpha_drop(alpha, gamma: int, draft_layers: int, devices: int, **costs) -> float:
    """The largest acceptance drop at which layer-parallel drafting still matches sequential drafting.

    Layer-parallel pays off iff ``alpha_drop`` is below the returned value :math:`\\delta^*`, found by root
    finding on :math:`S_{par}(\\delta) - S_{seq}`, which decreases in :math:`\\delta` (every fuzzy token's
    survival probability does). Returns 0 when even a lossless fuzzy draft does not pay (e.g. costly
    synchronisation) and the largest possible drop (``alpha``; for per-position ``alpha``, the smallest fuzzy
    position's) when even total loss of the fuzzy tokens still pays. ``alpha`` is a number or per-position
    vector as for :func:`layer_parallel_speedup`; the drop is the same at every fuzzy position. Keyword
    arguments are those of :func:`layer_parallel_speedup`.
    """

    def advantage(drop: float) -> float:
        result = layer_parallel_speedup(alpha, drop, gamma, draft_layers, devices, **costs)
        return result.speedup - result.sequential_speedup

    if np.ndim(alpha) == 0:
        alpha = _as_fraction(alpha, "alpha")
        largest = alpha
    else:
        vector, _ = _per_position(alpha, 0.0, as_count(gamma, "gamma", minimum=0))
        largest = float(vector[1:].min()) if vector.size > 1 else float(vector[0])
    if advantage(0.0) <= 0.0:
        return 0.0
    if advantage(largest) >= 0.0:
        return largest
    return float(brentq(advantage, 0.0, largest, xtol=1e-14, rtol=1e-12))
