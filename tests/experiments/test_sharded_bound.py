"""``bound --logs`` machinery: cluster run equal to the single-process run, resume, killed workers, bad shards."""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest

from experiments.log_bounds import safe_bound_shard
from experiments.logformat import top_k_arrays, write_full_log, write_topk_log
from experiments.sharded_bound import run_sharded
from theory import optimal_acceptance, verifier

NS = (2, 3)
VERIFIERS = ("rrs", "greedy", "spechub", "optimal")


def lm_pair(rng, rows, vocab):
    logits = rng.normal(size=(rows, vocab)) * 2.5
    p = np.exp(logits)
    q = np.exp(logits + rng.normal(size=logits.shape))
    return p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)


@pytest.fixture
def shards(tmp_path):
    """Three full shards and their top-5 conversions (V = 60)."""
    rng = np.random.default_rng(12)
    folder = tmp_path / "logs"
    pairs = []
    for index in range(3):
        p, q = lm_pair(rng, 7 + index, 60)
        pairs.append((p, q))
        write_full_log(folder / f"full_{index}.npz", p, q, temperature=0.5 + index)
        write_topk_log(folder / f"top_{index}.npz", top_k_arrays(p, q, 5, 8), 60, temperature=1.0)
    return folder, pairs


def clean(report: dict) -> dict:
    report = json.loads(json.dumps(report))
    report["shards"].pop("computed_now")
    return report


def run(pattern, **options):
    options.setdefault("workers", 0)
    return run_sharded(str(pattern), NS, verifiers=VERIFIERS, progress=False, **options)


def test_full_logs_give_the_exact_means_and_zero_width(shards):
    folder, pairs = shards
    report = run(folder / "full_*.npz")
    p = np.concatenate([pair[0] for pair in pairs])
    q = np.concatenate([pair[1] for pair in pairs])
    assert report["positions"] == len(p) == 24 and report["kinds"] == ["full"]
    for n in NS:
        for draft in ("iid", "wor"):
            entry = report["optimal"][draft][str(n)]
            expected = np.mean(
                optimal_acceptance(
                    p.astype(np.float32).astype(np.float64), q.astype(np.float32), n, draft=draft
                )
            )
            assert entry["low"] == entry["high"] == entry["mean"]
            assert entry["mean"] == pytest.approx(expected, abs=1e-6)
        rrs = report["verifiers"]["rrs"]["n"][str(n)]
        assert rrs["low"] == pytest.approx(np.mean(verifier("rrs").acceptance(p, q, n)), abs=1e-6)
    assert report["verifiers"]["spechub"]["n"].keys() == {"2"}
    temperatures = {k for k in report["by_feature"] if k.startswith("temperature")}
    assert temperatures == {"temperature 0.5", "temperature 1.5", "temperature 2.5"}


def test_top_k_intervals_contain_the_full_log_means(shards):
    folder, _ = shards
    full = run(folder / "full_*.npz")
    top = run(folder / "top_*.npz")
    for n in NS:
        for draft in ("iid", "wor"):
            truth = full["optimal"][draft][str(n)]["mean"]
            entry = top["optimal"][draft][str(n)]
            assert entry["low"] - 1e-9 <= truth <= entry["high"] + 1e-9 and entry["high"] > entry["low"]
        for name in VERIFIERS:
            truth = full["verifiers"][name]["n"].get(str(n))
            if truth:
                entry = top["verifiers"][name]["n"][str(n)]
                assert entry["low"] - 1e-9 <= truth["mean"] <= entry["high"] + 1e-9
    assert top["shards"]["per_shard"]["top_0.npz"]["width"] == [5, 8]


def test_two_worker_local_cluster_equals_the_single_process_run(shards):
    folder, _ = shards
    serial = run(folder / "*.npz")
    cluster = run(folder / "*.npz", workers=2, processes=False)
    assert clean(cluster) == clean(serial)


def interrupt_after_two(path, *arguments):
    """Shard task that stops the whole run (like Ctrl-C) at the third shard of this process."""
    interrupt_after_two.calls = getattr(interrupt_after_two, "calls", 0) + 1
    if interrupt_after_two.calls == 3:
        raise KeyboardInterrupt
    return safe_bound_shard(path, *arguments)


def test_an_interrupted_run_resumes_and_computes_only_the_missing_shards(shards, tmp_path):
    folder, _ = shards
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run(folder / "*.npz", out=out, shard_function=interrupt_after_two)
    assert len(list((out / "shards").glob("*.json"))) == 2
    computed = []

    def counting(path, *arguments):
        computed.append(os.path.basename(path))
        return safe_bound_shard(path, *arguments)

    resumed = run(folder / "*.npz", out=out, shard_function=counting)
    assert len(computed) == 4 and resumed["shards"]["computed_now"] == 4
    assert clean(resumed) == clean(run(folder / "*.npz"))
    assert run(folder / "*.npz", out=out, shard_function=counting)["shards"]["computed_now"] == 0


def die_once(path, *arguments):
    """Shard task that kills its worker process the first time it sees full_1.npz."""
    marker = path + ".died"
    if path.endswith("full_1.npz") and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)
    return safe_bound_shard(path, *arguments)


def test_a_killed_worker_is_replaced_and_its_shard_recomputed(shards):
    folder, _ = shards
    cluster = run(folder / "full_*.npz", workers=2, shard_function=die_once)
    assert os.path.exists(folder / "full_1.npz.died")  # the worker did die
    assert clean(cluster) == clean(run(folder / "full_*.npz"))


