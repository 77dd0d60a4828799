"""The three modelling fixes of the a-priori loop, each against an oracle derived here.

* per-step overhead (experiments.apriori.run.StepClock, overhead_per_step, predict's step time): the clock's
  parts add up, the model gets its own forward back, the prediction charges exactly the overheads;
* the confidence-bucket model per depth (calibrate.depth_buckets, predict.depth_length_law): hand-computed
  frequencies and shrunk acceptances; with the same law at every depth the path enumeration is the theory's
  count-merged one; with one bucket per depth it is Leviathan's positional sum;
* calibration noise (report.calibration_resamples, compare.difference_interval): resamples keep the point
  calibration's edges and overheads; the joint interval is the percentile interval of the differences.
"""

import itertools

import numpy as np
import pytest
import torch

import theory
from executor.decoders import ChainDecoder, Sampling
from executor.drafters import EarlyExitDrafter
from experiments.apriori.calibrate import Calibration, LatencyProfile, calibrate, depth_buckets
from experiments.apriori.compare import difference_interval, within_ci
from experiments.apriori.predict import (
    DecoderConfig,
    _theory_rule,
    bucket_model,
    depth_length_law,
    length_law,
    predict,
)
from experiments.apriori.report import calibration_resamples, multidraft_table
from experiments.apriori.run import StepClock, overhead_per_step
from tests.tiny_models import build_tiny_model

LATENCY = LatencyProfile({n: 1.0 + 0.1 * (n - 1) for n in range(1, 13)}, 0.2)
POOLED = {"edges": [0.5], "confidence": [0.3, 0.9], "acceptance": [0.2, 0.9], "probability": [0.4, 0.6]}


def calibration(depth_laws=(), overhead=None) -> Calibration:
    return Calibration(
        temperature=1.0,
        positional=[0.6] * 3,
        rank_matrix=[[0.6, 0.2]] * 3,
        multidraft={"rrs-n2": 0.7, "optimal-n2": 0.72, "rrs-n4": 0.8},
        bound={"rrs-n2": 0.72, "optimal-n2": 0.72, "rrs-n4": 0.85},
        buckets=POOLED,
        events=[100] * 3,
        latency=LATENCY,
        depth_buckets=list(depth_laws),
        overhead=dict(overhead or {}),
    )


# --- overhead -----------------------------------------------------------------------------------------------


def test_prediction_charges_the_configuration_and_baseline_overheads():
    config = DecoderConfig("chain-g2", "chain", gamma=2)
    bare = predict(config, calibration())
    charged = predict(config, calibration(overhead={"chain-g2": 0.3, "ar": 0.1}))
    assert charged.tau == bare.tau
    assert charged.step_time == pytest.approx(bare.step_time + 0.3)
    assert charged.speedup == pytest.approx(bare.tau * (1.0 + 0.1) / (bare.step_time + 0.3))
    assert charged.detail["speedup_passes_only"] == pytest.approx(bare.speedup)
    assert predict(DecoderConfig("ar", "ar"), calibration(overhead={"ar": 0.1})).speedup == pytest.approx(1.0)


def test_overhead_per_step_is_the_time_beyond_target_and_draft_passes():
    units = [
        {"steps": 4, "step_seconds": 2.0, "target_seconds": 1.0, "draft_seconds": 0.6},
        {"steps": 6, "step_seconds": 3.0, "target_seconds": 1.5, "draft_seconds": 0.9},
    ]
    assert overhead_per_step(units) == pytest.approx((0.4 + 0.6) / 10)
    assert overhead_per_step([{"steps": 3, "seconds": 1.0}]) == 0.0  # a unit from before the clock


