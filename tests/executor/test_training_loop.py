"""The shared training pieces: the ridge solution and the held-out distribution totals, against oracles."""

from __future__ import annotations

import pytest
import torch

from executor.training.loop import agreement_sums, ridge_solve


def test_ridge_solve_recovers_an_exact_affine_map_and_reports_r2_one():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(400, 6, generator=generator)
    weight, bias = torch.randn(3, 6, generator=generator), torch.randn(3, generator=generator)
    w, b, r2 = ridge_solve(x, x @ weight.T + bias, 1e-12)
    torch.testing.assert_close(w, weight, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b, bias, atol=1e-5, rtol=1e-5)
    assert r2 == pytest.approx(1.0, abs=1e-9)
    # A strong ridge shrinks the map towards zero (the intercept then carries the mean).
    assert float(ridge_solve(x, x @ weight.T + bias, 1e3)[0].abs().max()) < 0.1


def test_agreement_sums_match_an_enumeration():
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.1, 0.7]])
    q_logits = torch.tensor([[0.0, 0.0, float("-inf"), -1.0], [1.0, 0.0, float("-inf"), 2.0]])
    vocab = torch.tensor([0, 1, 3])
    totals = agreement_sums(p, q_logits, vocab)
    q = q_logits.softmax(-1).double()
    p64 = p.double()
    assert totals["sum_min"] == pytest.approx(float(torch.minimum(p64, q).sum()), abs=1e-6)
    assert totals["top1"] == 2.0  # row 0: a tie in q, argmax takes token 0 = argmax p; row 1: both pick 3
    kl = 0.0
    for row in range(2):
        pr = p64[row, vocab] / p64[row, vocab].sum()
        qr = q[row, vocab]
        kl += float(sum(a * (a / b).log() for a, b in zip(pr, qr, strict=True) if a > 0))
    assert totals["kl"] == pytest.approx(kl, abs=1e-5)
