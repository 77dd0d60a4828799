"""experiments.bench_optimal_verifier on tiny inputs: it runs, prints its table and writes valid JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from experiments import bench_optimal_verifier as bench
from tests.experiments.test_real_pairs import ByteTokenizer
from tests.tiny_models import build_tiny_model


def cached_pairs(directory, steps, slugs=("early-exit-15",)):
    """Cached 'real' pairs as the benchmark expects them (small random pairs, so no model is loaded)."""
    rng = np.random.default_rng(0)
    directory.mkdir()
    for slug in slugs:
        for temperature in (0.7, 1.0):
            p, q = rng.dirichlet(np.ones(40), size=5), rng.dirichlet(0.3 * np.ones(40), size=5)
            np.savez(directory / f"smollm2_{slug}_T{temperature}_steps{steps}.npz", p=p, q=q)


def test_benchmark_runs_on_tiny_pairs_and_writes_valid_json(tmp_path, capsys):
    cached_pairs(tmp_path / "pairs", 3, slugs=("early-exit-15", "feature-0123abcd"))
    out = tmp_path / "bench.json"
    argv = ["--quick", "--pairs-dir", str(tmp_path / "pairs"), "--steps", "3", "--synthetic", "1"]
    drafters = ["--drafters", "early-exit:15,feature:/cache/feature-6e9008efa296-0123abcd"]
    assert bench.main([*argv, *drafters, "--synthetic-vocab", "64", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert len(results["cases"]) == 6 * len(bench.DRAFTS)
    assert "SmolLM2 feature-0123abcd, T = 1.0, n = 8" in results["cases"]
    for label, entry in results["cases"].items():
        summary = entry["summary"]
        assert summary["pairs"] == len(entry["rows"]) > 0
        assert summary["shortfall_max"] <= 1e-9, label
        assert summary["build_cpu_ms_median"] > 0 and summary["rrs_gap_mean"] >= -1e-12
        for row in entry["rows"]:
            assert row["acceptance"] <= row["alpha_star"] + 1e-12
            assert row["rrs"] <= row["alpha_star"] + 1e-12 and row["kseq"] <= row["alpha_star"] + 1e-12
    printed = capsys.readouterr().out
    assert "synthetic V = 64" in printed and "wrote" in printed


def test_numpy_only_times_each_build_both_ways(tmp_path, capsys):
    cached_pairs(tmp_path / "pairs", 3)
    out = tmp_path / "bench.json"
    argv = ["--quick", "--pairs-dir", str(tmp_path / "pairs"), "--steps", "3", "--synthetic", "1"]
    assert (
        bench.main(
            [
                *argv,
                "--drafters",
                "early-exit:15",
                "--synthetic-vocab",
                "64",
                "--numpy-only",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    results = json.loads(out.read_text())
    assert isinstance(results["native_fit"], bool)
    for entry in results["cases"].values():
        summary = entry["summary"]
        assert all(row["numpy_only_build_cpu_ms"] > 0 for row in entry["rows"])
        assert summary["over_numpy_only_median"] > 0 and summary["numpy_only_build_cpu_ms_median"] > 0
    assert "native / numpy" in capsys.readouterr().out


def test_bad_arguments_exit_non_zero(tmp_path):
    with pytest.raises(SystemExit):
        bench.main(["--synthetic", "0", "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit):
        bench.main(["--drafters", " , ", "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit):
        bench.main(["--synthetic-noise", "-1", "--out", str(tmp_path / "x.json")])


def test_synthetic_noise_sets_how_close_the_draft_is():
    """The draft's logits are the target's plus noise of the given scale: at 0 the pair is identical, and the
    total variation grows with the scale (0.3 against the default 1.5, V = 2000, seed 0)."""
    rng = np.random.default_rng(0)
    ((p, q),) = bench.synthetic_pairs(rng, 1, 50, 1.0, noise=0.0)
    np.testing.assert_array_equal(p, q)
    ((p, q),) = bench.synthetic_pairs(rng, 1, 2000, 1.0, noise=0.3)
    ((p_far, q_far),) = bench.synthetic_pairs(rng, 1, 2000, 1.0)
    assert 0 < np.abs(p - q).sum() < 0.5 * np.abs(p_far - q_far).sum()


def test_each_drafter_and_checkpoint_has_its_own_pair_file():
    assert bench.drafter_slug("early-exit:15") == "early-exit-15"
    assert bench.drafter_slug("feature") == "feature"
    assert bench.drafter_slug("feature:/c/drafters/feature-6e9008efa296-9c096909f3/") == "feature-9c096909f3"
    assert bench.drafter_slug("feature:/c/a-1") != bench.drafter_slug("feature:/c/a-2")


def test_a_bare_trained_kind_resolves_to_the_cached_checkpoint(monkeypatch):
    from executor.drafters import parse

    asked = []
    monkeypatch.setattr(
        parse, "kind_checkpoint", lambda target, kind: asked.append(kind) or f"/c/{kind}-ab12"
    )
    load = lambda: ("model", "tokenizer")  # noqa: E731
    assert bench.resolve_drafter("feature", load) == "feature:/c/feature-ab12"
    assert bench.resolve_drafter("early-exit:15", load) == "early-exit:15"
    assert bench.resolve_drafter("feature:/given", load) == "feature:/given"
    assert asked == ["feature"]


def test_end_to_end_on_a_tiny_model_reports_both_verifiers_and_decoders():
    model = build_tiny_model(0, vocab_size=16, max_seq_len=128)
    rows = bench.end_to_end(("ab", "cd"), 4, model=model, tokenizer=ByteTokenizer())
    assert {(r["decoder"], r["verifier"]) for r in rows} == {
        (d, v) for d in ("multidraft", "tree") for v in ("rrs", "optimal")
    }
    for row in rows:
        assert row["tau"] >= 1.0 and row["cpu_ms_per_step"] > 0 and row["ms_per_token"] > 0
        # One verification call per step for the multi-draft decoder, one per tree node with children.
        assert (
            row["verify_calls_per_step"] >= 1 and 0 < row["verify_cpu_ms_per_step"] < row["cpu_ms_per_step"]
        )
    from executor import verification

    assert verification._KERNELS["optimal"].__name__ == "<lambda>"  # the timers are gone


def test_timed_verifiers_count_each_kernel_call_and_restore_the_kernels():
    from executor import verification

    original = verification._KERNELS["rrs"]
    p = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    drafts = torch.tensor([[0, 1]])
    with bench.timed_verifiers(("rrs",)) as spent:
        for _ in range(3):
            verification._KERNELS["rrs"](p, p, drafts, torch.Generator().manual_seed(0))
    assert spent["rrs"][1] == 3 and spent["rrs"][0] >= 0.0
    assert verification._KERNELS["rrs"] is original


def test_step_cost_ratios_divide_the_optimal_rows_by_the_rrs_rows_per_decoder():
    verify = {"verify_cpu_ms_per_step": 1.0, "cpu_ms_per_step": 59.0}
    rows = [
        {"decoder": "multidraft", "verifier": "rrs", "ms_per_step": 60.0, "ms_per_token": 45.0, **verify},
        {
            "decoder": "multidraft",
            "verifier": "optimal",
            "ms_per_step": 63.0,
            "ms_per_token": 49.5,
            **verify,
            "verify_cpu_ms_per_step": 3.95,
        },
        {"decoder": "tree", "verifier": "optimal", "ms_per_step": 90.0, "ms_per_token": 60.0},
        {"decoder": "tree", "verifier": "rrs", "ms_per_step": 100.0, "ms_per_token": 80.0},
    ]
    assert bench.step_cost_ratios(rows) == {
        "multidraft": {
            "per_step": pytest.approx(1.05),
            "per_token": pytest.approx(1.1),
            "verify_extra_share": pytest.approx(0.05),  # (3.95 - 1) / 59
        },
        "tree": {"per_step": pytest.approx(0.9), "per_token": pytest.approx(0.75)},
    }
    assert bench.step_cost_ratios(rows[:1]) == {}  # no optimal row: nothing to compare


def test_end_to_end_runs_report_each_run_and_their_median(tmp_path, monkeypatch, capsys):
    model = build_tiny_model(0, vocab_size=16, max_seq_len=128)
    monkeypatch.setattr(bench, "load_model", lambda: (model, ByteTokenizer()))
    cached_pairs(tmp_path / "pairs", 3)
    out = tmp_path / "bench.json"
    argv = ["--quick", "--pairs-dir", str(tmp_path / "pairs"), "--steps", "3", "--synthetic", "1"]
    argv += ["--drafters", "early-exit:15", "--synthetic-vocab", "64", "--out", str(out)]
    assert bench.main([*argv, "--end-to-end", "3", "--end-to-end-runs", "3"]) == 0
    results = json.loads(out.read_text())
    runs = results["end_to_end_ratios"]
    assert [entry["run"] for entry in runs] == [1, 2, 3]
    for decoder in ("multidraft", "tree"):
        for unit in ("per_step", "per_token"):
            expected = float(np.median([entry[decoder][unit] for entry in runs]))
            assert results["end_to_end_ratio_medians"][decoder][unit] == expected
    assert "median of 3 runs, tree: optimal / RRS" in capsys.readouterr().out


def test_end_to_end_runs_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--end-to-end", "4", "--end-to-end-runs", "0"])
    assert "--end-to-end-runs must be at least 1, got 0" in capsys.readouterr().err
