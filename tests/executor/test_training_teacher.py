"""The cached top-k teacher and the coarsened KL: exact against the full KL, a lower bound, zero iff matched."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.training.features import FeatureSet, target_logits
from executor.training.teacher import Teacher, coarse_kl, teacher_topk


def full_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    log_p, log_q = p_logits.double().log_softmax(-1), q_logits.double().log_softmax(-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def bucketed_kl(p_logits, q_logits, k):
    """Oracle: build the k+1 buckets explicitly and take the KL between the two bucket distributions."""
    p, q = p_logits.double().softmax(-1), q_logits.double().softmax(-1)
    index = p.topk(k, -1).indices
    p_b = torch.cat([p.gather(-1, index), 1 - p.gather(-1, index).sum(-1, keepdim=True)], -1)
    q_b = torch.cat([q.gather(-1, index), 1 - q.gather(-1, index).sum(-1, keepdim=True)], -1)
    terms = torch.where(p_b > 0, p_b * (p_b.clamp_min(1e-300).log() - q_b.log()), 0.0)
    return terms.sum(-1)


def topk_of(p_logits, k):
    values, index = p_logits.log_softmax(-1).topk(k, -1)
    return values, index.to(torch.int32)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 11))
def test_coarse_kl_equals_the_kl_of_the_explicit_buckets_and_never_exceeds_the_full_kl(seed, k):
    generator = torch.Generator().manual_seed(seed)
    p_logits, q_logits = (
        2 * torch.randn(2, 3, 12, generator=generator),
        2 * torch.randn(2, 3, 12, generator=generator),
    )
    got = coarse_kl(*topk_of(p_logits, k), q_logits).double()
    torch.testing.assert_close(got, bucketed_kl(p_logits, q_logits, k), atol=2e-5, rtol=1e-4)
    assert bool((got <= full_kl(p_logits, q_logits) + 2e-5).all())


def test_coarse_kl_with_every_token_is_the_full_kl():
    generator = torch.Generator().manual_seed(0)
    p_logits, q_logits = torch.randn(4, 20, generator=generator), torch.randn(4, 20, generator=generator)
    torch.testing.assert_close(
        coarse_kl(*topk_of(p_logits, 20), q_logits).double(),
        full_kl(p_logits, q_logits),
        atol=1e-5,
        rtol=1e-5,
    )


def test_coarse_kl_is_zero_at_the_teacher_and_positive_for_a_wrong_head():
    generator = torch.Generator().manual_seed(1)
    p_logits = torch.randn(5, 30, generator=generator)
    teacher = topk_of(p_logits, 4)
    assert float(coarse_kl(*teacher, p_logits).abs().max()) < 1e-5
    # Negative control: a head that is right outside the top 4 but permutes them is penalised.
    permuted = p_logits.clone()
    index = teacher[1].long()
    permuted.scatter_(-1, index, p_logits.gather(-1, index.flip(-1)))
    assert float(coarse_kl(*teacher, permuted).min()) > 1e-3


def test_gradient_of_coarse_kl_moves_q_towards_p():
    generator = torch.Generator().manual_seed(2)
    p_logits = 3 * torch.randn(1, 16, generator=generator)
    q_logits = torch.zeros(1, 16, requires_grad=True)
    teacher = topk_of(p_logits, 5)
    optimizer = torch.optim.SGD([q_logits], lr=1.0)
    start = float(full_kl(p_logits, q_logits.detach()))
    for _ in range(200):
        optimizer.zero_grad()
        coarse_kl(*teacher, q_logits).sum().backward()
        optimizer.step()
    assert float(full_kl(p_logits, q_logits.detach())) < 0.2 * start


def test_teacher_topk_matches_the_target_distribution_on_the_draft_vocabulary(tiny_model):
    model = tiny_model(4, vocab_size=16, max_seq_len=32)
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(3, 7, model.config.dim, generator=generator)
    features = FeatureSet(
        tokens=torch.zeros(3, 7, dtype=torch.int64), hidden=hidden, topk_counts=torch.zeros(16)
    )
    vocab = torch.tensor([0, 2, 3, 5, 8, 9, 11, 15])
    teacher = teacher_topk(model, features, vocab, 3, batch_chunks=2)
    expected = target_logits(model, hidden, vocab).log_softmax(-1).topk(3, -1)
    torch.testing.assert_close(teacher.log_p, expected.values)
    assert torch.equal(teacher.index.long(), expected.indices)
    with pytest.raises(ValueError, match="k must be"):
        teacher_topk(model, features, vocab, 9)
    with pytest.raises(ValueError, match="one shape"):
        Teacher(teacher.log_p, teacher.index[..., :2])
