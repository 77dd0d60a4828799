"""`specbound validate --quick` end to end on the real SmolLM2-135M (slow): every section of the report, and
the numbers consistent with each other (within_ci and the joint interval agree with the intervals, speedups
positive, the optimal verifier's rows at n = 2, 4, 8).

Kept short: 2 prompts (one to calibrate, one to evaluate), 4 new tokens, T = 1 only, a latency profile of 3
rounds, and the early-exit drafter named (the default trained feature head would be trained first on a machine
without a cache, which takes minutes; tests/experiments/apriori/test_apriori_run.py checks how the default is
chosen).
"""

import json

import pytest

from experiments.apriori.report import SECTIONS
from experiments.cli import main

pytestmark = pytest.mark.slow


def inside(value: float, interval) -> bool:
    low, high = interval
    return low - 1e-12 <= value <= high + 1e-12


def test_a_quick_run_writes_every_section_with_consistent_rows(tmp_path):
    # One test, not a fixture shared by several: under `--dist worksteal` a module fixture runs again on every
    # worker that takes one of its tests, and this run is the suite's longest (50-110 s).
    out = tmp_path / "run"
    # Three timed rounds of the latency profile (15 by default): its noise does not matter to these checks.
    args = ["validate", "--quick", "--prompts", "2", "--max-new-tokens", "4", "--temperatures", "1"]
    args += ["--latency-repeats", "3"]
    assert main([*args, "--drafter", "early-exit:20", "--threads", "1", "--out", str(out)]) == 0
    every_section_and_plot_is_written(out)
    rows_are_consistent(out)


def every_section_and_plot_is_written(real_run):
    report = (real_run / "report.md").read_text()
    for section in SECTIONS:
        assert section in report
    for plot in ("tau.png", "speedup.png", "acceptance.png", "budget.png", "multidraft.png"):
        assert (real_run / plot).stat().st_size > 1000


def rows_are_consistent(real_run):
    results = json.loads((real_run / "results.json").read_text())
    rows = results["rows"]
    assert {r["kind"] for r in rows} >= {"ar", "chain", "multidraft", "tree", "dynamic", "stop"}
    for r in rows:
        assert r["within_ci"] == inside(r["predicted_tau"], r["tau_ci"])
        assert r["speedup_within_ci"] == inside(r["predicted_speedup"], r["speedup_ci"])
        assert r["speedup_within_10pct"] == (abs(r["predicted_speedup"] / r["speedup_vs_ar"] - 1) <= 0.10)
        assert r["speedup_vs_ar"] > 0 and r["predicted_speedup"] > 0 and r["tokens_per_s"] > 0
        assert r["measured_tau"] >= 1.0 and r["predicted_tau"] >= 1.0
        assert r["detail"]["overhead"] >= 0.0
    table = results["multidraft"]["T1"]
    optimal = {e["n"]: e for e in table if e["verifier"] == "optimal"}
    assert sorted(optimal) == [2, 4, 8]
    for e in table:
        assert 0.0 <= e["acceptance"] <= e["optimal_acceptance"] + 1e-9  # no verifier beats the optimum
    for e in optimal.values():
        assert e["efficiency"] == pytest.approx(1.0, abs=1e-6)
