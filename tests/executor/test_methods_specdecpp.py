"""executor.methods.specdecpp: the paper's weighted soft BCE, the candidates' labels (exact at temperature 0),
the acceptance head learning a planted signal (and not a random one), its cache, and the method with a
trained head staying lossless (greedy identity; the exact law of the next three tokens at temperature 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from executor import methods
from executor.decoders import AutoregressiveDecoder, Sampling
from executor.decoders import chain as chain_module
from executor.drafters import EarlyExitDrafter
from executor.methods.specdecpp import (
    STATISTICS,
    AcceptanceExamples,
    acceptance_examples,
    head_input,
    rank_auc,
    train_acceptance_head,
    weighted_soft_bce,
)
from tests.executor.test_decoders import P_THRESHOLD, PROMPT, exact_law, outcome_p_value
from tests.executor.test_drafters_feature import drafter_for
from tests.executor.test_methods import _chain_letters_swapped, sample_outcomes

VOCAB = 8
CALIBRATION = [[3, 1, 4, 1, 5], [2, 7, 1, 6]]


class CharTokenizer:
    """Characters to ids modulo the tiny vocabulary (enough to build training prompts for a tiny model)."""

    eos_id = 0

    def encode(self, text: str) -> list[int]:
        return [1 + ord(c) % (VOCAB - 1) for c in text]


def spread_model(tiny_model, seed: int = 3):
    """A 4-layer tiny model with spread-out laws and room for the head's training prompts (96 + 48 tokens)."""
    model = tiny_model(seed, vocab_size=VOCAB, n_layers=4, max_seq_len=160)
    with torch.no_grad():
        model.norm.weight.mul_(0.12)
    return model


def test_weighted_soft_bce_is_the_papers_formula():
    logits = torch.tensor([0.3, -1.2, 2.0, 0.0])
    labels = torch.tensor([1.0, 0.0, 0.25, 0.5])
    p = 1 / (1 + np.exp(-logits.numpy().astype(np.float64)))
    y = labels.numpy().astype(np.float64)
    for w in (1.0, 6.0):
        expected = -np.sum(w * (1 - y) * np.log(1 - p) + y * np.log(p)) / np.sum(w * (1 - y) + y)
        assert float(weighted_soft_bce(logits, labels, w)) == pytest.approx(expected, rel=1e-6)
    # w = 1 is the plain mean binary cross-entropy.
    plain = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    assert float(weighted_soft_bce(logits, labels, 1.0)) == pytest.approx(float(plain), rel=1e-6)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=1, max_size=30),
)
def test_rank_auc_is_the_fraction_of_accepted_rejected_pairs_ordered_right(pairs):
    scores = np.array([s for s, _ in pairs], dtype=float)
    accepted = np.array([a for _, a in pairs])
    auc = rank_auc(scores, accepted)
    positives, negatives = scores[accepted], scores[~accepted]
    if not len(positives) or not len(negatives):
        assert auc is None
        return
    wins = sum((a > b) + 0.5 * (a == b) for a in positives for b in negatives)
    assert auc == pytest.approx(wins / (len(positives) * len(negatives)), abs=1e-12)
    assert rank_auc(-scores, accepted) == pytest.approx(1 - auc, abs=1e-12)


def test_head_input_appends_the_top_probability_and_entropy_even_where_probabilities_underflow():
    feature = torch.arange(4.0)
    logits = torch.tensor([0.0, 0.0, -1e4, float("-inf")])  # two equal tokens, two of probability 0
    row = head_input(feature, logits)
    assert row.shape == (4 + STATISTICS,) and torch.isfinite(row).all()
    assert row[:4].tolist() == feature.tolist()
    assert row[4].item() == pytest.approx(0.5) and row[5].item() == pytest.approx(np.log(2), rel=1e-6)


