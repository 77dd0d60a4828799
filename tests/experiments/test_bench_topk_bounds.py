"""The interleaved old / new top-k bound benchmark: a tiny run against this commit, and its argument checks."""

import json

import numpy as np
import pytest

from experiments.bench_topk_bounds import main


def test_tiny_run_against_head_writes_rates_and_agreement(tmp_path):
    out = tmp_path / "bench.json"
    assert main(["--old", "HEAD", "--rounds", "1", "--rows", "30", "10", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["cases"]) == {f"top-{k}, wor_low={low}" for k in (20, 256) for low in ("iid", "dust")}
    for case in report["cases"].values():
        assert all(rate > 0 for rate in case["positions_per_cpu_s"].values())
        # the overlap and the i.i.d. alpha* are the same code at HEAD and in this tree
        for name in ("overlap@1", "iid@2", "iid@4", "iid@8"):
            assert case["agreement"][name]["identical"], name


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--rows", "0", "5"]])
def test_non_positive_sizes_are_refused(tmp_path, argv):
    with pytest.raises(SystemExit) as error:
        main([*argv, "--out", str(tmp_path / "x.json")])
    assert error.value.code != 0


def test_full_log_rows_are_each_bounded_once(tmp_path):
    from experiments.bench_bound_logs import lm_rows
    from experiments.logformat import write_full_log

    p, q = lm_rows(np.random.default_rng(0), 7, vocab=300)
    write_full_log(tmp_path / "log.npz", p.astype(np.float32), q.astype(np.float32), temperature=1.0)
    out = tmp_path / "bench.json"
    argv = ["--old", "HEAD", "--rounds", "1", "--full-log", str(tmp_path / "log.npz"), "--out", str(out)]
    assert main(argv) == 0
    cases = json.loads(out.read_text())["cases"]
    assert {case["positions"] for case in cases.values()} == {7}


def test_cases_can_be_restricted_to_one_top_k_and_one_wor_low(tmp_path):
    out = tmp_path / "bench.json"
    argv = ["--old", "HEAD", "--rounds", "1", "--rows", "12", "5", "--top-k", "20", "--wor-low", "dust"]
    assert main([*argv, "--out", str(out)]) == 0
    assert set(json.loads(out.read_text())["cases"]) == {"top-20, wor_low=dust"}
