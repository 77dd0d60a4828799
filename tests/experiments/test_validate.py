"""specbound validate: event extraction, the martingale summary, and agreement with the theory on tiny models.

The statistical test: on a random tiny llama model, each decoder's measured acceptance must agree with the
theory's exact prediction (|z| < 4, fixed seeds). The negative control swaps the executor's multi-draft
verifier for one with the target and draft letters swapped: the same test must then report |z| > 4.
"""

import math

import numpy as np
import pytest

from executor.logs import StepLog
from experiments.validate import DEFAULT_DECODERS, DecoderSpec, run_unit, verification_events
from experiments.validation_report import summarise
from tests.tiny_models import build_tiny_model


def test_chain_events_stop_at_the_first_rejection():
    # Chain of 3 drafts; the walk accepted node 1 and rejected node 2.
    step = StepLog(
        tokens=[5, 1, 2, 3],
        parents=[-1, 0, 1, 2],
        accepted_path=[0, 1],
        emitted=[1, 7],
        expanded=[0, 1, 2],
        accepted=[True, False, False],
    )
    assert list(verification_events(step)) == [(0, 1, True, 0), (1, 1, False, 1)]


def test_tree_events_follow_the_accepted_path_and_count_children():
    # Root with two children; child 1 has two children of its own, child 2 one; the walk went 0 -> 1 -> 3.
    step = StepLog(
        tokens=[0, 1, 2, 3, 4, 5],
        parents=[-1, 0, 0, 1, 1, 2],
        accepted_path=[0, 1, 3],
        emitted=[1, 3, 9],
        expanded=[0, 1, 2],
        accepted=[True, True],
    )
    assert list(verification_events(step)) == [(0, 2, True, 0), (1, 2, True, 1)]


def test_summary_reports_the_martingale_z_score_and_predicted_tau():
    unit = {
        "steps": 4,
        "tokens": 6,
        "wall_time": 2.0,
        "evidence": {
            "predicted": [0.5, 0.5, 0.5, 0.5],
            "accepted": [1, 1, 0, 0],
            "bound": [1.0] * 4,
            "depth": [0] * 4,
        },
    }
    summary = summarise([unit])
    assert summary["measured_acceptance"] == 0.5 and summary["z"] == 0.0
    assert summary["predicted_tau"] == pytest.approx(1 + 2.0 / 4) and summary["measured_tau"] == 1.5
    assert summary["efficiency"] == 0.5
    assert summary["acceptance_ci95"] == pytest.approx(1.96 * math.sqrt(4 * 0.25) / 4)


def pooled_summary(spec: DecoderSpec, runs: int = 80, tokens: int = 16) -> dict:
    # Early exit after 1 of 8 layers: q is far enough from p that three drafts accept clearly more than one.
    model = build_tiny_model(seed=3, vocab_size=10, n_layers=8, max_seq_len=64)
    rng = np.random.default_rng(0)
    units = []
    for run in range(runs):
        prompt = rng.integers(0, 10, size=4).tolist()
        units.append(
            run_unit(
                spec, model, prompt, drafter="early-exit:1", temperature=1.0, max_new_tokens=tokens, seed=run
            )
        )
    return summarise(units)


@pytest.mark.slow
@pytest.mark.parametrize("spec", DEFAULT_DECODERS, ids=lambda spec: spec.label)
def test_measured_acceptance_agrees_with_the_theory_on_a_tiny_model(spec):
    summary = pooled_summary(spec)
    assert summary["events"] >= 400
    assert abs(summary["z"]) < 4, summary
    assert summary["predicted_acceptance"] <= summary["optimal_acceptance"] + 1e-9


@pytest.mark.slow
def test_validation_detects_a_verifier_whose_acceptance_is_not_its_theory(monkeypatch):
    import executor.decoders.tree as tree_module

    real_verifier = tree_module.verify_multidraft

    def verify_with_letters_swapped(name, target_probs, draft_probs, drafts, generator):
        # The classic bug of papers that name the target q: accept with min(1, q/p), residual (q - p)+.
        return real_verifier(name, draft_probs, target_probs, drafts, generator)

    monkeypatch.setattr(tree_module, "verify_multidraft", verify_with_letters_swapped)
    summary = pooled_summary(DecoderSpec("rrs-n3", "multidraft", "rrs", n=3))
    assert abs(summary["z"]) > 4, summary
