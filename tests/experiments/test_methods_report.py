"""The ``specbound methods`` report: the prediction check and the break-even hardware of each row."""

from __future__ import annotations

import math

import pytest

from experiments.methods_report import summarise_unit


def unit(*, predicted, step_tokens, wall, ar_wall, lossless=True, extra=None, prediction=None):
    """One unit of one prompt whose steps emitted ``step_tokens`` (ar: 16 tokens in ``ar_wall``)."""
    tokens = sum(step_tokens)
    return {
        "method": "m",
        "temperature": 0.0,
        "lossless": lossless,
        "paper": "",
        "options": {},
        "predicted_tau": predicted,
        "prediction": prediction or {},
        "train_seconds": None,
        "prompts": [
            {
                "tokens": tokens,
                "steps": len(step_tokens),
                "wall_time": wall,
                "acceptance_by_position": [0.5],
                "layer_evaluations": 30 * tokens,
                "memory_bound_cost": 1.0,
                "ar_tokens": 16,
                "ar_wall_time": ar_wall,
                "ar_memory_bound_cost": 1.0,
                "identical": True,
                "rouge_l": 1.0,
                "extra": {"step_tokens": step_tokens, **(extra or {})},
            }
        ],
    }


def test_a_prediction_within_ten_percent_is_a_hit_and_a_far_one_names_the_assumption():
    steady = [2, 2, 2, 2, 2, 2, 2, 2]  # tau = 2 exactly, standard error 0
    assert summarise_unit(unit(predicted=2.1, step_tokens=steady, wall=1, ar_wall=1))[
        "prediction_check"
    ].startswith("within 10%")
    far = summarise_unit(unit(predicted=3.0, step_tokens=[2, 2, 2, 3], wall=1, ar_wall=1))
    assert "calibration prompts holds on the held-out ones" in far["prediction_check"]


def test_a_gap_inside_the_sampling_error_says_the_run_is_too_short():
    noisy = [1, 4, 1, 4]  # tau 2.5, sd 1.73, se 0.87: 3.0 is within two standard errors
    row = summarise_unit(unit(predicted=3.0, step_tokens=noisy, wall=1, ar_wall=1))
    assert row["tau_standard_error"] == pytest.approx(math.sqrt(3) / 2)
    assert "too few held-out steps" in row["prediction_check"]


def test_break_even_hardware_follows_tau_over_verify_plus_draft_cost():
    # tau = 2; 4 steps each verifying 4 positions after 3 draft passes; c = 0.4 measured by the method.
    row = summarise_unit(
        unit(
            predicted=2.0,
            step_tokens=[2, 2, 2, 2],
            wall=4.0,
            ar_wall=1.0,
            extra={"verified_positions": 16, "draft_levels": 12},
            prediction={"draft_cost_ratio": 0.4},
        )
    )
    pays = row["where_it_pays"]
    assert pays["verified_width"] == 4 and pays["draft_passes"] == 3
    assert pays["break_even_c_memory_bound"] == pytest.approx((2 - 1) / 3)
    assert pays["break_even_verify_cost_at_c"] == pytest.approx(2 - 3 * 0.4)
    assert pays["step_cost_here"] == pytest.approx((4.0 / 4) / (1.0 / 16))
    assert "it needs c < 0.33" in row["note"] and "t(n)/t(1) < 0.80" in row["note"]


def test_a_method_without_draft_passes_breaks_even_on_the_verification_cost_alone():
    row = summarise_unit(
        unit(
            predicted=1.5,
            step_tokens=[1, 2, 1, 2],
            wall=4.0,
            ar_wall=1.0,
            extra={"verified_positions": 64, "draft_levels": 12, "draft_passes": 0},
        )
    )
    assert row["where_it_pays"]["break_even_verify_cost_memory_bound"] == pytest.approx(1.5)
    assert "no draft pass it needs t(n)/t(1) < 1.50" in row["note"]


def test_rows_that_pay_or_are_not_lossless_get_no_break_even():
    fast = summarise_unit(unit(predicted=2.0, step_tokens=[2, 2], wall=0.01, ar_wall=1.0))
    assert fast["where_it_pays"] is None and fast["note"].startswith("pays here")
    lossy = summarise_unit(unit(predicted=None, step_tokens=[1, 1], wall=4.0, ar_wall=1.0, lossless=False))
    assert lossy["where_it_pays"] is None and lossy["prediction_check"] is None


def test_a_far_prediction_with_acceptance_falling_with_depth_names_that_assumption():
    record = unit(
        predicted=3.0, step_tokens=[2, 2, 2, 3], wall=1, ar_wall=1, prediction={"model": "optimal_tree"}
    )
    record["prompts"][0]["acceptance_by_position"] = [0.8, 0.2, 0.1]  # conditional 0.8, 0.25, 0.5
    check = summarise_unit(record)["prediction_check"]
    assert "acceptance falls with depth" in check and "0.80, 0.25, 0.50" in check and "optimal_tree" in check