def _planted(count: int, seed: int, signal: bool) -> AcceptanceExamples:
    generator = np.random.default_rng(seed)
    features = torch.as_tensor(generator.normal(size=(count, 16 + STATISTICS)), dtype=torch.float32)
    labels = (
        (features[:, 3] > 0).double().numpy() if signal else generator.integers(0, 2, count).astype(float)
    )
    return AcceptanceExamples(
        features=features,
        labels=labels,
        accepted=labels > 0.5,
        reached=np.ones(count, dtype=bool),
        depth=np.ones(count, dtype=int),
        confidence=generator.random(count),
        draft_seconds=1.0,
        verify_seconds=1.0,
    )


def test_the_head_learns_a_planted_signal_and_not_a_random_one():
    _, learned = train_acceptance_head(_planted(600, 0, signal=True), steps=300, seed=0)
    assert learned["held_out_auc"] > 0.95
    assert learned["held_out_loss_after"] < 0.5 * learned["held_out_loss_before"]
    # Negative control: labels independent of the features leave the held-out ranking at chance.
    _, random = train_acceptance_head(_planted(600, 0, signal=False), steps=300, seed=0)
    assert abs(random["held_out_auc"] - 0.5) < 0.1
    assert 1 <= random["best_step"] <= 300


def test_training_without_features_or_on_one_candidate_is_refused():
    examples = _planted(10, 0, signal=True)
    with pytest.raises(ValueError, match="no features"):
        train_acceptance_head(AcceptanceExamples(**{**examples.__dict__, "features": None}))
    one = AcceptanceExamples(
        **{k: v[:1] if hasattr(v, "__len__") else v for k, v in examples.__dict__.items()}
    )
    with pytest.raises(ValueError, match="at least 2 candidates"):
        train_acceptance_head(one)


def test_candidate_labels_are_exact_at_temperature_zero_and_consistent_at_one(tiny_model):
    model = spread_model(tiny_model)
    greedy = acceptance_examples(
        model, lambda: drafter_for(model), CALIBRATION, max_length=3, temperature=0.0, max_new_tokens=12
    )
    assert greedy.features.shape == (len(greedy), model.config.dim + STATISTICS)
    assert set(np.unique(greedy.labels)) <= {0.0, 1.0}
    # Greedy: a verified candidate is accepted iff the target's argmax is the draft's (label 1).
    assert np.array_equal(greedy.labels[greedy.reached] == 1.0, greedy.accepted[greedy.reached])
    assert set(np.unique(greedy.depth)) <= {1, 2, 3} and greedy.reached[greedy.depth == 1].all()
    assert greedy.draft_seconds > 0 and greedy.verify_seconds > 0
    sampled = acceptance_examples(
        model, lambda: drafter_for(model), CALIBRATION, max_length=3, temperature=1.0, max_new_tokens=12
    )
    assert ((0 <= sampled.labels) & (sampled.labels <= 1)).all()
    verified = sampled.reached
    assert sampled.accepted[verified & (sampled.labels == 1.0)].all()  # accepted with probability 1
    assert not sampled.accepted[verified & (sampled.labels == 0.0)].any()  # with probability 0
    assert not sampled.accepted[~verified].any()


