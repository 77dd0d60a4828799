"""``specbound plan-tree``: text and JSON output agree with the theory; bad files give a clean error."""

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.cli import main
from experiments.commands.plan_tree import read_acceptance, read_latency
from experiments.examples import SEQUOIA_DEMO_COUNTS
from theory import Tree, optimal_tree, plan_tree, tree_expected_tokens

ACC = [0.6, 0.2, 0.1]
TIMES = {"1": 1.0, "4": 1.0, "8": 1.1, "16": 1.3, "32": 1.8}


@pytest.fixture
def files(tmp_path):
    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps(ACC))
    latency = tmp_path / "lat.json"
    latency.write_text(json.dumps(TIMES))
    return acc, latency


def run_json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_output_with_latency_is_the_planners_choice(files, capsys):
    acc, latency = files
    report = run_json(
        capsys,
        [
            "plan-tree",
            "--acceptance",
            str(acc),
            "--budget",
            "32",
            "--latency",
            str(latency),
            "--draft-time",
            "0.05",
        ],
    )
    plan = plan_tree(ACC, {int(k): v for k, v in TIMES.items()}, 0.05, max_budget=32, max_depth=16)
    tree = Tree(report["tree"]["parents"])
    assert tree == plan.tree
    assert report["expected_tokens"] == pytest.approx(tree_expected_tokens(tree, ACC))
    assert report["speedup"] == pytest.approx(plan.speedup)
    assert report["level_sizes"] == tree.level_sizes().tolist()
    assert len(report["alternatives"]) == 5
    speedups = [report["speedup"]] + [a["speedup"] for a in report["alternatives"]]
    assert speedups == sorted(speedups, reverse=True)


def test_without_latency_the_tree_is_the_optimal_tree_of_the_budget(files, capsys):
    acc, _ = files
    report = run_json(capsys, ["plan-tree", "--acceptance", str(acc), "--budget", "20"])
    solution = optimal_tree(ACC, 20, max_depth=16)
    assert report["size"] == 20
    assert report["expected_tokens"] == pytest.approx(solution.expected_tokens)
    assert report["speedup"] == pytest.approx(solution.expected_tokens)  # flat verification, free drafting
    assert all(a["size"] == 20 for a in report["alternatives"])


