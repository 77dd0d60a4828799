"""experiments.apriori.report: rows of results.json from synthetic units, checked against hand computations."""

import pytest

from experiments.apriori.calibrate import Calibration, LatencyProfile
from experiments.apriori.predict import DecoderConfig
from experiments.apriori.report import SECTIONS, evaluate_rows, render_markdown

CAL = Calibration(
    temperature=1.0,
    positional=[0.5, 0.5],
    rank_matrix=[[0.5, 0.1], [0.5, 0.1]],
    multidraft={},
    bound={},
    buckets={"edges": [], "confidence": [0.5], "acceptance": [0.5], "probability": [1.0]},
    events=[10, 10],
    latency=LatencyProfile({1: 1.0, 2: 1.0, 3: 1.0}, 0.0),
)


def unit(prompt, tokens, steps, seconds, reached, accepted):
    records = [
        {
            "depth": d,
            "chain": 0.5,
            "ranks": [0.5, 0.1],
            "confidence": 0.5,
            "replay": 0.5,
            "accepted": a,
            "children": 1,
            "grid": {},
            "bound": {},
        }
        for d, a in accepted
    ]
    return {
        "prompt": prompt,
        "tokens": tokens,
        "steps": steps,
        "seconds": seconds,
        "drafted_steps": steps,
        "reached": reached,
        "records": records,
    }


def test_rows_pair_prompts_and_agree_with_hand_computed_numbers():
    units = {
        "ar": [unit(0, 10, 10, 1.0, [], []), unit(1, 10, 10, 1.0, [], [])],
        "c": [
            unit(0, 7, 4, 0.5, [2, 1], [(0, 1), (1, 0)]),
            unit(1, 7, 4, 0.5, [2, 1], [(0, 1), (1, 0)]),
            unit(2, 99, 1, 0.1, [1, 1], [(0, 1)]),
        ],  # prompt 2 has no plain-decoding twin: left out
    }
    decoders = [DecoderConfig("ar", "ar"), DecoderConfig("c", "chain", gamma=2)]
    ar, chain = evaluate_rows(1.0, CAL, decoders, units, depth=2)
    assert ar["measured_tau"] == 1.0 and ar["speedup_vs_ar"] == 1.0 and ar["within_ci"]
    assert chain["prompts"] == 2 and chain["measured_tau"] == 7 / 4 and chain["tau_ci"] == [1.75, 1.75]
    assert chain["predicted_tau"] == pytest.approx(1.75) and chain["within_ci"]  # 1 + 0.5 + 0.25
    assert chain["measured_acceptance"] == [0.5, 0.25] and chain["predicted_acceptance"] == [0.5, 0.25]
    assert chain["tokens_per_s"] == 14.0 and chain["speedup_vs_ar"] == pytest.approx(1.4)
    assert chain["speedup_ci"] == pytest.approx([1.4, 1.4]) and chain["predicted_speedup"] == pytest.approx(
        1.75
    )
    assert not chain["speedup_within_10pct"]
    assert chain["replay_tau"] == pytest.approx(1 + 2 * 0.5 * 2 / 8)


def test_markdown_has_every_section():
    units = {"ar": [unit(0, 10, 10, 1.0, [], [])], "c": [unit(0, 7, 4, 0.5, [2, 1], [(0, 1), (1, 0)])]}
    rows = evaluate_rows(
        1.0, CAL, [DecoderConfig("ar", "ar"), DecoderConfig("c", "chain", gamma=2)], units, depth=2
    )
    report = {
        "config": {
            "model": None,
            "prompts": 2,
            "seed": 0,
            "max_new_tokens": 8,
            "temperatures": [1.0],
            "calibration_paths": 3,
        },
        "drafter": "early-exit:1",
        "latency": CAL.latency.to_json(),
        "calibration": {"T1": CAL.to_json()},
        "planning": {
            "T1": {
                "gamma_star": 2,
                "plan": {"size": 3, "depth": 2},
                "thresholds": {"specdecpp": 0.5, "kangaroo": 0.5},
                "planner_curve": {},
            }
        },
        "rows": rows,
    }
    text = render_markdown(report, ["tau.png"])
    assert all(section in text for section in SECTIONS) and "![tau.png](tau.png)" in text