def test_the_trained_head_is_cached_reused_and_decodes_greedy_exact(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = spread_model(tiny_model)
    drafter = drafter_for(model)

    def method():
        return methods.get("specdecpp")(model, CharTokenizer(), drafter=lambda: drafter, max_length=3)

    first = method()
    assert first.head == "trained" and first.options()["head"] == "trained"
    prediction = first.predict(CALIBRATION, 0.0, 8)
    assert prediction.details["head_card"]["cached"] is False and prediction.train_seconds > 0
    assert 1 <= prediction.predicted_tau <= 4 and 0 <= prediction.details["threshold"] <= 1
    assert list(tmp_path.glob("specbound/drafters/specdecpp-head-*/card.json"))
    second = method()
    assert second.predict(CALIBRATION, 0.0, 8).details["head_card"]["cached"] is True
    reference = AutoregressiveDecoder(model).generate(PROMPT, 16).token_ids
    assert second.run(PROMPT, temperature=0.0, max_new_tokens=16).token_ids == reference


def test_head_options_are_checked_against_the_drafter(tiny_model):
    model = spread_model(tiny_model)
    with pytest.raises(ValueError, match="head must be one of"):
        methods.get("specdecpp")(model, head="oracle", exit_layer=1)
    with pytest.raises(ValueError, match="head='trained' reads the drafter's features"):
        methods.get("specdecpp")(model, head="trained", drafter=lambda: EarlyExitDrafter(model, 1))
    # Without features the default is the confidence calibration.
    assert methods.get("specdecpp")(model, drafter=lambda: EarlyExitDrafter(model, 1)).head == "confidence"


@pytest.mark.slow
@pytest.mark.parametrize("broken", [False, True])
def test_specdecpp_with_a_trained_head_samples_the_exact_target_law(
    tiny_model, tmp_path, monkeypatch, broken
):
    """The law of the next three tokens by a G-test; negative control: the same samples and threshold reject
    the method when its chain verifier accepts with min(1, q/p)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = spread_model(tiny_model)
    drafter = drafter_for(model)
    method = methods.get("specdecpp")(model, CharTokenizer(), drafter=lambda: drafter, max_length=3)
    method.predict(CALIBRATION, 1.0, 6)
    law = exact_law(model, Sampling(temperature=1.0))
    if broken:
        monkeypatch.setattr(chain_module, "verify_chain", _chain_letters_swapped)
    p_value = outcome_p_value(sample_outcomes(method, seed=11), law)
    if broken:
        assert p_value < P_THRESHOLD, f"the broken verifier went unnoticed: p = {p_value:.2e}"
    else:
        assert p_value > P_THRESHOLD, f"G-test p = {p_value:.2e}"


def test_the_heuristic_schedule_grows_by_two_after_full_acceptance_and_shrinks_by_one_otherwise():
    from types import SimpleNamespace

    from executor.methods.specdecpp import HeuristicSchedule

    policy = HeuristicSchedule(max_length=8)
    lengths = [policy.round_length()]
    for accepted in ([True] * 5, [True] * 7, [True] * 8, [True, False], [False], [], [False] * 6):
        policy.after_step(SimpleNamespace(accepted=accepted))
        lengths.append(policy.round_length())
    # transformers: start 5, +2 when every draft was accepted, else -1, floor 1; capped here at max_length.
    assert lengths == [5, 7, 8, 8, 7, 6, 6, 5]
    low = HeuristicSchedule(max_length=8, start=1)
    low.after_step(SimpleNamespace(accepted=[False]))
    assert low.round_length() == 1
    assert HeuristicSchedule(max_length=3).round_length() == 3


def test_the_fixed_baseline_drafts_the_theorys_best_length_every_round(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = spread_model(tiny_model)
    method = methods.get("specdecpp-fixed")(model, drafter=lambda: drafter_for(model), max_length=4)
    assert method.head == "confidence"
    prediction = method.predict(CALIBRATION, 0.0, 8)
    speedups = prediction.details["fixed_k_speedup"]
    best = max(range(1, 5), key=lambda k: (speedups[k], -k))
    assert method.length == best and prediction.details["rule"] == f"fixed K={best}"
    decoder = method.build(0.0)
    result = decoder.generate(PROMPT, 16)
    assert set(decoder.drafted_lengths[1:]) == {best}  # step 1 may have no feature yet to draft from
    assert result.token_ids == AutoregressiveDecoder(model).generate(PROMPT, 16).token_ids
    forced = methods.get("specdecpp-fixed")(model, drafter=lambda: drafter_for(model), max_length=4, length=2)
    forced.predict(CALIBRATION, 0.0, 8)
    assert forced.length == 2
