"""experiments.apriori.report: rows of results.json from synthetic units, checked against hand computations."""

import pytest

from experiments.apriori.calibrate import Calibration, LatencyProfile
from experiments.apriori.predict import DecoderConfig
from experiments.apriori.report import SECTIONS, bracket_spread, evaluate_rows, render_markdown

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


REPORT = {
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
}


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
    report = {**REPORT, "rows": rows}
    text = render_markdown(report, ["tau.png"])
    assert all(section in text for section in SECTIONS) and "![tau.png](tau.png)" in text


def bracketed(before_seconds: float, after_seconds: float) -> dict:
    """A unit whose plain-decoding brackets each made 10 tokens in the given seconds."""
    return {"reference": [{"tokens": 10, "steps": 10, "seconds": s} for s in (before_seconds, after_seconds)]}


def test_bracket_spread_is_the_median_move_of_plain_decoding_across_a_unit():
    # Moves |ln(v_before / v_after)|: ln 1.25 (over 10%), ln 1.05, ln 1.08; the unit without brackets and the
    # one with a failed run are left out.
    units = [
        bracketed(1.0, 1.25),
        bracketed(1.05, 1.0),
        bracketed(1.0, 1.08),
        {"reference": []},
        bracketed(0.0, 1.0),
    ]
    spread = bracket_spread(units)
    assert spread["units"] == 3 and spread["over_10pct"] == 1
    assert spread["median_change"] == pytest.approx(0.08)
    assert bracket_spread([{"prompt": 0}]) is None


def test_markdown_states_the_machine_noise_and_flags_it_when_it_rivals_the_criterion():
    units = {"ar": [unit(0, 10, 10, 1.0, [], [])], "c": [unit(0, 7, 4, 0.5, [2, 1], [(0, 1), (1, 0)])]}
    rows = evaluate_rows(
        1.0, CAL, [DecoderConfig("ar", "ar"), DecoderConfig("c", "chain", gamma=2)], units, depth=2
    )
    report = {**REPORT, "rows": rows}
    steady = render_markdown({**report, "bracket_spread": bracket_spread([bracketed(1.0, 1.02)] * 4)}, [])
    assert "a median 2.0% apart, more than 10% apart around 0 of 4 units." in steady
    noisy = [bracketed(1.0, 1.02)] * 2 + [bracketed(1.0, 1.3)] * 2
    text = render_markdown({**report, "bracket_spread": bracket_spread(noisy)}, [])
    assert "around 2 of 4 units: the machine's speed moved by as much as the 10% criterion allows." in text
    assert "apart" not in render_markdown(report, [])  # runs without brackets say nothing
