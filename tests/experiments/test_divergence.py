"""experiments.divergence.first_divergence: where greedy output departs from plain decoding, and whether the
target's logits there were one rounding step apart (a bfloat16 tie) or further."""

from __future__ import annotations

import pytest
import torch

from experiments.divergence import first_divergence
from tests.tiny_models import build_tiny_model


class FixedLogits:
    """A stand-in model whose next-token logits are always ``logits`` (in their dtype)."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits
        self.tok_embeddings = torch.nn.Embedding(1, 1)
        self.seen: list[list[int]] = []

    def setup_cache(self, length: int) -> None:
        pass

    def __call__(self, ids, positions):
        self.seen.append(ids[0].tolist())
        return self.logits.expand(1, ids.shape[1], -1)


@pytest.mark.parametrize(
    ("values", "within"),
    [
        ([33.0, 33.25, 20.0], True),  # bf16 spacing at 33 is 0.25: one step apart
        ([33.0, 33.0, 20.0], True),  # tied
        ([33.0, 33.5, 20.0], False),  # two steps apart
        ([16.25, 16.375, 0.0], True),  # spacing 0.125 at 16
    ],
)
def test_bfloat16_divergences_are_measured_against_the_rounding_step(values, within):
    model = FixedLogits(torch.tensor(values, dtype=torch.bfloat16))
    found = first_divergence(model, [5, 6], [0, 0, 1, 2], [0, 0, 0, 2])
    assert found["position"] == 2 and (found["reference_token"], found["token"]) == (1, 0)
    assert model.seen == [[5, 6, 0, 0]]  # the prompt and the common prefix, once
    assert found["gap"] == pytest.approx(abs(values[1] - values[0]))
    assert found["within_one_step"] is within


def test_a_bfloat16_model_bounds_the_precision_of_logits_handed_back_in_float32():
    model = FixedLogits(torch.tensor([33.0, 33.25, 20.0], dtype=torch.float32))
    model.tok_embeddings = model.tok_embeddings.to(torch.bfloat16)
    found = first_divergence(model, [5], [1], [0])
    assert found["spacing"] == 0.25 and found["within_one_step"] is True
    assert found["logits"] == [33.25, 33.0]


def test_identical_output_has_no_divergence_and_float32_gaps_are_real():
    model = build_tiny_model(3, vocab_size=8, max_seq_len=32)
    assert first_divergence(model, [1, 2], [3, 4, 5], [3, 4, 5]) is None
    assert first_divergence(model, [1, 2], [3, 4, 5], [3, 4])["position"] == 2  # ended early (eos)
    model.setup_cache(3)
    logits = model(torch.tensor([[1, 2, 3]]), torch.arange(3))[0, -1]
    best, second = logits.topk(2).indices.tolist()
    found = first_divergence(model, [1, 2], [3, best], [3, second])
    assert found["gap"] == pytest.approx(float(logits[best] - logits[second]), rel=1e-6)
    assert found["spacing"] < 1e-5 and found["within_one_step"] is False