def test_a_far_depth_aware_prediction_blames_the_transfer_not_the_depth():
    # The model already reads one acceptance per depth: falling acceptance is no longer the explanation.
    prediction = {
        "model": "optimal_tree(per-depth acc)",
        "depth_aware": True,
        "calibration_by_depth": [0.9, 0.6],
    }
    record = unit(predicted=3.0, step_tokens=[2, 2, 2, 3], wall=1, ar_wall=1, prediction=prediction)
    record["prompts"][0]["acceptance_by_position"] = [0.8, 0.2, 0.1]
    check = summarise_unit(record)["prediction_check"]
    assert "acceptance falls with depth" not in check
    assert "per-depth acceptance measured on the calibration prompts" in check
    assert "0.90, 0.60" in check and "0.80, 0.25, 0.50" in check and "pooled" not in check
    # Thin calibration depths pooled into one estimate are named, with the trials that made them thin.
    record["prediction"] = {**prediction, "pooled_from_depth": 2, "acceptance_trials": [9, 3]}
    check = summarise_unit(record)["prediction_check"]
    assert "depths 2 and deeper pooled into one estimate (calibration trials per depth: 9, 3)" in check


def test_conditional_acceptance_by_depth_divides_consecutive_reach_fractions():
    from experiments.methods_report import conditional_by_depth

    assert conditional_by_depth([0.5, 0.25, 0.0, 0.0]) == [0.5, 0.5, 0.0]
    assert conditional_by_depth([]) == []


def test_notes_and_checks_keep_the_markdown_table_intact():
    from experiments.methods_report import render_markdown

    record = unit(predicted=3.0, step_tokens=[2, 2, 2, 3], wall=4, ar_wall=1, extra={"draft_levels": 8})
    record["prompts"][0]["acceptance_by_position"] = [0.8, 0.2, 0.1]
    row = summarise_unit(record)
    config = {
        "model": None,
        "dtype": "float32",
        "calibration": 1,
        "prompts": 1,
        "max_new_tokens": 9,
        "seed": 0,
    }
    table = [line for line in render_markdown({"config": config, "rows": [row]}).splitlines() if "|" in line]
    assert len({line.count("|") for line in table}) == 1


def test_the_cpu_time_speedup_divides_cpu_seconds_per_token_and_ignores_wall_time():
    record = unit(predicted=2.0, step_tokens=[2, 2, 2, 2], wall=100.0, ar_wall=1.0)
    record["prompts"][0].update(cpu_seconds=2.0, ar_cpu_seconds=4.0)  # 8 tokens in 2 s vs 16 in 4 s
    row = summarise_unit(record)
    assert row["cpu_speedup_vs_ar"] == pytest.approx(1.0) and row["speedup_vs_ar"] == pytest.approx(0.005)
    record["prompts"][0].update(cpu_seconds=1.0)
    assert summarise_unit(record)["cpu_speedup_vs_ar"] == pytest.approx(2.0)
    del record["prompts"][0]["cpu_seconds"]  # a unit written before CPU seconds were recorded
    assert math.isnan(summarise_unit(record)["cpu_speedup_vs_ar"])


def test_the_cpu_summary_counts_a_shared_baseline_once_per_temperature():
    from experiments.methods_report import cpu_summary

    rows = []
    for name in ("a", "b"):
        record = unit(predicted=2.0, step_tokens=[2, 2], wall=1.0, ar_wall=1.0)
        record.update(method=name, predict_cpu_seconds=1.0)
        record["prompts"][0].update(cpu_seconds=3.0, ar_cpu_seconds=5.0)
        rows.append(summarise_unit(record))
    assert "CPU seconds" in cpu_summary(rows, shared_baseline=True)
    assert ": 13 = predict 2 + method runs 6 + plain decoding 5;" in cpu_summary(rows, shared_baseline=True)
    assert ": 18 = predict 2 + method runs 6 + plain decoding 10;" in cpu_summary(rows, shared_baseline=False)


def _diverged(divergences):
    """A unit of one prompt per entry of ``divergences`` (None: identical to plain decoding)."""
    base = unit(predicted=2.0, step_tokens=[2, 2], wall=1, ar_wall=1)
    template = base["prompts"][0]
    base["prompts"] = [{**template, "identical": d is None, "divergence": d} for d in divergences]
    return summarise_unit(base)


def test_greedy_divergences_at_rounding_ties_are_told_apart_from_real_ones():
    from experiments.methods_report import _identity

    tie = {"position": 3, "gap": 0.0, "spacing": 0.25, "within_one_step": True}
    step = {"position": 7, "gap": 0.125, "spacing": 0.125, "within_one_step": True}
    real = {"position": 1, "gap": 2.0, "spacing": 0.25, "within_one_step": False}
    identical = _diverged([None, None])
    assert identical["greedy_identical"] is True and identical["greedy_identical_up_to_rounding"] is True
    assert _identity(identical) == "yes"
    at_ties = _diverged([tie, None, step])
    assert at_ties["greedy_identical"] is False and at_ties["greedy_identical_up_to_rounding"] is True
    assert _identity(at_ties) == "at ties (2/3)"
    broken = _diverged([tie, real])
    assert broken["greedy_identical_up_to_rounding"] is False
    assert _identity(broken) == "NO (1/2 beyond a rounding step)"
