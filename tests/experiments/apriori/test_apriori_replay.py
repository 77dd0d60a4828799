"""The replay column of `specbound validate`: the executor's verifiers against their theory twins.

Given everything before a node's children are drawn, the node is accepted with exactly the verifier's theory
acceptance ``pi``, so ``sum(a - pi) / sqrt(sum pi (1 - pi))`` is approximately standard normal when the
executor and the theory agree. Threshold: |z| < 4 (a false alarm has probability ~6e-5 per configuration).
Negative control: a verifier with the target and draft letters swapped (accept with min(1, q/p), the classic
bug of papers that call the target q) is caught with |z| > 4.
"""

import numpy as np
import pytest

from experiments.apriori.predict import DecoderConfig
from experiments.apriori.report import _replay
from experiments.apriori.run import run_generation
from tests.tiny_models import build_tiny_model

CONFIGS = (
    DecoderConfig("chain-g3", "chain", gamma=3),
    DecoderConfig("rrs-n3", "multidraft", verifier="rrs", n=3),
    DecoderConfig("rrs_wor-n2", "multidraft", verifier="rrs_wor", n=2),
    DecoderConfig("kseq-n3", "multidraft", verifier="kseq", n=3),
    DecoderConfig("spechub-n2", "multidraft", verifier="spechub", n=2),
    DecoderConfig("greedy-n3", "multidraft", verifier="greedy", n=3),
    DecoderConfig("optimal-n3", "multidraft", verifier="optimal", n=3),
)


def replay_z(config: DecoderConfig, runs: int = 60, tokens: int = 16) -> tuple[float, int]:
    # Early exit after 1 of 8 layers: q is far enough from p that the verifiers differ clearly.
    model = build_tiny_model(seed=3, vocab_size=10, n_layers=8, max_seq_len=64)
    rng = np.random.default_rng(0)
    units = [
        run_generation(
            config,
            model,
            rng.integers(0, 10, size=4).tolist(),
            drafter="early-exit:1",
            temperature=1.0,
            max_new_tokens=tokens,
            seed=run,
        )
        for run in range(runs)
    ]
    _, z = _replay(units)
    return z, sum(len(unit["records"]) for unit in units)


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=lambda config: config.label)
def test_replay_acceptance_agrees_with_the_theory_on_a_tiny_model(config):
    z, events = replay_z(config)
    assert events >= 300
    assert abs(z) < 4, z


@pytest.mark.slow
def test_replay_detects_a_verifier_whose_acceptance_is_not_its_theory(monkeypatch):
    import executor.decoders.tree as tree_module

    real_verifier = tree_module.verify_multidraft_unchecked

    def verify_with_letters_swapped(name, target_probs, draft_probs, drafts, generator):
        return real_verifier(name, draft_probs, target_probs, drafts, generator)

    monkeypatch.setattr(tree_module, "verify_multidraft_unchecked", verify_with_letters_swapped)
    z, _ = replay_z(DecoderConfig("rrs-n3", "multidraft", verifier="rrs", n=3))
    assert abs(z) > 4, z
