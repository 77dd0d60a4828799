"""Turning logits into probabilities and drawing tokens and drafts from them, in torch.

These are the executor's twins of :mod:`theory.draft_laws`: the same draft laws, sampled with an explicit
:class:`torch.Generator` (never the global seed). Every function is batched: the last axis of a probability
tensor is the vocabulary and leading axes are a batch. Random draws are made on the generator's device, so the
probability tensors must live on that device too (CPU or CUDA alike); a mismatch is a ``ValueError``.

Probabilities are validated like :mod:`theory.checks` does (finite, non-negative, rows summing to 1) with
a tolerance that depends on the dtype, because a float32 softmax over 49,152 tokens does not sum to 1 within
the float64 tolerance of ``1e-6``.
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np
import torch

from theory.checks import as_choice, as_count
from theory.verifier_table import DRAFT_LAWS, check_draft_count

#: Draft laws with a torch sampler (the ``"independent"`` law of several draft models is sampled by calling
#: :func:`sample_token` on each model's distribution).
TORCH_DRAFT_LAWS = tuple(draft for draft in DRAFT_LAWS if draft != "independent")

# Largest tolerated |row sum - 1| per dtype; float64 matches theory.checks.SUM_TOLERANCE.
_SUM_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4}
_LOW_PRECISION_SUM_TOLERANCE = 1e-2  # float16 / bfloat16


def check_probabilities(probs: torch.Tensor, name: str, min_dim: int = 1) -> torch.Tensor:
    """Validate a tensor of probability vectors along its last axis; return it in float64, rows renormalised.

    Renormalising within the tolerance makes the float64 arithmetic downstream (and theory's checks, which
    allow 1e-6) see exact distributions.

    Raises ``ValueError`` naming ``name`` when ``probs`` is not a floating tensor with at least ``min_dim``
    axes and a non-empty vocabulary, or has NaN, infinite or negative entries, or a row whose sum is off 1
    by more than the dtype's tolerance (1e-6 for float64, 1e-4 for float32, 1e-2 below).
    """
    if not isinstance(probs, torch.Tensor) or not probs.is_floating_point():
        raise ValueError(f"{name} must be a floating-point torch.Tensor, got {type(probs).__name__}")
    if probs.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} axes, got shape {tuple(probs.shape)}")
    if probs.shape[-1] == 0:
        raise ValueError(f"{name} has an empty vocabulary axis (shape {tuple(probs.shape)})")
    wide = probs.to(torch.float64)
    if wide.numel() == 0:
        return wide
    # Two reductions carry every check (a decoder calls this at every step): NaN propagates through min and
    # sum, -inf shows in the min and +inf in a row sum.
    sums = wide.sum(dim=-1)
    smallest = float(wide.min())
    if not math.isfinite(smallest) or not bool(torch.isfinite(sums).all()):
        raise ValueError(f"{name} contains NaN or infinite entries")
    if smallest < 0:
        raise ValueError(f"{name} contains negative entries (smallest {smallest:.3g})")
    tolerance = _SUM_TOLERANCE.get(probs.dtype, _LOW_PRECISION_SUM_TOLERANCE)
    worst = float((sums - 1.0).abs().max())
    if worst > tolerance:
        raise ValueError(
            f"{name} must sum to 1 along its last axis; a row is off by {worst:.3g} > {tolerance:g}"
        )
    return wide / sums.unsqueeze(-1)


def float64_rows(probs: torch.Tensor) -> torch.Tensor:
    """``probs`` in float64 with every row divided by its sum: what :func:`check_probabilities` returns for valid
    input, without the checks (for the unchecked entries of decoders, which made ``probs`` themselves)."""
    wide = probs.to(torch.float64)
    return wide / wide.sum(dim=-1, keepdim=True)


def check_generator(generator: torch.Generator, tensor: torch.Tensor, name: str) -> None:
    """Require a ``torch.Generator`` on the same device type as ``tensor`` (named ``name`` in the error)."""
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if generator.device.type != tensor.device.type:
        raise ValueError(
            f"generator is on device {generator.device} but {name} is on {tensor.device}; "
            "random draws are made on the generator's device, so put the tensors there"
        )


def _host_array(x: torch.Tensor) -> np.ndarray | None:
    """``x``'s memory as a numpy array where numpy reads it directly (a float32 or float64 CPU tensor), else
    ``None``: torch 2.13's CPU argmax, topk and counts are scalar loops, numpy's are vectorised."""
    return (
        x.detach().numpy() if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) else None
    )


def count_above(x: torch.Tensor, floor: float) -> int:
    """How many entries of ``x`` exceed ``floor`` (9-18 us through numpy at V = 49,152; torch's count 65-140)."""
    values = _host_array(x)
    return int(np.count_nonzero(values > floor)) if values is not None else int((x > floor).sum())


def first_argmax(x: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """Index (int64) of the first largest entry along the last axis: :func:`torch.argmax`'s answer, NaN counted
    as largest as there.

    Float32 and float64 tensors on the CPU go through numpy's argmax, which is vectorised where torch's CPU
    argmax is a scalar loop: 4 against 110 us for a row of 49,152 (Xeon, torch 2.13), and a temperature-0
    decoding step takes one per target row, draft node and draw.
    """
    values = _host_array(x)
    if values is not None and values.ndim >= 1 and values.shape[-1]:
        index = torch.from_numpy(np.asarray(np.argmax(values, axis=-1), dtype=np.int64))
        return index.unsqueeze(-1) if keepdim else index
    return x.argmax(dim=-1, keepdim=keepdim)


def logits_to_probs(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """Softmax of ``logits / temperature`` after Hugging Face's top-k and top-p filtering, as float32.

    Applied in the order of ``transformers``' logits warpers: temperature, then top-k (keep every token whose
    logit is at least the k-th largest, so ties at the boundary are kept), then top-p / nucleus (Holtzman et
    al., ICLR 2020, arXiv 1904.09751): sort ascending, drop the tokens whose cumulative probability is
    ``<= 1 - top_p``, always keeping the most likely token. Temperature 0 means greedy decoding: the result is
    one-hot on ``argmax(logits)``, ties going to the lowest token id as in :func:`torch.argmax`.

    Apply the same processing to the target and the draft before verification (speculative sampling is
    lossless only with respect to the distributions it is given).

    Parameters
    ----------
    logits : torch.Tensor
        Shape ``(..., V)``; finite or ``-inf`` (masked tokens), at least one finite entry per row.
    temperature : float
        ``>= 0``.
    top_k : int or None
        ``>= 1``; ``None`` keeps every token.
    top_p : float or None
        In ``(0, 1]``; ``None`` (or 1) keeps every token.

    Returns
    -------
    torch.Tensor
        float32 probabilities of the same shape, on the same device.
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point torch.Tensor, got {type(logits).__name__}")
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty vocabulary axis, got shape {tuple(logits.shape)}")
    if isinstance(temperature, bool) or not isinstance(temperature, Real) or not temperature >= 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if temperature == float("inf"):
        raise ValueError("temperature must be finite, got inf")
    if top_k is not None:
        top_k = as_count(top_k, "top_k")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, Real) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be a number in (0, 1], got {top_p!r}")
    scores = logits.to(torch.float32)
    # One reduction checks all three (a decoder calls this at every step): a row's max is NaN when the row
    # holds a NaN, +inf when it holds +inf, and -inf when every entry is masked.
    row_max = scores.amax(dim=-1)
    if bool(torch.isnan(row_max).any()) or bool((row_max == float("inf")).any()):
        raise ValueError("logits contain NaN or +inf entries")
    if bool((row_max == float("-inf")).any()):
        raise ValueError("logits have a row with no finite entry (every token masked)")
    if temperature == 0:
        winners = first_argmax(scores, keepdim=True)
        return torch.zeros_like(scores).scatter_(-1, winners, 1.0)
    scores = scores / temperature
    if top_k is not None and top_k < scores.shape[-1]:
        kth_largest = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth_largest, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_scores, order = torch.sort(scores, dim=-1, stable=True)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= 1 - top_p
        drop_sorted[..., -1] = False  # the most likely token always survives
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def sample_token(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw one token from each probability vector along the last axis.

    ``probs`` has shape ``(..., V)`` (any floating dtype; rows need not be exactly normalised, only
    non-negative with a positive sum) and must be on ``generator``'s device. Returns an int64 tensor of shape
    ``(...)``. Tokens with probability 0 are never drawn.
    """
    check_generator(generator, probs, "probs")
    if not probs.is_floating_point() or probs.dim() < 1 or probs.shape[-1] == 0:
        raise ValueError(f"probs must be a floating tensor with a vocabulary axis, got {tuple(probs.shape)}")
    if probs.numel():
        sums = probs.sum(dim=-1, dtype=torch.float64)  # NaN and +inf show here, -inf and negatives in the min
        if not float(probs.min()) >= 0 or not bool(torch.isfinite(sums).all()):
            raise ValueError("probs must be finite and non-negative")
        if not bool((sums > 0).all()):
            raise ValueError("probs has a row with zero total probability")
    return _draw(probs, generator)


def _draw(weights: torch.Tensor, generator: torch.Generator, count: int | None = None) -> torch.Tensor:
    """Unchecked draw with replacement per row of ``weights`` (``(..., V)``, >= 0, positive sum).

    One token (shape ``(...)``) or ``count`` tokens (shape ``(..., count)``), by inverting the cumulative
    sum: ``u * total`` with ``u ~ U[0, 1)`` falls in token ``i``'s interval ``[cdf[i-1], cdf[i])``, empty when
    ``weights[i] == 0`` (an order of magnitude faster than :func:`torch.multinomial` at V = 49,152).
    """
    cdf = weights.to(torch.float64).cumsum(dim=-1)
    total = cdf[..., -1:]
    shape = (*weights.shape[:-1], 1 if count is None else count)
    uniform = torch.rand(shape, dtype=torch.float64, device=weights.device, generator=generator)
    # u * total can round up to total itself; stay strictly below it so the search ends inside the support.
    point = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    tokens = torch.searchsorted(cdf, point, right=True)
    return tokens.squeeze(-1) if count is None else tokens


def _draw_without_replacement(q: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """Successive sampling of ``n`` distinct tokens per row of ``q`` (``(..., V)``, at least ``n`` positive
    entries): each draw is :func:`_draw` on ``q`` with the tokens already drawn set to 0.

    A cumulative sum per draw instead of the Gumbel-top-n trick's V uniforms and two logarithms:
    ``sample_drafts`` took 0.3-0.5 against 1.6-1.7 ms a row at V = 49,152 on a 2-core Xeon (n = 2, 4), paid
    at every node of a sampled tree. One cumulative sum for all draws, carrying each point past the drawn
    tokens' intervals, was faster still but cannot reach a token whose mass is below the rounding of the
    others' sum (q = (1, 1e-100): the second draw must be token 1, which that sum does not resolve).
    """
    weights = q.to(torch.float64, copy=True)  # zeroed in place below
    drawn = []
    for j in range(n):
        token = _draw(weights, generator)
        drawn.append(token)
        if j + 1 < n:
            weights.scatter_(-1, token.unsqueeze(-1), 0.0)
    return torch.stack(drawn, dim=-1)


#: Up to this many tokens :func:`top_tokens` takes first maxima one by one on the CPU (numpy), beyond it torch.topk.
_FIRST_ARGMAX_TOP_K = 16


def top_tokens(q: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest entries along the last axis, largest first, ties to the lower index.

    The torch twin of :func:`theory.draft_laws.top_tokens` (a stable descending sort). On the CPU, up to
    :data:`_FIRST_ARGMAX_TOP_K` tokens are taken as first maxima one by one (numpy), which is that order.
    Elsewhere :func:`torch.topk`, which does not promise that tie order, is used only when no tie could
    reorder it; otherwise (rare) the full stable sort decides.
    """
    if k == 1:
        return first_argmax(q, keepdim=True)
    if k >= q.shape[-1]:
        return torch.sort(q, dim=-1, descending=True, stable=True).indices[..., :k]
    host = _host_array(q) if 2 <= k <= _FIRST_ARGMAX_TOP_K else None
    if host is not None:
        # k first maxima, each masked to -inf once taken: the stable order by construction, and faster than
        # torch.topk (160 us for a row of 49,152) for a few tokens. Valid while every maximum taken is above
        # -inf (past that a taken token could be taken again): else torch's path below.
        work = host.copy()
        picks, valid = [], True
        for _ in range(k):
            pick = np.argmax(work, axis=-1)[..., None]
            valid = valid and bool((np.take_along_axis(work, pick, axis=-1) > -np.inf).all())
            picks.append(pick)
            np.put_along_axis(work, pick, -np.inf, axis=-1)
        if valid:
            return torch.from_numpy(np.concatenate(picks, axis=-1).astype(np.int64, copy=False))
    values, indices = torch.topk(q, k + 1, dim=-1, sorted=True)
    boundary_tie = values[..., k - 1] == values[..., k]
    misordered_tie = (values[..., 1:k] == values[..., : k - 1]) & (indices[..., 1:k] < indices[..., : k - 1])
    if bool(boundary_tie.any()) or bool(misordered_tie.any()):
        return torch.sort(q, dim=-1, descending=True, stable=True).indices[..., :k]
    return indices[..., :k]


def largest_positive(weights: torch.Tensor, count: int) -> list[float]:
    """The ``count`` largest positive entries of the 1-D ``weights`` (fewer where fewer are positive), largest
    first: what a dynamic tree ranks a node's candidate children by. On the CPU the count and the top entries
    go through numpy (:func:`top_tokens`): 78 against 249 us with torch's count and topk (three of 49,152)."""
    count = min(count, count_above(weights, 0.0))
    return weights[top_tokens(weights, count).reshape(-1)].tolist() if count else []


def sample_drafts(q: torch.Tensor, n: int, draft: str, generator: torch.Generator) -> torch.Tensor:
    """Draw ``n`` ordered drafts per row of the draft distribution ``q`` under a draft law.

    The torch twin of :func:`theory.draft_laws.sample_drafts` (Hu et al., "Towards Optimal Multi-draft
    Speculative Decoding", ICLR 2025, arXiv 2502.18779, for the laws):

    ``"iid"``
        with replacement, :math:`P(\\bar x) = \\prod_j q(x_j)`.
    ``"wor"``
        without replacement (successive sampling), :math:`P(\\bar x) = \\prod_j q(x_j) / (1 - \\sum_{l<j}
        q(x_l))`, in draw order (:func:`_draw_without_replacement`). Verify them in that order
        (:func:`executor.verification.verify_multidraft` with ``"rrs_wor"``).
    ``"greedy"``
        the top ``n - 1`` tokens of ``q`` (largest first, ties to the lower id) and one draw from ``q``
        restricted to the other tokens.
    ``"spechub"``
        ``n = 2``, hub ``a = argmax q`` (first index): ``(i, a)`` with probability ``q(i)`` for ``i != a``,
        ``(a, i)`` with probability ``q(a) q(i) / (1 - q(a))`` (Sun et al., SpecHub, EMNLP 2024,
        arXiv 2411.05289).

    Parameters
    ----------
    q : torch.Tensor
        ``(..., V)`` probabilities on ``generator``'s device.
    n : int
        Drafts per row, ``>= 1`` (exactly 2 for ``"spechub"``); ``"wor"``, ``"greedy"`` and ``"spechub"``
        need at least ``n`` tokens with ``q > 0`` in every row.
    draft : str
        The draft law, one of :data:`TORCH_DRAFT_LAWS` (the name theory uses for the same argument).
    generator : torch.Generator

    Returns
    -------
    torch.Tensor
        int64 drafts of shape ``(..., n)``, in draw order.
    """
    draft = as_choice(draft, "draft", TORCH_DRAFT_LAWS)
    n = as_count(n, "n")
    check_generator(generator, q, "q")
    q = check_probabilities(q, "q")
    check_draft_count(draft, n, int((q > 0).sum(dim=-1).min()) if q.numel() else n, "a row of q")
    return _sample_normalised(q, n, draft, generator)


def sample_drafts_unchecked(q: torch.Tensor, n: int, draft: str, generator: torch.Generator) -> torch.Tensor:
    """:func:`sample_drafts` without its input checks, for a decoder's own step: ``q`` comes from
    :func:`logits_to_probs` and has at least ``n`` positive entries per row where the law needs them. The rows
    are renormalised in float64 as the checks do, so both entries draw the same drafts."""
    return _sample_normalised(float64_rows(q), n, draft, generator)


def _sample_normalised(q: torch.Tensor, n: int, draft: str, generator: torch.Generator) -> torch.Tensor:
    if draft == "iid":
        return _draw(q, generator, n)
    if draft == "wor":
        return _draw_without_replacement(q, n, generator)
    if draft == "greedy":
        top = top_tokens(q, n - 1)
        rest = q.scatter(-1, top, 0.0)
        return torch.cat([top, _draw(rest, generator).unsqueeze(-1)], dim=-1)
    hub = top_tokens(q, 1)  # spechub; shape (..., 1)
    first = _draw(q, generator).unsqueeze(-1)
    second = _draw(q.scatter(-1, hub, 0.0), generator).unsqueeze(-1)
    first_is_hub = first == hub
    return torch.cat([first, torch.where(first_is_hub, second, hub)], dim=-1)
