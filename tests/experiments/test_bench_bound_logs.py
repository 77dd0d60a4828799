"""The bound-logs benchmark's in-process path and its argument checks (the cluster runs are the benchmark itself)."""

import json

import numpy as np
import pytest

from experiments.bench_bound_logs import lm_rows, main, make_shards
from experiments.logformat import LogShard


def test_cpu_only_run_writes_positive_rates_for_each_wor_low(tmp_path):
    out = tmp_path / "bench.json"
    argv = [
        "--cpu-only",
        "--scale",
        "0.002",
        "--cases",
        "top-20",
        "--wor-low",
        "iid",
        "dust",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    rates = json.loads(out.read_text())["cpu"]
    assert set(rates) == {"top-20, wor_low=iid", "top-20, wor_low=dust"}
    assert rates["top-20, wor_low=iid"]["positions"] == 40
    assert all(rate["positions_per_cpu_s"] > 0 for rate in rates.values())


def test_allocator_run_compares_the_two_paths_on_one_shard_and_finds_them_identical(tmp_path):
    out = tmp_path / "bench.json"
    assert main(["--allocator", "30", "--rounds", "1", "--wor-low", "dust", "--out", str(out)]) == 0
    entry = json.loads(out.read_text())["allocator"]["dust"]
    assert entry["positions"] == 30 and entry["identical"] is True
    for label in ("plain", "retained"):
        assert len(entry[label]["cpu_seconds"]) == 1 and entry[label]["positions_per_cpu_s"] > 0
    ratio = entry["retained"]["positions_per_cpu_s"] / entry["plain"]["positions_per_cpu_s"]
    assert entry["retained_over_plain"] == pytest.approx(ratio)


@pytest.mark.parametrize("flag", ["--scale", "--shards", "--rounds", "--workers", "--allocator"])
def test_non_positive_sizes_are_refused(tmp_path, flag):
    with pytest.raises(SystemExit) as error:
        main(["--cpu-only", flag, "0", "--out", str(tmp_path / "x.json")])
    assert error.value.code != 0


def test_shards_are_top_k_logs_of_the_requested_size(tmp_path):
    rng = np.random.default_rng(0)
    pool = (*lm_rows(rng, 4, vocab=300), rng)
    make_shards(tmp_path, 2, 7, 20, pool)
    shards = sorted(tmp_path.glob("*.npz"))
    assert len(shards) == 2
    shard = LogShard.open(str(shards[0]))
    assert shard.kind == "topk" and shard.rows == 7 and shard.vocab_size == 300


def test_a_pool_log_supplies_the_rows_renormalised_and_a_wrong_one_is_refused(tmp_path):
    from experiments.bench_bound_logs import pool_rows

    rng = np.random.default_rng(1)
    p, q = rng.random((3, 50)), rng.random((3, 50))
    np.savez(tmp_path / "log.npz", p=(p / p.sum(1, keepdims=True)).astype(np.float32), q=q.astype(np.float32))
    p_rows, q_rows = pool_rows(str(tmp_path / "log.npz"))
    assert p_rows.shape == q_rows.shape == (3, 50) and p_rows.dtype == np.float64
    np.testing.assert_allclose(p_rows.sum(1), 1.0, rtol=0, atol=1e-15)
    np.testing.assert_allclose(q_rows, q / q.sum(1, keepdims=True), rtol=1e-6)
    np.savez(tmp_path / "bad.npz", p=p, q=q[:, :10])
    with pytest.raises(ValueError, match="--pool-log"):
        pool_rows(str(tmp_path / "bad.npz"))
