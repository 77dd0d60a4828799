"""The target's distributions on the training set, computed once and kept compactly: top-k plus the tail.

Recomputing the teacher ``p`` at every step costs one LM-head product per batch (``|V'| x d`` per token) for a
quantity that never changes. :func:`teacher_topk` computes it once per cached chunk, on the draft vocabulary
``V'`` (``p'`` = ``p`` renormalised there, what the loss distils), and keeps the ``k`` largest log-probabilities
with their indices into ``V'``; the rest is one *tail* bucket of mass :math:`r = 1 - \\sum_{i \\le k} p'_i`.

:func:`coarse_kl` is then the exact KL divergence between the two distributions coarsened to the ``k + 1``
buckets ``{top_1}, ..., {top_k}, tail``:

.. math::

    \\mathrm{KL}(\\bar p \\,\\|\\, \\bar q) = \\sum_{i \\le k} p'_i \\log \\frac{p'_i}{q_i}
      + r \\log \\frac{r}{q_\\mathrm{tail}}, \\qquad q_\\mathrm{tail} = 1 - \\sum_{i \\le k} q_i,

with ``q`` the head's full softmax on ``V'`` (its normaliser still runs over all of ``V'``). By the data
processing inequality it is at most :math:`\\mathrm{KL}(p' \\| q)`, with equality when ``k = |V'|`` or when
``q`` is proportional to ``p'`` inside the tail; it is zero iff ``q`` matches ``p'`` on the top ``k`` tokens.
The gradient pushes the head's mass onto the target's top tokens in the right proportions and keeps its tail
mass equal to the target's, which is what :math:`\\sum_v \\min(p_v, q_v)` rewards (the tail of a 135M model at
k = 32 holds a few percent of the mass).
"""

from __future__ import annotations

import torch

from executor.training.features import FeatureSet, target_logits

__all__ = ["Teacher", "coarse_kl", "teacher_topk"]


class Teacher:
    """``log_p (n, T, k)`` float32 top-k log-probabilities of ``p'`` per cached position, ``index (n, T, k)``
    int32 columns of the draft vocabulary, descending; row ``t`` is the target's distribution of token ``t + 1``
    (the one predicted from the hidden state at ``t``)."""

    def __init__(self, log_p: torch.Tensor, index: torch.Tensor):
        if log_p.shape != index.shape:
            raise ValueError(f"log_p and index must have one shape, got {log_p.shape} and {index.shape}")
        self.log_p, self.index = log_p, index

    def tensors(self) -> dict:
        return {"log_p": self.log_p, "index": self.index}


@torch.no_grad()
def teacher_topk(
    target, features: FeatureSet, vocab: torch.Tensor | None, k: int, *, batch_chunks: int = 4, progress=False
) -> Teacher:
    """The top-``k`` of ``p'`` (on ``vocab``, or the full vocabulary for ``None``) at every cached position."""
    from tqdm import tqdm

    size = target.config.vocab_size if vocab is None else vocab.numel()
    if not 1 <= k <= size:
        raise ValueError(f"k must be between 1 and the draft vocabulary size {size}, got {k}")
    n, length = features.tokens.shape
    log_p = torch.empty(n, length, k, dtype=torch.float32)
    index = torch.empty(n, length, k, dtype=torch.int32)
    for start in tqdm(range(0, n, batch_chunks), desc="teacher top-k", unit="chunk", disable=not progress):
        hidden = features.hidden[start : start + batch_chunks].float()
        values, columns = target_logits(target, hidden, vocab).log_softmax(-1).topk(k, dim=-1)
        log_p[start : start + batch_chunks] = values
        index[start : start + batch_chunks] = columns.to(torch.int32)
    return Teacher(log_p, index)


def coarse_kl(log_p: torch.Tensor, index: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """Per-position KL between ``p'`` and ``q`` coarsened to the top-``k`` buckets plus the tail (module
    docstring). ``log_p``, ``index`` ``(..., k)`` from :class:`Teacher`; ``q_logits`` ``(..., |V'|)``."""
    log_q = q_logits.float().log_softmax(-1)
    log_q_top = log_q.gather(-1, index.long())
    p_top = log_p.exp()
    head = (p_top * (log_p - log_q_top)).sum(-1)
    p_tail = (1 - p_top.sum(-1)).clamp_min(0.0)
    q_tail = (1 - log_q_top.exp().sum(-1)).clamp_min(1e-12)
    tail = torch.where(p_tail > 0, p_tail * (p_tail.clamp_min(1e-30).log() - q_tail.log()), 0.0)
    return head + tail