def test_step_clock_splits_a_generation_and_gives_the_model_its_forward_back():
    torch.manual_seed(0)
    model = build_tiny_model(seed=1, vocab_size=12, n_layers=4, max_seq_len=64)
    decoder = ChainDecoder(model, EarlyExitDrafter(model, 2), gamma=3, sampling=Sampling(temperature=1.0))
    from experiments.apriori.calibrate import RecordingDrafter

    recorder = RecordingDrafter(decoder.drafter)
    recorder.attach(decoder)
    clock = StepClock(model, decoder, recorder)
    result = decoder.generate([1, 2, 3], 12, generator=torch.Generator().manual_seed(0))
    clock.detach()
    draft = sum(t for _, _, t in recorder.call_times)
    assert clock.target_seconds > 0 and draft > 0
    assert clock.target_seconds + draft <= clock.step_seconds + 1e-9
    assert clock.step_seconds <= result.wall_time
    assert "forward" not in model.__dict__  # the class's forward again


# --- the bucket model per depth -------------------------------------------------------------------------------


def record(depth: int, confidence: float, chain: float) -> dict:
    return {"depth": depth, "confidence": confidence, "chain": chain}


def test_depth_buckets_are_per_depth_frequencies_and_shrunk_acceptances():
    records = [record(0, 0.9, 1.0)] * 6 + [record(0, 0.3, 0.0)] * 2 + [record(1, 0.3, 0.5)] * 5
    laws = depth_buckets(records, POOLED, 3)
    assert laws[0]["probability"] == pytest.approx([0.25, 0.75])
    m = 5  # MIN_EVENTS pseudo-events at the pooled acceptance
    assert laws[0]["acceptance"] == pytest.approx([(0 + m * 0.2) / (2 + m), (6 + m * 0.9) / (6 + m)])
    assert laws[1]["probability"] == pytest.approx([1.0, 0.0])
    assert laws[1]["acceptance"] == pytest.approx([(2.5 + m * 0.2) / (5 + m), 0.9])
    assert laws[2] == laws[1]  # no depth-2 events: the depth above is carried down


@pytest.mark.parametrize("rule", ["specdecpp", "kangaroo"])
@pytest.mark.parametrize("threshold", [0.05, 0.4, 0.8])
def test_the_same_law_at_every_depth_gives_the_pooled_enumeration(rule, threshold):
    horizon = 4
    law = {"probability": POOLED["probability"], "acceptance": POOLED["acceptance"]}
    theory_rule = _theory_rule(rule, threshold, horizon)
    k_law, reach = depth_length_law(theory_rule, POOLED, [law] * horizon)
    pooled_k, pooled_reach = length_law(theory_rule, bucket_model(calibration(), horizon))
    assert k_law == pytest.approx(pooled_k) and reach == pytest.approx(pooled_reach)
    assert k_law.sum() == pytest.approx(1.0)


def test_one_bucket_per_depth_is_the_positional_chain():
    alphas = [0.9, 0.5, 0.2]
    laws = [{"probability": [1.0], "acceptance": [a]} for a in alphas]
    belief = {"edges": [], "confidence": [0.5], "acceptance": [0.5], "probability": [1.0]}
    never = _theory_rule("kangaroo", 0.0, 3)  # confidence 0.5 >= 0: never stops
    k_law, reach = depth_length_law(never, belief, laws)
    assert k_law == pytest.approx([0, 0, 0, 1])
    assert 1 + reach.sum() == pytest.approx(theory.expected_tokens(np.array(alphas), 3))


def test_depth_law_enumerates_every_bucket_path():
    """Oracle: sum over all bucket paths of a horizon-3 chain that never stops."""
    laws = [
        {"probability": [0.3, 0.7], "acceptance": [0.1, 0.8]},
        {"probability": [0.6, 0.4], "acceptance": [0.2, 0.7]},
        {"probability": [0.9, 0.1], "acceptance": [0.3, 0.6]},
    ]
    never = _theory_rule("kangaroo", 0.0, 3)
    _, reach = depth_length_law(never, POOLED, laws)
    expected = np.zeros(3)
    for d in range(3):
        for prefix in itertools.product(range(2), repeat=d + 1):
            weight = np.prod([laws[i]["probability"][b] for i, b in enumerate(prefix)])
            expected[d] += weight * np.prod([laws[i]["acceptance"][b] for i, b in enumerate(prefix)])
    assert reach == pytest.approx(expected)