def test_text_output_draws_the_tree_and_lists_alternatives(files, capsys):
    acc, latency = files
    assert (
        main(
            [
                "plan-tree",
                "--acceptance",
                str(acc),
                "--budget",
                "16",
                "--latency",
                str(latency),
                "--draft-time",
                "0.05",
                "--top",
                "3",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    plan = plan_tree(ACC, {int(k): v for k, v in TIMES.items()}, 0.05, max_budget=16, max_depth=16)
    assert f"Expected tokens per step: {plan.expected_tokens:.4f}" in out
    assert f"Predicted speedup: {plan.speedup:.3f}x" in out
    assert plan.tree.ascii() in out
    assert plan.tree.to_json() in out
    table = out.split("Top alternatives:")[1].strip().splitlines()
    assert len(table) == 1 + 3


def test_sequoia_repository_formats_are_accepted(tmp_path, capsys):
    counts = np.array(SEQUOIA_DEMO_COUNTS, dtype=float)
    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps({"acceptance": (counts / 667).tolist()}))
    latency = tmp_path / "lat.json"
    latency.write_text(json.dumps({"sizes": [1, 2, 4, 8, 16, 32], "times": [10, 10, 10, 12, 14, 18]}))
    report = run_json(
        capsys,
        [
            "plan-tree",
            "--acceptance",
            str(acc),
            "--budget",
            "128",
            "--latency",
            str(latency),
            "--draft-time",
            "0.3",
            "--max-depth",
            "9",
            "--convention",
            "sequoia-repo",
        ],
    )
    assert report["tree"]["parents"] == [-1, 0, 1, 2]  # the repository's demo result
    assert report["speedup"] == pytest.approx(2.04592, abs=1e-5)


@pytest.mark.parametrize(
    "content, extra, message",
    [
        ("[1.5, 0.1]", [], "--acceptance entries must lie in [0, 1]"),
        ("[0.7, 0.6]", [], "at most 1"),
        ("{", [], "not valid JSON"),
        ('{"p": [0.5]}', [], "'acceptance' key"),
        ("[0.5]", ["--budget", "0"], "--budget must be at least 1, got 0"),
        ("[0.5]", ["--draft-time", "-1"], "--draft-time must be non-negative"),
        ("[0.5]", ["--step-overhead", "-1"], "--step-overhead must be"),
        ("[0.5]", ["--plain-overhead", "nan"], "--plain-overhead must be"),
    ],
)
def test_bad_input_exits_with_status_2_and_a_message(tmp_path, capsys, content, extra, message):
    acc = tmp_path / "acc.json"
    acc.write_text(content)
    argv = ["plan-tree", "--acceptance", str(acc), "--budget", "8"] + extra
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "latency, message",
    [
        ({"2": 1.0}, "1 token"),
        ({"1": -1.0}, "non-negative"),
        ({"x": 1.0}, "not an integer"),
        ({"sizes": [1, 2], "times": [1.0]}, "same length"),
        ([1.0, 2.0], "expected an object"),
    ],
)
def test_bad_latency_files_exit_with_status_2(files, tmp_path, capsys, latency, message):
    acc, _ = files
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(latency))
    assert main(["plan-tree", "--acceptance", str(acc), "--budget", "8", "--latency", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_inline_json_gives_the_plan_of_the_same_file(files, capsys, tmp_path, monkeypatch):
    acc, latency = files
    from_files = run_json(
        capsys, ["plan-tree", "--acceptance", str(acc), "--budget", "16", "--latency", str(latency)]
    )
    inline = run_json(
        capsys,
        ["plan-tree", "--acceptance", json.dumps(ACC), "--budget", "16", "--latency", json.dumps(TIMES)],
    )
    assert inline.pop("latency") == json.dumps(TIMES) and from_files.pop("latency") == str(latency)
    assert inline == from_files
    # A file wins over inline text that happens to name it.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "[0.1]").write_text(json.dumps(ACC))
    named = run_json(
        capsys, ["plan-tree", "--acceptance", "[0.1]", "--budget", "16", "--latency", str(latency)]
    )
    named.pop("latency")
    assert named == from_files


def test_missing_file_is_reported(tmp_path, capsys):
    assert main(["plan-tree", "--acceptance", str(tmp_path / "none.json"), "--budget", "8"]) == 2
    assert "cannot read" in capsys.readouterr().err


def write_profile(path, sizes, times, level_time=None):
    drafter = (
        None if level_time is None else {"name": "x", "draft_time": level_time / 2, "level_time": level_time}
    )
    data = {"format": "specbound-profile", "version": 1, "target": {"sizes": sizes, "times": times}}
    path.write_text(json.dumps({**data, "drafter": drafter}))
    return str(path)


def test_a_profile_plans_like_its_interpolated_table_with_the_drafters_level_time(files, tmp_path, capsys):
    acc, _ = files
    profile = write_profile(tmp_path / "profile.json", [1, 2, 4, 8, 16], [1.0, 1.0, 1.2, 1.6, 2.4], 0.3)
    table = tmp_path / "table.json"
    # The same times at every size, linearly interpolated between the measured powers of two.
    table.write_text(
        json.dumps(
            {
                str(n): t
                for n, t in zip(
                    range(1, 17),
                    np.interp(range(1, 17), [1, 2, 4, 8, 16], [1.0, 1.0, 1.2, 1.6, 2.4]),
                    strict=True,
                )
            }
        )
    )
    common = ["plan-tree", "--acceptance", str(acc), "--budget", "16"]
    from_profile = run_json(capsys, [*common, "--latency", profile])
    from_table = run_json(capsys, [*common, "--latency", str(table), "--draft-time", "0.3"])
    assert from_profile["draft_time"] == 0.3
    for key in ("tree", "size", "speedup", "step_time", "alternatives"):
        assert from_profile[key] == from_table[key]
    # An explicit --draft-time wins over the profile's.
    explicit = run_json(capsys, [*common, "--latency", profile, "--draft-time", "0"])
    assert explicit["draft_time"] == 0 and explicit["speedup"] > from_profile["speedup"]


def test_the_overheads_reach_the_planner_and_the_report(tmp_path, files, capsys):
    acc, _ = files
    profile = write_profile(tmp_path / "profile.json", [1, 2, 4, 8, 16], [1.0, 1.0, 1.2, 1.6, 2.4], 0.3)
    common = ["plan-tree", "--acceptance", str(acc), "--budget", "16", "--latency", profile]
    plain = run_json(capsys, common)
    charged = run_json(capsys, [*common, "--step-overhead", "0.5", "--plain-overhead", "0.1"])
    assert (plain["step_overhead"], plain["plain_overhead"]) == (0.0, 0.0)
    assert (charged["step_overhead"], charged["plain_overhead"]) == (0.5, 0.1)
    expected = plan_tree(
        read_acceptance(acc),
        read_latency(Path(profile)),
        0.3,
        max_budget=16,
        max_depth=16,
        step_overhead=0.5,
        plain_overhead=0.1,
    )
    assert charged["size"] == expected.size and charged["speedup"] == pytest.approx(expected.speedup)
    assert charged["speedup"] < plain["speedup"]


def test_a_profile_without_drafter_charges_no_draft_time_and_sizes_stay_within_the_measured(
    tmp_path, files, capsys
):
    acc, _ = files
    profile = write_profile(tmp_path / "profile.json", [1, 2, 4], [1.0, 1.0, 1.0])
    report = run_json(capsys, ["plan-tree", "--acceptance", str(acc), "--budget", "32", "--latency", profile])
    assert report["draft_time"] == 0.0 and report["size"] == 4  # flat and free: the largest measured size


def test_a_malformed_profile_is_a_clean_error(tmp_path, files, capsys):
    acc, _ = files
    profile = write_profile(tmp_path / "profile.json", [1, 4, 2], [1.0, 1.0, 1.0])
    assert main(["plan-tree", "--acceptance", str(acc), "--budget", "8", "--latency", profile]) == 2
    assert "--latency: target.sizes must be strictly increasing" in capsys.readouterr().err
