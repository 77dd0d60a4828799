"""``specbound plan-length``: the printed and JSON plans agree with the theory; bad input exits cleanly."""

from __future__ import annotations

import json

import pytest

from experiments.cli import main
from theory import IIDAcceptance, LengthCosts, expected_tokens, optimal_length_policy, speedup


def write(tmp_path, content) -> str:
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(content))
    return str(path)


def test_json_plan_matches_the_theory_for_constant_acceptance(tmp_path, capsys):
    assert main(["plan-length", "--acceptance", write(tmp_path, 0.8), "--draft-time", "0.05", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    optimal = result["optimal"]
    assert optimal["tokens_per_step"] == pytest.approx(expected_tokens(0.8, 8), rel=1e-12)
    assert optimal["speedup"] == pytest.approx(speedup(0.8, 8, 0.05), rel=1e-12)
    assert optimal["is_threshold_rule"] is True
    policy = optimal_length_policy(IIDAcceptance(0.8, max_length=32), LengthCosts(0.05))
    assert optimal["threshold"] == pytest.approx(policy.threshold)
    costs = [row["cost_per_token"] for row in result["alternatives"]]
    assert costs == sorted(costs) and len(costs) == 10
    assert {"fixed K=8", "optimal (MDP)"} <= {row["name"] for row in result["alternatives"][:2]}


def test_text_plan_for_buckets_lists_threshold_and_ranked_rules(tmp_path, capsys):
    buckets = {
        "buckets": {
            "confidence": [0.9, 0.5, 0.2],
            "acceptance": [0.95, 0.6, 0.2],
            "probability": [0.5, 0.3, 0.2],
            "entropy": [0.2, 1.0, 2.5],
        }
    }
    argv = [
        "plan-length",
        "--acceptance",
        write(tmp_path, buckets),
        "--draft-time",
        "0.05",
        "--max-length",
        "8",
    ]
    assert main([*argv, "--top", "30"]) == 0
    out = capsys.readouterr().out
    assert "threshold rule: yes" in out and "h* = " in out and "SpecDec++ threshold" in out
    ranked = [line.split()[0] for line in out.splitlines() if line.strip()[:1].isdigit() and "x" in line]
    assert ranked[0] == "1"
    assert "entropy bound<0.7" in out and "heuristic (+2/-1)" in out and "Kangaroo eta=0.6" in out
    assert out.index("optimal (MDP)  ") < out.index("heuristic (+2/-1)")  # the optimum ranks first


def test_per_position_acceptance_is_accepted(tmp_path, capsys):
    path = write(tmp_path, {"per_position": [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]})
    assert main(["plan-length", "--acceptance", path, "--draft-time", "0.05", "--json"]) == 0
    optimal = json.loads(capsys.readouterr().out)["optimal"]
    assert optimal["tokens_per_step"] == pytest.approx(3.5776)
    assert optimal["speedup"] == pytest.approx(2.86208)


@pytest.mark.parametrize(
    "content, extra, message",
    [
        (1.5, [], "--acceptance entries must lie in [0, 1]"),
        ([0.5, -0.2], [], "--acceptance entries must lie in [0, 1]"),
        ({"buckets": {"confidence": [0.5], "acceptance": [0.5]}}, [], "probability"),
        ("nonsense", [], "--acceptance must be"),
        (0.5, ["--draft-time", "-1"], "--draft-time must be non-negative"),
        (0.5, ["--max-length", "0"], "--max-length must be at least 1"),
        (0.5, ["--target-time", "0"], "--target-time must be positive"),
    ],
)
def test_bad_input_exits_with_a_message(tmp_path, capsys, content, extra, message):
    argv = ["plan-length", "--acceptance", write(tmp_path, content), "--draft-time", "0.1", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_inline_json_is_read_like_a_file(tmp_path, capsys):
    outputs = []
    for acceptance in (write(tmp_path, [0.9, 0.7, 0.5]), "[0.9, 0.7, 0.5]"):
        assert main(["plan-length", "--acceptance", acceptance, "--draft-time", "0.1", "--json"]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1]
    assert main(["plan-length", "--acceptance", "[0.9,", "--draft-time", "0.1"]) == 2
    assert "not inline JSON either" in capsys.readouterr().err


def test_missing_file_is_reported(tmp_path, capsys):
    assert main(["plan-length", "--acceptance", str(tmp_path / "none.json"), "--draft-time", "0.1"]) == 2
    assert "cannot read" in capsys.readouterr().err


def write_profile(tmp_path, sizes, times, draft_time=None) -> str:
    drafter = (
        None if draft_time is None else {"name": "x", "draft_time": draft_time, "level_time": draft_time}
    )
    path = tmp_path / "profile.json"
    path.write_text(
        json.dumps(
            {
                "format": "specbound-profile",
                "version": 1,
                "target": {"sizes": sizes, "times": times},
                "drafter": drafter,
            }
        )
    )
    return str(path)


def plan_json(capsys, argv) -> dict:
    assert main(["plan-length", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_flat_measured_times_give_the_unit_cost_plan(tmp_path, capsys):
    # t(n) = 2 s for every n: the plan is the ordinary one with target_time 2, at the largest cap.
    profile = write_profile(tmp_path, [1, 2, 4, 8, 16], [2.0] * 5, draft_time=0.1)
    acc = write(tmp_path, 0.8)
    measured = plan_json(capsys, ["--acceptance", acc, "--latency", profile, "--max-length", "8"])
    unit = plan_json(capsys, ["--acceptance", acc, "--draft-time", "0.05", "--max-length", "8"])
    assert measured["latency"]["cap"] == 8
    assert measured["optimal"]["speedup"] == pytest.approx(unit["optimal"]["speedup"], rel=1e-12)
    assert measured["optimal"]["cost_per_token"] == pytest.approx(2 * unit["optimal"]["cost_per_token"])


def test_steep_verification_caps_the_draft_length_and_speedups_are_against_t1(tmp_path, capsys):
    # Verifying more than 3 tokens is very slow: the best plan drafts at most 2.
    profile = write_profile(tmp_path, [1, 2, 4, 8], [1.0, 1.0, 1.0, 50.0], draft_time=0.05)
    result = plan_json(capsys, ["--acceptance", write(tmp_path, 0.8), "--latency", profile])
    assert result["latency"]["cap"] == 3 and result["optimal"]["drafted_per_step"] <= 3
    policy = optimal_length_policy(IIDAcceptance(0.8, max_length=3), LengthCosts(0.05, 1.0))
    assert result["optimal"]["cost_per_token"] == pytest.approx(policy.evaluation.cost_per_token)
    assert result["optimal"]["speedup"] == pytest.approx(1.0 / policy.evaluation.cost_per_token)
    for row in result["alternatives"]:
        assert row["speedup"] == pytest.approx(1.0 / row["cost_per_token"]) and 1 <= row["cap"] <= 7


@pytest.mark.parametrize(
    ("extra", "drafter", "message"),
    [
        (["--target-time", "1"], 0.1, "--target-time and --latency exclude each other"),
        ([], None, "the profile measured no drafter; pass --draft-time"),
    ],
)
def test_profile_option_errors(tmp_path, capsys, extra, drafter, message):
    profile = write_profile(tmp_path, [1, 2], [1.0, 1.0], draft_time=drafter)
    assert main(["plan-length", "--acceptance", write(tmp_path, 0.8), "--latency", profile, *extra]) == 2
    assert message in capsys.readouterr().err


def test_draft_time_is_required_without_a_profile(tmp_path, capsys):
    assert main(["plan-length", "--acceptance", write(tmp_path, 0.8)]) == 2
    assert "--draft-time is required without --latency" in capsys.readouterr().err
