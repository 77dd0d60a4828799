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
        (1.5, [], "alpha"),
        ([0.5, -0.2], [], "alphas"),
        ({"buckets": {"confidence": [0.5], "acceptance": [0.5]}}, [], "probability"),
        ("nonsense", [], "acceptance must be"),
        (0.5, ["--draft-time", "-1"], "draft_time"),
        (0.5, ["--max-length", "0"], "max_length"),
        (0.5, ["--target-time", "0"], "target_time"),
    ],
)
def test_bad_input_exits_with_a_message(tmp_path, capsys, content, extra, message):
    argv = ["plan-length", "--acceptance", write(tmp_path, content), "--draft-time", "0.1", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_missing_file_is_reported(tmp_path, capsys):
    assert main(["plan-length", "--acceptance", str(tmp_path / "none.json"), "--draft-time", "0.1"]) == 2
    assert "cannot read" in capsys.readouterr().err
