"""Speculative verification kernels in torch: the executor's twins of :mod:`theory.verifiers`.

Each function takes the target distribution ``p`` (``target_probs``) and the draft distribution ``q``
(``draft_probs``) at the drafted positions, the drafts, and an explicit :class:`torch.Generator`, and returns
what the step commits. Every kernel is batched over leading axes and vectorised over the vocabulary (loops
run only over the ``n`` drafts or the ``gamma`` positions), and computes in float64 whatever the input dtype.
Random draws are made on the generator's device, so the tensors must be there too.

Accept tests are written ``u * denominator < numerator`` with ``u ~ U[0, 1)``: that accepts with probability
``min(1, numerator / denominator)`` without dividing, never accepts a token the target gives probability 0,
and always accepts a token the draft gives probability 0 but the target does not. Residual distributions are
sampled with a guard: when their mass is 0 the algorithm never samples them (the rejection that leads there has
probability 0), and the target is used instead (no division by zero, no NaN).

The kernels use the variable names of their numpy twins in :mod:`theory.verifiers`, after the papers' symbols.

Verifiers (:data:`MULTIDRAFT_VERIFIERS`; the draft law each expects is :data:`VERIFIER_DRAFT_LAW`, read from
:data:`theory.verifier_table.VERIFIER_TABLE` for every name but the executor's own ``"argmax"``):

``"nss"``      naive speculative sampling (SpecInfer): ``y ~ p``, drafts ignored.
``"naive"``    the single-draft rule on ``x_1``; its residual sample may equal another draft.
``"rrs"``      recursive rejection sampling with i.i.d. drafts (SpecInfer's multi-step speculative sampling).
``"rrs_wor"``  recursive rejection sampling for drafts drawn without replacement, verified in draw order.
``"kseq"``     K-SEQ of SpecTr with the optimal division factor ``rho*``.
``"spechub"``  SpecHub's verifier for its hub pair law (``n = 2``).
``"greedy"``   Hu et al.'s verifier for the greedy draft law (top ``n - 1`` of ``q`` plus one draw).
``"optimal"``  the run-time optimal verifier for i.i.d. drafts (:mod:`executor.optimal_verification`).
``"argmax"``   temperature 0: the output is ``argmax p``.

For all of them the acceptance event is "the output token is one of the drafts", and the returned
``accepted_index`` is the position of the first draft equal to the output (``-1`` if none).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from executor.optimal_verification import verify_optimal
from executor.sampling import (
    _draw,
    check_generator,
    check_probabilities,
    first_argmax,
    float64_rows,
    top_tokens,
)
from theory.verifier_table import VERIFIERS, check_draft_count, verifier_draft_law
from theory.verifiers.iid import (  # the twins search alike
    KSEQ_BISECTION_STEPS,
    KSEQ_BUCKETS,
    KSEQ_PLAIN_BISECTION_VOCAB,
)

# --------------------------------------------------------------------------------------------------------
# Shared pieces


def _uniform(shape, like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.rand(shape, dtype=torch.float64, device=like.device, generator=generator)


def _accepts(uniform: torch.Tensor, numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """The coin of every accept test: true with probability ``min(1, numerator / denominator)``."""
    return uniform * denominator < numerator


def _at(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``probs[..., tokens]`` row by row (``tokens`` has the leading shape of ``probs``)."""
    return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _or_target(weights: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``weights`` (``>= 0``, unnormalised: :func:`executor.sampling._draw` scales by their sum), or ``target`` in
    rows where their mass is 0 (a branch never taken)."""
    return torch.where(_mass(weights) > 0, weights, target)


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``(p - q)_+``, unnormalised: the law sampled after a rejection (Leviathan et al. 2023, eq. in Alg. 1)."""
    return _or_target((p - q).clamp_min(0.0), p)


def _draw_residual(weights: torch.Tensor, target: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A draw from the residual ``weights`` (:func:`_or_target`)."""
    return _draw(_or_target(weights, target), generator)


def _mass(weights: torch.Tensor) -> torch.Tensor:
    return weights.sum(dim=-1, keepdim=True)


def _first_index(drafts: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Position of the first draft equal to ``tokens`` in each row, ``-1`` when none is."""
    match = drafts == tokens.unsqueeze(-1)
    first = match.to(torch.int64).argmax(dim=-1)  # argmax returns the first maximum
    return torch.where(match.any(dim=-1), first, torch.full_like(first, -1))


def _check_tokens(tokens, name: str, shape: tuple[int, ...], vocab: int) -> torch.Tensor:
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point() or tokens.is_complex():
        raise ValueError(f"{name} must be an integer torch.Tensor of token ids, got {type(tokens).__name__}")
    if tuple(tokens.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(tokens.shape)}")
    tokens = tokens.to(torch.int64)
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(
            f"{name} must hold token ids in [0, {vocab}), "
            f"got range [{int(tokens.min())}, {int(tokens.max())}]"
        )
    return tokens


# --------------------------------------------------------------------------------------------------------
# Chains


def verify_chain(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    drafts: torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling of a drafted chain (Leviathan, Kalman & Matias, ICML 2023, arXiv 2211.17192;
    Chen et al., arXiv 2302.01318).

    Draft ``x_i`` is accepted with probability :math:`\\min(1, p_i(x_i) / q_i(x_i))`, in order, until the
    first rejection; at the first rejected position ``k`` the next token is drawn from
    :math:`\\mathrm{norm}((p_k - q_k)_+)`, and when all ``gamma`` drafts are accepted the bonus token is drawn
    from ``p_gamma``. The committed tokens then follow the target's law exactly.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``(..., gamma + 1, V)``: the target's next-token distribution after each accepted prefix, the last
        row after the whole chain.
    draft_probs : torch.Tensor
        ``(..., gamma, V)``: the distributions the drafts were sampled from.
    drafts : torch.Tensor
        ``(..., gamma)`` int token ids.
    generator : torch.Generator
        On the tensors' device.

    Returns
    -------
    n_accepted, next_token : torch.Tensor
        int64 of shape ``(...)``: the number of leading drafts accepted (0..gamma) and the token that follows
        them (the residual sample or the bonus token).
    """
    check_generator(generator, target_probs, "target_probs")
    p = check_probabilities(target_probs, "target_probs", min_dim=2)
    q = check_probabilities(draft_probs, "draft_probs", min_dim=2)
    gamma = q.shape[-2]
    if p.shape[:-2] != q.shape[:-2] or p.shape[-2] != gamma + 1 or p.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"target_probs must have shape (..., gamma + 1, V) matching draft_probs (..., gamma, V); got "
            f"{tuple(p.shape)} and {tuple(q.shape)}"
        )
    drafts = _check_tokens(drafts, "drafts", tuple(q.shape[:-1]), q.shape[-1])
    p_drafted = p[..., :gamma, :]
    accepted = _accepts(_uniform(drafts.shape, p, generator), _at(p_drafted, drafts), _at(q, drafts))
    n_accepted = accepted.to(torch.int64).cumprod(dim=-1).sum(dim=-1)
    # Only the law that follows is built: the residual after a rejection at k < gamma, or at k = gamma the
    # bonus distribution p_gamma.
    index = n_accepted[..., None, None].expand(*n_accepted.shape, 1, p.shape[-1])
    p_next = p.gather(-2, index).squeeze(-2)
    q_next = torch.cat([q, torch.zeros_like(p[..., :1, :])], dim=-2).gather(-2, index).squeeze(-2)
    bonus = (n_accepted == gamma).unsqueeze(-1)
    return n_accepted, _draw(torch.where(bonus, p_next, _residual(p_next, q_next)), generator)


def verify_chain_argmax(target: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature-0 verification of a chain: accept drafts while each equals the target's argmax.

    ``target`` is ``(..., gamma + 1, V)`` probabilities or logits (only the argmax matters; ties go to the
    lowest id as in :func:`torch.argmax`), ``drafts`` is ``(..., gamma)``. Returns ``(n_accepted,
    next_token)`` with ``next_token = argmax target[n_accepted]``, so the output equals greedy decoding.
    """
    if not isinstance(target, torch.Tensor) or not target.is_floating_point() or target.dim() < 2:
        raise ValueError("target must be a floating torch.Tensor of shape (..., gamma + 1, V)")
    if bool(torch.isnan(target.amax(dim=-1)).any()):  # a NaN propagates through the max
        raise ValueError("target contains NaN entries")
    gamma = target.shape[-2] - 1
    drafts = _check_tokens(drafts, "drafts", (*target.shape[:-2], gamma), target.shape[-1])
    greedy = first_argmax(target)
    n_accepted = (drafts == greedy[..., :gamma]).to(torch.int64).cumprod(dim=-1).sum(dim=-1)
    return n_accepted, greedy.gather(-1, n_accepted.unsqueeze(-1)).squeeze(-1)


def verify_tree_argmax(
    target: torch.Tensor, parents: Sequence[int], tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature-0 verification of a token tree: follow the child whose token is the target's argmax.

    Parameters
    ----------
    target : torch.Tensor
        ``(N, V)`` probabilities or logits; row ``i`` is the target's next-token law after node ``i``.
    parents : sequence of int
        The tree as a parent array: ``parents[0] == -1`` is the root (the last committed token) and
        ``0 <= parents[i] < i`` for the other nodes (topological order, children in increasing index).
    tokens : torch.Tensor
        ``(N,)`` the token of each node (``tokens[0]`` is not checked).

    Returns
    -------
    path, next_token : torch.Tensor
        The accepted node indices from the root's child downwards (int64, possibly empty) and the argmax
        token after the deepest accepted node. When siblings share a token, the first is followed.
    """
    parents = [int(parent) for parent in parents]
    size = len(parents)
    if size == 0 or parents[0] != -1:
        raise ValueError("parents must be a non-empty parent array with parents[0] == -1 (the root)")
    for node, parent in enumerate(parents[1:], start=1):
        if not 0 <= parent < node:
            raise ValueError(f"parents[{node}] = {parent}: every non-root node needs a parent in [0, {node})")
    if not isinstance(target, torch.Tensor) or not target.is_floating_point() or target.shape[:1] != (size,):
        raise ValueError(f"target must be a floating tensor of shape (N, V) with N = len(parents) = {size}")
    if target.dim() != 2 or bool(torch.isnan(target.amax(dim=-1)).any()):
        raise ValueError(f"target must be a 2-d tensor without NaN, got shape {tuple(target.shape)}")
    tokens = _check_tokens(tokens, "tokens", (size,), target.shape[-1])
    greedy = first_argmax(target).tolist()
    token_of = tokens.tolist()
    children: list[list[int]] = [[] for _ in range(size)]
    for node in range(1, size):
        children[parents[node]].append(node)
    path, node = [], 0
    while True:
        matching = [child for child in children[node] if token_of[child] == greedy[node]]
        if not matching:
            break
        node = matching[0]
        path.append(node)
    device = target.device
    return torch.tensor(path, dtype=torch.int64, device=device), torch.tensor(greedy[node], device=device)


# --------------------------------------------------------------------------------------------------------
# Multi-draft, one position


def _kseq_division_factor(p: torch.Tensor, q: torch.Tensor, n: int) -> torch.Tensor:
    """:math:`\\rho^*` per row, shape ``(..., 1)``: the smallest lossless division factor in ``[1, n]``.

    The torch twin of ``theory.verifier("kseq").division_factor`` (on the tensors' device): with
    :math:`\\beta(\\rho) = \\sum \\min(p/\\rho, q)`, :math:`\\rho` is valid when
    :math:`1 - (1 - \\beta)^n \\le \\rho\\beta`; the left side decreases and the right side increases in
    :math:`\\rho`, so the smallest valid factor is found by bisection (SpecTr, Sun et al., NeurIPS 2023,
    arXiv 2310.15141), to the same resolution as the twin's :data:`KSEQ_BISECTION_STEPS` halvings.

    How it is found: :math:`\\beta(\\rho) = \\rho^{-1} \\sum_{p/q \\le \\rho} p + \\sum_{p/q > \\rho} q`, so one
    pass bins the tokens by ratio into :data:`KSEQ_BUCKETS` equal buckets of ``[1, n]`` and cumulative sums
    give :math:`\\beta` at every bucket edge; the first valid edge brackets :math:`\\rho^*`, and the
    remaining halvings run on the tokens of that bucket alone (:func:`_kseq_bracket`). Eighty passes over
    V = 49,152 (the plain bisection) cost 5.0-5.3 ms a row on a 2-core Xeon, most of a K-SEQ step's overhead
    at T > 0. Up to :data:`~theory.verifiers.iid.KSEQ_PLAIN_BISECTION_VOCAB` tokens the plain bisection is
    the cheaper one, batched over rows.
    """

    def valid(rho, beta):
        # 1e-13 absorbs round-off in beta (p = q gives beta = 1 - 1e-16, valid at rho = 1), as in the twin
        return 1.0 - (1.0 - beta) ** n <= rho * beta + 1e-13

    shape, vocab = p.shape[:-1], p.shape[-1]
    p, q = p.reshape(-1, vocab), q.reshape(-1, vocab)
    one = torch.ones((p.shape[0], 1), dtype=p.dtype, device=p.device)
    at_one = valid(one, torch.minimum(p, q).sum(dim=-1, keepdim=True))
    if n == 1 or bool(at_one.all()):  # one draft: rho* = 1 (beta <= beta)
        return one.reshape(*shape, 1)
    if vocab <= KSEQ_PLAIN_BISECTION_VOCAB:  # plain bisection on every token, all rows at once
        low, high = one, torch.full_like(one, float(n))
        for _ in range(KSEQ_BISECTION_STEPS):
            middle = 0.5 * (low + high)
            good = valid(middle, torch.minimum(p / middle, q).sum(dim=-1, keepdim=True))
            low, high = torch.where(good, low, middle), torch.where(good, middle, high)
        return torch.where(at_one, one, high).reshape(*shape, 1)
    width = (n - 1.0) / KSEQ_BUCKETS
    edges = 1.0 + width * torch.arange(KSEQ_BUCKETS + 1, dtype=p.dtype, device=p.device)
    edges[-1] = float(n)
    # Bucket b >= 1 holds the ratios in (edges[b-1], edges[b]] (up to a rounding at an edge, where p/rho and q
    # agree to an ulp); 0 those <= 1, KSEQ_BUCKETS + 1 those > n. A p = 0 token adds 0 on either side (0/0 is
    # put at ratio 0), a q = 0 < p one is on the q side (p/0 = inf) and adds 0 too.
    ratio = torch.nan_to_num(p / q, nan=0.0)
    bucket = ratio.sub_(1.0).div_(width).ceil_().clamp_(0, KSEQ_BUCKETS + 1).to(torch.int64)
    size = KSEQ_BUCKETS + 2
    bucket_p = torch.zeros((p.shape[0], size), dtype=p.dtype, device=p.device).scatter_add_(1, bucket, p)
    bucket_q = torch.zeros((p.shape[0], size), dtype=p.dtype, device=p.device).scatter_add_(1, bucket, q)
    lower_p = bucket_p.cumsum(dim=-1)[:, :-1]  # sum of p with ratio <= edges[j], j = 0 .. KSEQ_BUCKETS
    upper_q = bucket_q.flip(-1).cumsum(dim=-1).flip(-1)[:, 1:]  # sum of q with ratio > edges[j], as a sum
    ok = valid(edges, lower_p / edges + upper_q)
    ok[:, -1] = True  # n is always valid: (1 - (1 - beta)^n) <= n beta
    first = ok.to(torch.int8).argmax(dim=-1)  # >= 1 where rho = 1 is not valid
    solved = []
    for row in range(p.shape[0]):
        if bool(at_one[row]):
            solved.append(one[row])
            continue
        j = max(int(first[row]), 1)
        inside = bucket[row] == j
        solved.append(
            _kseq_bracket(
                p[row][inside],
                q[row][inside],
                lower_p[row, j - 1 : j],
                upper_q[row, j : j + 1],
                edges[j - 1 : j],
                edges[j : j + 1],
                valid,
            )
        )
    return torch.cat(solved).reshape(*shape, 1)


def _kseq_bracket(inner_p, inner_q, lower_p, upper_q, low, high, valid) -> torch.Tensor:
    """The last halvings of :func:`_kseq_division_factor` in the bracket ``(low, high]``, ``2**10`` points at
    a time, for one row whose tokens with ratio inside the bracket have masses ``inner_p``, ``inner_q`` (those
    below add ``lower_p / rho``, those above ``upper_q``). Each round scores ``low + (high - low) j / G``
    (``j = 1 .. G``, the last point ``high`` itself) and keeps the first valid point and the one before it:
    the bracket ``log2 G`` halvings would leave. Returns the last valid ``high``, a ``(1,)`` tensor."""
    remaining = KSEQ_BISECTION_STEPS - int(math.log2(KSEQ_BUCKETS))
    while remaining > 0:
        bits = min(10, remaining)
        remaining -= bits
        grid = torch.arange(1, 2**bits + 1, dtype=low.dtype, device=low.device)
        points = low + (high - low) * (grid / 2**bits)
        points[-1] = high[0]
        beta = lower_p / points + upper_q + torch.minimum(inner_p[None, :] / points[:, None], inner_q).sum(-1)
        ok = valid(points, beta)
        if not bool(ok.any()):  # high was valid by the bucket sums and fails here by round-off: keep it
            break
        first = int(ok.to(torch.int8).argmax())
        low, high = (points[first - 1 : first] if first > 0 else low), points[first : first + 1]
    return high


def _verify_nss(p, q, drafts, generator):
    return _draw(p, generator)


def _verify_naive(p, q, drafts, generator):
    first = drafts[..., 0]
    accept = _accepts(_uniform(first.shape, p, generator), _at(p, first), _at(q, first))
    return torch.where(accept, first, _draw(_residual(p, q), generator))


def _shifted_residual(p: torch.Tensor, q: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``(p - shift q)_+``: RRS's residual after rejections, unnormalised (:func:`_recursive_rejection`)."""
    return torch.addcmul(p, q, shift, value=-1.0).clamp_min_(0.0)


def _recursive_rejection(p, q, drafts, generator, without_replacement: bool):
    r"""RRS: test draft ``i`` against the running residual ``p_i``; on rejection ``p_{i+1} = norm((p_i -
    q_i)_+)``. Without replacement, ``q_{i+1}`` is ``q_i`` with the rejected draft zeroed and renormalised.

    The residuals are not formed one from the other: by induction :math:`p_i \propto w_i = (p - s_i q)_+` with
    :math:`s_1 = 0` and :math:`s_{i+1} = s_i + N_i / c_i`, where :math:`N_i = \sum w_i` and :math:`c_i` is the
    mass ``q_i`` was renormalised by (1 for i.i.d. drafts), because :math:`w_i / N_i - q / c_i` is positive
    exactly where ``p > s_{i+1} q`` (where :math:`w_i = 0` it is at most :math:`-q / c_i`). Without
    replacement a drafted token leaves ``q_{i+1}``, but its entry needs no memory of that: it was rejected, so
    :math:`p_i(x_i) < q_i(x_i)` (otherwise it is accepted surely), and its residual is 0 from then on whatever
    ``q`` holds there. Draft ``i`` is accepted iff :math:`u\, q(x_i) N_i < w_i(x_i)\, c_i`, i.e.
    :math:`u\, q_i(x_i) < p_i(x_i)`. Each rejection costs one fused pass and one sum over the vocabulary (and,
    without replacement, one sum of the ``q`` left), none of them a division.
    """
    rows = drafts.shape[:-1]
    token = torch.full(rows, -1, dtype=torch.int64, device=p.device)
    done = torch.zeros(rows, dtype=torch.bool, device=p.device)
    uniforms = _uniform(drafts.shape, p, generator)
    weights, mass = p, torch.ones((*rows, 1), dtype=p.dtype, device=p.device)  # rows of p sum to 1
    shift = torch.zeros_like(mass)
    kept = scale = None  # without replacement: q with the drafts so far zeroed, and its mass c_i
    if without_replacement:
        kept, scale = q.clone(), torch.ones_like(mass)
    for i in range(drafts.shape[-1]):
        draft = drafts[..., i]
        numerator = _at(weights, draft) if scale is None else _at(weights, draft) * scale[..., 0]
        accept = ~done & _accepts(uniforms[..., i], numerator, _at(q, draft) * mass[..., 0])
        token = torch.where(accept, draft, token)
        done |= accept
        if bool(done.all()):  # the residuals after an acceptance are never sampled
            return token
        shift = shift + (mass if scale is None else mass / scale)
        weights = _shifted_residual(p, q, shift)
        if kept is not None:
            kept.scatter_(-1, draft.unsqueeze(-1), 0.0)
            scale = _mass(kept)  # summed over the tokens left, not 1 - q(drafts): no cancellation
        mass = _mass(weights)
    return torch.where(done, token, _draw_residual(weights, p, generator))


def _verify_rrs(p, q, drafts, generator):
    return _recursive_rejection(p, q, drafts, generator, without_replacement=False)


def _verify_rrs_wor(p, q, drafts, generator):
    return _recursive_rejection(p, q, drafts, generator, without_replacement=True)


def _verify_kseq(p, q, drafts, generator):
    n = drafts.shape[-1]
    rho = _kseq_division_factor(p, q, n)
    uniforms = _uniform(drafts.shape, p, generator)
    passed = _accepts(uniforms, p.gather(-1, drafts), rho * q.gather(-1, drafts))
    first = drafts.gather(-1, passed.to(torch.int64).argmax(dim=-1, keepdim=True)).squeeze(-1)
    some = passed.any(dim=-1)
    if bool(some.all()):  # the residual is never sampled
        return first
    accepted = torch.minimum(p / rho, q)  # min(p/rho, q): the law of an accepted draft, up to beta
    beta = accepted.sum(dim=-1, keepdim=True)
    # SpecTr's gamma = p_acc / beta with p_acc = 1 - (1 - beta)^n; the residual is norm((p - gamma * accepted)_+).
    gamma = torch.where(beta > 0, (1.0 - (1.0 - beta) ** n) / torch.where(beta > 0, beta, 1.0), 0.0)
    residual = torch.addcmul(p, gamma, accepted, value=-1.0).clamp_min_(0.0)
    return torch.where(some, first, _draw_residual(residual, p, generator))


def _verify_spechub(p, q, drafts, generator):
    """SpecHub (Sun et al., EMNLP 2024, arXiv 2411.05289), from its code ``MyTree.accept_step``."""
    hub = top_tokens(q, 1)
    hub_first = drafts[..., 0] == hub.squeeze(-1)
    other = torch.where(hub_first, drafts[..., 1], drafts[..., 0])
    q_hub = q.gather(-1, hub)
    p_hub = p.gather(-1, hub).squeeze(-1)
    # Off the hub a: p'(i) and Q(a, i), the probability of the pair (a, i), 0 at the hub. p'(a) is never read:
    # the other draft is not a, R_ai's term at a is (0 - p'(a))_+ = 0, and the leftover's entry at a is replaced.
    excess = (p - q).clamp_min_(0.0)
    second = (q_hub / (1.0 - q_hub) * q).scatter_(-1, hub, 0.0)
    rejected_second = (second - excess).clamp_min_(0.0).sum(dim=-1)  # R_ai
    rejected_first = (q - p).clamp_min_(0.0).scatter_(-1, hub, 0.0).sum(dim=-1)  # R_ia
    hub_left = (p_hub - rejected_second).clamp_min(0.0)  # p''(a)
    u_other, u_hub = _uniform((2, *other.shape), p, generator)
    accept_other = torch.where(
        hub_first,
        _accepts(u_other, _at(excess, other), _at(second, other)),
        _accepts(u_other, _at(p, other), _at(q, other)),
    )
    accept_hub = ~accept_other & torch.where(
        hub_first,
        _accepts(u_hub, p_hub, rejected_second),
        _accepts(u_hub, hub_left, rejected_first),
    )
    chosen = torch.where(accept_other, other, hub.squeeze(-1))
    if bool((accept_other | accept_hub).all()):  # the leftover is never sampled
        return chosen
    hub_leftover = (hub_left - rejected_first).clamp_min(0.0).unsqueeze(-1)
    leftover = excess.sub_(second).clamp_min_(0.0).scatter_(-1, hub, hub_leftover)
    return torch.where(accept_other | accept_hub, chosen, _draw_residual(leftover, p, generator))


def _verify_greedy(p, q, drafts, generator):
    """Hu et al. (ICLR 2025): accept the random last draft ``X`` w.p. ``min(1, p(X) / q'(X))`` with ``q'`` the
    draft restricted to the non-top tokens; otherwise sample ``p`` on the top tokens and ``(p - q')_+`` off
    them. This attains the optimal acceptance of the greedy draft law."""
    top, last = drafts[..., :-1], drafts[..., -1]
    in_top = torch.zeros_like(q, dtype=torch.bool).scatter(-1, top, True)
    rest = torch.where(in_top, 0.0, q)
    rest = rest / rest.sum(dim=-1, keepdim=True)  # positive: the last draft was drawn from it
    accept = _accepts(_uniform(last.shape, p, generator), _at(p, last), _at(rest, last))
    if bool(accept.all()):  # the leftover is never sampled
        return last
    leftover = torch.where(in_top, p, (p - rest).clamp_min_(0.0))
    return torch.where(accept, last, _draw_residual(leftover, p, generator))


def _verify_argmax(p, q, drafts, generator):
    return first_argmax(p)


_KERNELS = {
    "nss": _verify_nss,
    "naive": _verify_naive,
    "rrs": _verify_rrs,
    "rrs_wor": _verify_rrs_wor,
    "kseq": _verify_kseq,
    "spechub": _verify_spechub,
    "greedy": _verify_greedy,
    "optimal": lambda p, q, drafts, generator: verify_optimal(p, q, drafts, generator, accepts=_accepts),
    "argmax": _verify_argmax,
}

#: The draft law (see :func:`executor.sampling.sample_drafts`) each multi-draft verifier is lossless for, from
#: theory's table; ``"argmax"`` is deterministic and works with any drafts.
VERIFIER_DRAFT_LAW = {
    **{name: verifier_draft_law(name) for name in VERIFIERS if name in _KERNELS},
    "argmax": None,
}
MULTIDRAFT_VERIFIERS = tuple(VERIFIER_DRAFT_LAW)


def _check_drafts_fit_law(name: str, q: torch.Tensor, drafts: torch.Tensor) -> None:
    """Reject drafts that the verifier's draft law cannot produce where that is cheap to see."""
    n, draft = drafts.shape[-1], VERIFIER_DRAFT_LAW[name]
    if draft is not None and q.numel():
        check_draft_count(draft, n, int((q > 0).sum(dim=-1).min()), "a row of draft_probs")
    if name == "spechub":
        hub = top_tokens(q, 1)
        if not bool(((drafts == hub).sum(dim=-1) == 1).all()):
            raise ValueError(
                "drafts for 'spechub' must be a pair with exactly one draft equal to the hub "
                "argmax(draft_probs)"
            )
    elif name == "greedy" and n > 1:
        if not bool((drafts[..., :-1] == top_tokens(q, n - 1)).all()):
            raise ValueError(
                "drafts for 'greedy' must start with the top n - 1 tokens of draft_probs, largest first"
            )
        if bool((drafts[..., :-1] == drafts[..., -1:]).any()):
            raise ValueError("the last draft for 'greedy' must not be one of the top n - 1 tokens")
    elif name == "rrs_wor" and n > 1:
        ordered = drafts.sort(dim=-1).values
        if bool((ordered[..., 1:] == ordered[..., :-1]).any()):
            raise ValueError("drafts for 'rrs_wor' must be distinct (drawn without replacement)")
    if name != "argmax" and not bool((q.gather(-1, drafts) > 0).all()):
        raise ValueError(
            f"drafts include a token with draft_probs = 0, which the draft law of {name!r} never draws"
        )


def verify_multidraft(
    name: str,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    drafts: torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify ``n`` drafts for one position with the named multi-draft verifier; the output follows ``p``.

    Algorithms (Hu et al., "Towards Optimal Multi-draft Speculative Decoding", ICLR 2025, arXiv 2502.18779,
    compare them; the torch kernels implement the same algorithms as ``theory.verifier(name)``):

    * ``"rrs"`` -- recursive rejection sampling (Miao et al., SpecInfer, ASPLOS 2024, arXiv 2305.09781):
      ``p_1 = p``; accept ``x_i`` w.p. :math:`\\min(1, p_i(x_i)/q(x_i))`, else
      :math:`p_{i+1} = \\mathrm{norm}((p_i - q)_+)`; if all are rejected, sample :math:`p_{n+1}`.
    * ``"rrs_wor"`` -- the same for drafts without replacement, in draw order, with :math:`q_{i+1} = q_i`
      with ``x_i`` zeroed and renormalised (Jeon et al., arXiv 2402.05109).
    * ``"kseq"`` -- K-SEQ (Sun et al., SpecTr, NeurIPS 2023, arXiv 2310.15141): accept ``x_i`` w.p.
      :math:`\\min(1, p(x_i)/(\\rho^* q(x_i)))`; else sample :math:`\\mathrm{norm}((p - \\gamma
      \\min(p/\\rho^*, q))_+)` with :math:`\\gamma = (1 - (1-\\beta)^n)/\\beta`, where :math:`\\rho^*` is the
      smallest lossless division factor (the bisection of ``theory.verifier("kseq").division_factor``).
    * ``"spechub"`` -- SpecHub (Sun et al., EMNLP 2024, arXiv 2411.05289), ``n = 2``, hub ``a = argmax q``.
    * ``"greedy"`` -- Hu et al.'s verifier for the greedy draft law.
    * ``"nss"``, ``"naive"`` -- the baselines of SpecInfer; ``"argmax"`` -- temperature 0.

    Parameters
    ----------
    name : str
        One of :data:`MULTIDRAFT_VERIFIERS`.
    target_probs, draft_probs : torch.Tensor
        ``(..., V)``: ``p`` and ``q`` at this position.
    drafts : torch.Tensor
        ``(..., n)`` int token ids sampled from ``draft_probs`` with the law ``VERIFIER_DRAFT_LAW[name]``,
        in draw order (:func:`executor.sampling.sample_drafts`).
    generator : torch.Generator
        On the tensors' device.

    Returns
    -------
    accepted_index, token : torch.Tensor
        int64 of shape ``(...)``: the position of the first draft equal to the output token, or ``-1`` when
        the output is not a draft; and the output token.
    """
    if name not in _KERNELS:
        raise ValueError(f"name must be one of {', '.join(map(repr, MULTIDRAFT_VERIFIERS))}; got {name!r}")
    check_generator(generator, target_probs, "target_probs")
    p = check_probabilities(target_probs, "target_probs")
    q = check_probabilities(draft_probs, "draft_probs")
    if p.shape != q.shape:
        raise ValueError(
            "target_probs and draft_probs must have the same shape, "
            f"got {tuple(p.shape)} and {tuple(q.shape)}"
        )
    if not isinstance(drafts, torch.Tensor) or drafts.dim() != p.dim() or drafts.shape[-1] < 1:
        raise ValueError(
            f"drafts must be a tensor of shape (..., n) with n >= 1 and leading shape {tuple(p.shape[:-1])}"
        )
    drafts = _check_tokens(drafts, "drafts", (*p.shape[:-1], drafts.shape[-1]), p.shape[-1])
    _check_drafts_fit_law(name, q, drafts)
    return _run_kernel(name, p, q, drafts, generator)


def verify_multidraft_unchecked(
    name: str,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    drafts: torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`verify_multidraft` without its input checks, for a decoder's own step: ``target_probs`` and
    ``draft_probs`` come from :func:`executor.sampling.logits_to_probs` (finite, rows summing to 1 within
    float32's rounding) and ``drafts`` (int64) were drawn from ``draft_probs`` with the verifier's law.

    The checks (three reductions and two host syncs per distribution, the draft-law test) cost 0.22-0.24 ms a
    verified node in decoding at V = 49,152 (1.12 against 0.90 ms, multi-draft n = 4, T = 1, interleaved), under
    1% of a step. The rows are renormalised in float64 as the checks do, so both entries hand the kernel the
    same numbers.
    """
    return _run_kernel(name, float64_rows(target_probs), float64_rows(draft_probs), drafts, generator)


def _run_kernel(name, p, q, drafts, generator) -> tuple[torch.Tensor, torch.Tensor]:
    token = _KERNELS[name](p, q, drafts, generator)
    return _first_index(drafts, token), token