def test_stop_prediction_uses_the_depth_laws_and_keeps_the_pooled_tau():
    laws = [
        {"probability": [0.2, 0.8], "acceptance": [0.2, 0.9]},
        {"probability": [0.9, 0.1], "acceptance": [0.2, 0.9]},
    ]
    cal = calibration(depth_laws=laws + laws[1:])
    config = DecoderConfig("stop-kangaroo", "stop", gamma=3, rule="kangaroo", threshold=0.0)
    prediction = predict(config, cal)
    never = _theory_rule("kangaroo", 0.0, 3)
    _, reach = depth_length_law(never, POOLED, cal.depth_buckets)
    assert prediction.tau == pytest.approx(1 + reach.sum())
    pooled = theory.evaluate_rule(never, bucket_model(cal, 3), theory.LengthCosts(0.2, 1.0)).tokens_per_step
    assert prediction.detail["pooled_tau"] == pytest.approx(pooled)
    assert prediction.tau < pooled  # confidence falls with depth here: the pooled model is optimistic


# --- calibration noise --------------------------------------------------------------------------------------


def unit(prompt: int, accepted: float) -> dict:
    return {
        "prompt": prompt,
        "records": [
            {"depth": 0, "confidence": 0.2 + 0.6 * accepted, "chain": accepted, "ranks": [accepted, 0.0]},
        ]
        * 6,
    }


def test_calibration_resamples_keep_the_point_edges_and_overheads_and_spread_the_prediction():
    units = [unit(0, 0.1), unit(1, 0.5), unit(2, 0.9)]
    records = [r for u in units for r in u["records"]]
    cal = calibrate(records, LATENCY, temperature=1.0, depth=2)
    cal.overhead = {"chain-g2": 0.05}
    again = calibration_resamples(units, cal, depth=2, seed=0, resamples=50)
    assert len(again) == 50
    assert all(c.buckets["edges"] == cal.buckets["edges"] and c.overhead == cal.overhead for c in again)
    config = DecoderConfig("chain-g2", "chain", gamma=2)
    taus = np.array([predict(config, c).tau for c in again])
    # every resample draws three prompts: its acceptance (carried to depth 1) is an average of three of them
    means = {round(sum(c) / 3, 9) for c in itertools.product([0.1, 0.5, 0.9], repeat=3)}
    allowed = np.array([1 + a + a * a for a in means])
    assert all(np.isclose(allowed, tau).any() for tau in taus) and taus.std() > 0.05
    assert calibration_resamples(units[:1], cal, depth=2, seed=0, resamples=5)[0].positional[
        0
    ] == pytest.approx(0.1)


def test_difference_interval_is_the_percentile_interval_of_differences():
    measured = np.array([1.0, 2.0, 3.0, 4.0])
    predicted = np.array([0.5, 0.5, 1.5, 1.5])
    low, high = difference_interval(measured, predicted, level=0.5)
    diffs = measured - predicted
    assert [low, high] == pytest.approx([np.percentile(diffs, 25), np.percentile(diffs, 75)])
    assert within_ci(0.0, difference_interval(measured, measured)) is True
    assert within_ci(0.0, difference_interval(measured + 10, measured)) is False  # negative control
    with pytest.raises(ValueError, match="measured and predicted"):
        difference_interval([], [1.0])


def test_multidraft_table_gives_efficiency_on_the_same_positions():
    cal = calibration()
    rows = [
        {
            "kind": "multidraft",
            "verifier": "rrs",
            "n": 2,
            "measured_acceptance": [0.6],
            "acceptance_ci": [[0.5, 0.7]],
            "measured_optimal_acceptance": 0.75,
        }
    ]
    table = multidraft_table(cal, rows)
    assert [(e["n"], e["verifier"]) for e in table] == [(2, "optimal"), (2, "rrs"), (4, "rrs")]
    rrs2 = table[1]
    assert rrs2["efficiency"] == pytest.approx(0.7 / 0.72) and rrs2["measured_efficiency"] == pytest.approx(
        0.8
    )
    assert table[0]["efficiency"] == pytest.approx(1.0) and table[2]["measured_acceptance"] is None