def test_bad_shards_are_named_skipped_and_never_averaged(shards):
    folder, pairs = shards
    p, q = pairs[0]
    bad_p = p.copy()
    bad_p[2, 3] = np.nan
    write_full_log(folder / "bad_nan.npz", bad_p, q)
    write_full_log(folder / "bad_sum.npz", p * 1.5, q)
    np.savez(folder / "bad_shape.npz", p=p, q=q[:, :10])
    (folder / "bad_unreadable.npz").write_bytes(b"not a zip file")
    arrays = top_k_arrays(p, q, 5)
    arrays["p_ids"][1, 1] = arrays["p_ids"][1, 0]  # a repeated id
    write_topk_log(folder / "bad_ids.npz", arrays, 60)
    with zipfile.ZipFile(folder / "bad_truncated.npz", "w") as archive:
        archive.writestr("p.npy", b"\x93NUMPY")
    report = run(folder / "*.npz")
    skipped = {entry["shard"]: entry["error"] for entry in report["shards"]["skipped"]}
    assert set(skipped) == {
        "bad_nan.npz",
        "bad_sum.npz",
        "bad_shape.npz",
        "bad_unreadable.npz",
        "bad_ids.npz",
        "bad_truncated.npz",
    }
    assert "NaN" in skipped["bad_nan.npz"] and "sums to 1.5" in skipped["bad_sum.npz"]
    assert "same shape" in skipped["bad_shape.npz"] or "one shape" in skipped["bad_shape.npz"]
    assert "repeat" in skipped["bad_ids.npz"] and "unreadable" in skipped["bad_unreadable.npz"]
    assert report["shards"]["skipped_count"] == 6 and report["shards"]["used"] == 6
    good = run(folder / "[ft][uo]*_*.npz")
    for key in ("overlap", "optimal", "verifiers", "by_feature", "positions"):
        assert report[key] == good[key]


def test_an_existing_scheduler_address_runs_the_same_shards(shards):
    from distributed import LocalCluster

    folder, _ = shards
    with LocalCluster(n_workers=2, processes=False, threads_per_worker=1, dashboard_address=":0") as cluster:
        remote = run(folder / "top_*.npz", scheduler=cluster.scheduler_address)
    assert clean(remote) == clean(run(folder / "top_*.npz"))


def test_feature_histograms_hold_every_position_of_their_bin_at_its_value(shards):
    """Per temperature and per entropy bin: the 20-bin histogram of alpha* iid is the bincount of the exact
    per-position values in that bin (full logs: low = high), and the bins partition the positions."""
    from experiments.log_bounds import ENTROPY_EDGES, GROUP_HIST_BINS
    from experiments.logformat import entropy

    folder, pairs = shards
    report = run(folder / "full_*.npz")
    p = np.concatenate([pair[0] for pair in pairs]).astype(np.float32).astype(np.float64)
    q = np.concatenate([pair[1] for pair in pairs]).astype(np.float32).astype(np.float64)
    p, q = p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)
    temperature = np.concatenate([np.full(len(pair[0]), 0.5 + i) for i, pair in enumerate(pairs)])
    values = optimal_acceptance(p, q, 3)
    bins = np.clip((values * GROUP_HIST_BINS).astype(int), 0, GROUP_HIST_BINS - 1)
    feature = entropy(p)
    masks = {f"temperature {t:g}": temperature == t for t in (0.5, 1.5, 2.5)}
    for lo, hi in zip(ENTROPY_EDGES[:-1], ENTROPY_EDGES[1:], strict=True):
        masks[f"entropy [{lo:g}, {hi:g})"] = (feature >= lo) & (feature < hi)
    groups = report["by_feature"]
    assert set(groups) == {label for label, mask in masks.items() if mask.any()}
    assert sum(g["positions"] for g in groups.values() if g["feature"] == "entropy") == len(p)
    assert len([label for label in groups if label.startswith("entropy")]) >= 2  # not one trivial bin
    for label, group in groups.items():
        expected = np.bincount(bins[masks[label]], minlength=GROUP_HIST_BINS)
        histogram = group["iid@3"]["histogram"]
        assert histogram["low"] == histogram["high"] == expected.tolist()
        assert group["iid@3"]["mean"] == pytest.approx(values[masks[label]].mean(), abs=1e-6)
        median = group["iid@3"]["quantiles_low"]["0.5"]
        assert abs(median - np.median(values[masks[label]])) <= 1.0 / GROUP_HIST_BINS + 1e-9


def test_feature_histograms_of_top_k_logs_bracket_the_full_values(shards):
    """Top-k shards: per bin, the low-end histogram lies left of the high-end one (first-order dominance)."""
    folder, _ = shards
    report = run(folder / "top_*.npz")
    for group in report["by_feature"].values():
        for key in ("iid@2", "rrs@3", "overlap@1"):
            low = np.cumsum(group[key]["histogram"]["low"])
            high = np.cumsum(group[key]["histogram"]["high"])
            assert np.all(low >= high) and low[-1] == high[-1] == group["positions"]


def test_top_k_chunks_bounded_in_small_blocks_give_the_same_summary(shards, monkeypatch):
    """Cutting read chunks into row blocks (bounded memory) changes only the summation order."""
    import experiments.log_bounds as log_bounds

    folder, _ = shards
    path = str(folder / "top_2.npz")
    whole = log_bounds.bound_shard(path, NS, verifiers=VERIFIERS)
    monkeypatch.setattr(log_bounds, "TOPK_BLOCK_ROWS", 2)
    blocked = log_bounds.bound_shard(path, NS, verifiers=VERIFIERS)
    assert blocked["positions"] == whole["positions"] == 9
    assert blocked["hist"] == whole["hist"]
    for key, pair in whole["sums"].items():
        assert blocked["sums"][key] == pytest.approx(pair, abs=1e-12)
