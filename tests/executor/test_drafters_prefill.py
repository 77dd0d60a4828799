"""The drafters' ``prefill`` hook: a drafter with a model of its own reads the prompt in the generation's prefill,
and drafts exactly as when its first root pass catches up instead."""

from __future__ import annotations

import pytest
import torch

from executor.decoders import ChainDecoder, Sampling
from executor.drafters import LookupFirstDrafter, ModelDrafter, PromptLookupDrafter
from executor.methods.easyspec import LayerParallelDrafter
from tests.executor.test_decoders import PROMPT, VOCAB, flat_tiny_model
from tests.executor.test_drafters_falcon import drafter_for as falcon_drafter
from tests.executor.test_drafters_feature import drafter_for as feature_drafter

LONG_PROMPT = PROMPT * 3  # 15 tokens: a catch-up of many entries against one


class WithoutPrefill:
    """``inner`` with its ``prefill`` hidden: the lazy path, where the first step's root pass reads the prompt."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        if name == "prefill":
            raise AttributeError(name)
        return getattr(self.inner, name)


def drafters(tiny_model, target) -> dict:
    """Each prompt-reading drafter, and how far into the prompt it has read after the prefill."""
    committed = len(LONG_PROMPT) - 1
    return {
        # Head entries 1 .. committed - 1: the last one is the first root pass's, as in a steady step.
        "feature": (lambda: feature_drafter(target), lambda d: d.length, committed - 1),
        "falcon": (lambda: falcon_drafter(target), lambda d: d.length, committed - 1),
        "model": (
            lambda: ModelDrafter(tiny_model(9, vocab_size=VOCAB, max_seq_len=32)),
            lambda d: d.length,
            committed,
        ),
        "easyspec": (lambda: LayerParallelDrafter(target, 1, exact_layers=0), lambda d: d.length, committed),
        "hybrid": (
            lambda: LookupFirstDrafter(PromptLookupDrafter(min_ngram=2), feature_drafter(target)),
            lambda d: d.model.length,
            committed - 1,
        ),
    }


NAMES = ["feature", "falcon", "model", "easyspec", "hybrid"]


@pytest.mark.parametrize("name", NAMES)
def test_prefill_reads_the_prompt_before_the_first_step(tiny_model, name):
    target = flat_tiny_model(tiny_model, 3)
    make, read, expected = drafters(tiny_model, target)[name]
    drafter = make()
    ChainDecoder(target, drafter, gamma=2).generate(LONG_PROMPT, 0)
    assert read(drafter) == expected
    # Negative control: without the hook nothing is read before the first step.
    lazy = make()
    ChainDecoder(target, WithoutPrefill(lazy), gamma=2).generate(LONG_PROMPT, 0)
    assert read(lazy) == 0


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_drafting_after_the_prefill_equals_the_lazy_catch_up(tiny_model, name, temperature):
    target = flat_tiny_model(tiny_model, 3)
    make, _, _ = drafters(tiny_model, target)[name]
    results = []
    for drafter in (make(), WithoutPrefill(make())):
        decoder = ChainDecoder(
            target, drafter, gamma=3, sampling=Sampling(temperature=temperature), log_distributions="full"
        )
        results.append(decoder.generate(LONG_PROMPT, 12, generator=torch.Generator().manual_seed(4)))
    eager, lazy = results
    assert eager.token_ids == lazy.token_ids
    assert len(eager.steps) == len(lazy.steps)
    for ours, theirs in zip(eager.steps, lazy.steps, strict=True):
        assert ours.tokens == theirs.tokens
        if ours.distributions is not None:
            torch.testing.assert_close(
                torch.as_tensor(ours.distributions.q),
                torch.as_tensor(theirs.distributions.q),
                atol=1e-5,
                rtol=0,
            )
