"""Tests of the forward benchmark's pieces: the baseline model read from git gives today's logits on tiny
models (so the before/after table compares equal computations), summaries, and argument checks."""

from __future__ import annotations

import pytest
import torch

from experiments.bench_model_forward import BASELINE_REV, load_baseline_class, main, measure, summarise
from tests.tiny_models import build_tiny_model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_baseline_from_git_gives_the_same_logits_as_todays_model(dtype):
    model = build_tiny_model(4, vocab_size=300, dim=32, hidden_dim=64).to(dtype)
    baseline = load_baseline_class(BASELINE_REV)(model.config)
    baseline.load_state_dict(model.state_dict())
    baseline.to(dtype).requires_grad_(False).eval()
    for m in (model, baseline):
        m.setup_cache(32)
    tokens = torch.tensor([[5, 7, 1, 0, 299, 42, 8, 8, 3, 2, 11, 17]])
    for start, stop in [(0, 9), (9, 10), (10, 12)]:  # 9 rows: the bfloat16 upcast path
        slots = torch.arange(start, stop)
        ours, theirs = model(tokens[:, start:stop], slots), baseline(tokens[:, start:stop], slots)
        if dtype == torch.float32:
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
        else:
            # Today's model attends in float32 on the CPU, the baseline in bfloat16, so they agree to
            # bfloat16 round-off: two units in the last place at the logits' scale (~30 here, spacing 0.125).
            units_in_last_place = 2 * torch.finfo(dtype).eps * theirs.float().abs().max().item()
            torch.testing.assert_close(ours, theirs, atol=units_in_last_place, rtol=0)


def test_baseline_rev_must_exist():
    with pytest.raises(ValueError, match="baseline_rev"):
        load_baseline_class("no-such-revision")


def test_one_variant_alone_is_its_own_reference():
    # `--variants compiled` alone has neither a baseline nor an eager model to compare logits with.
    model = build_tiny_model(2, vocab_size=50, dim=16, hidden_dim=32)
    model.setup_cache(16)
    results = measure({"compiled": model}, [1, 2], context=4, repeats=3, seed=0)
    assert [row["compiled"]["max_abs_logit_diff"] for row in results.values()] == [0.0, 0.0]
    assert all(row["compiled"]["top1_agrees"] for row in results.values())


def test_summarise_reports_median_quartiles_and_minimum_in_ms():
    summary = summarise([0.004, 0.001, 0.003, 0.002, 0.005])
    assert summary["median_ms"] == pytest.approx(3.0) and summary["min_ms"] == pytest.approx(1.0)
    assert summary["p25_ms"] <= summary["median_ms"] <= summary["p75_ms"]


@pytest.mark.parametrize(
    "argv", [["--variants", "turbo"], ["--dtypes", "float99"], ["--n", "0"], ["--repeats", "2"]]
)
def test_bad_arguments_exit_with_an_error(argv):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code != 0
