"""``specbound convert-log`` and ``specbound bound --logs``: the log format, the outputs, the error paths."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from experiments.cli import main
from experiments.logformat import TOPK_FORMAT, LogShard, top_k_arrays, write_full_log
from theory import optimal_acceptance


def lm_pair(seed, rows=6, vocab=40):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(rows, vocab)) * 2.0
    p = np.exp(logits)
    q = np.exp(logits + rng.normal(size=logits.shape))
    return p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)


@pytest.fixture
def full_log(tmp_path):
    p, q = lm_pair(1)
    path = tmp_path / "full.npz"
    write_full_log(path, p, q, temperature=0.7)
    return path, p.astype(np.float32).astype(np.float64), q.astype(np.float32).astype(np.float64)


def bound_json(capsys, *arguments):
    assert main(["bound", "--logs", *arguments, "--workers", "0", "--no-progress", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_convert_log_writes_the_documented_top_k_format(full_log, tmp_path, capsys):
    path, p, q = full_log
    out = tmp_path / "top.npz"
    assert main(["convert-log", "--top-k", "4", "--draft-top-k", "6", str(path), str(out)]) == 0
    assert "6 positions, top-4 of p and top-6 of q of V = 40" in capsys.readouterr().out
    with np.load(out) as archive:
        assert str(archive["format"]) == TOPK_FORMAT and int(archive["vocab_size"]) == 40
        ids, logprobs = archive["p_ids"], archive["p_logprobs"]
        assert ids.shape == (6, 4) and archive["q_ids"].shape == (6, 6)
        np.testing.assert_array_equal(ids, np.argsort(-p, axis=1, kind="stable")[:, :4])
        np.testing.assert_allclose(np.exp(logprobs), np.take_along_axis(p, ids, 1), rtol=1e-6)
        np.testing.assert_allclose(
            archive["p_rest"], 1 - np.exp(logprobs.astype(np.float64)).sum(1), atol=1e-6
        )
        np.testing.assert_allclose(archive["temperature"], 0.7)
        np.testing.assert_allclose(archive["entropy"], -(p * np.log(p)).sum(1), rtol=1e-5)


def test_streamed_chunks_equal_the_whole_arrays_for_stored_and_compressed_archives(full_log, tmp_path):
    _, p, q = full_log
    for saver in (np.savez, np.savez_compressed):
        path = tmp_path / f"{saver.__name__}.npz"
        saver(path, p=p, q=q)
        shard = LogShard.open(path)
        parts = list(shard.chunks(max_bytes=3 * shard.row_bytes))
        assert [start for start, _ in parts] == [0, 3] and shard.kind == "full"
        np.testing.assert_array_equal(np.concatenate([c["p"] for _, c in parts]), p)


def test_no_two_threads_parse_an_npy_header_at_once(full_log, monkeypatch):
    """numpy parses headers with ``ast.literal_eval``, which CPython 3.11 does not make thread-safe: shards
    opened by the threads of one Dask worker must take turns (``logformat._HEADER_LOCK``)."""
    path, _, _ = full_log
    real_reader = np.lib.format.read_array_header_1_0
    lock = threading.Lock()
    state = {"inside": 0, "most": 0}

    def slow_reader(stream, *arguments, **options):
        with lock:
            state["inside"] += 1
            state["most"] = max(state["most"], state["inside"])
        time.sleep(0.002)  # long enough for the other threads to arrive
        try:
            return real_reader(stream, *arguments, **options)
        finally:
            with lock:
                state["inside"] -= 1

    monkeypatch.setattr(np.lib.format, "read_array_header_1_0", slow_reader)
    with ThreadPoolExecutor(max_workers=4) as pool:
        shards = list(pool.map(LogShard.open, [path] * 8))
    assert all(shard.kind == "full" for shard in shards)
    assert state["most"] == 1


def test_bound_json_reports_mean_low_high_per_law_and_n_with_shard_counts(full_log, tmp_path, capsys):
    path, p, q = full_log
    result = bound_json(capsys, str(path), "-n", "2", "4")
    for n in (2, 4):
        entry = result["optimal"]["wor"][str(n)]
        assert entry["low"] == entry["high"] == entry["mean"]
        assert entry["mean"] == pytest.approx(np.mean(optimal_acceptance(p, q, n, draft="wor")), abs=1e-9)
    assert result["shards"]["per_shard"] == {"full.npz": {"positions": 6, "kind": "full", "width": None}}
    assert result["shards"]["skipped"] == [] and result["shards"]["skipped_count"] == 0


def test_without_n_the_report_adds_the_draft_count_a_log_was_taken_with(tmp_path, capsys):
    p, q = lm_pair(2)
    write_full_log(tmp_path / "a.npz", p, q, n=3)
    write_full_log(tmp_path / "b.npz", p, q)  # no n: nothing added
    assert bound_json(capsys, str(tmp_path / "*.npz"))["n"] == [2, 3, 4, 8]
    assert bound_json(capsys, str(tmp_path / "*.npz"), "-n", "4")["n"] == [4]  # -n decides alone


def test_log_names_one_file_as_logs_names_a_pattern(full_log, capsys):
    """``bound --log FILE.npz`` (a user's one log) reads the same as ``--logs PATTERN``."""
    path, _, _ = full_log
    by_pattern = bound_json(capsys, str(path), "-n", "2")
    assert main(["bound", "--log", str(path), "-n", "2", "--workers", "0", "--no-progress", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == by_pattern


def test_a_log_with_mismatched_shapes_exits_non_zero_naming_the_argument(tmp_path, capsys):
    """With no usable log the command fails and says why (a bad shard among good ones is skipped, reported)."""
    bad = tmp_path / "bad.npz"
    np.savez(bad, p=np.full((3, 5), 0.2), q=np.full((3, 4), 0.25))
    assert main(["bound", "--log", str(bad), "--workers", "0", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--logs" in err and "bad.npz" in err and "one shape" in err


def test_top_k_with_k_equal_to_v_reproduces_the_full_log(full_log, tmp_path, capsys):
    path, _, _ = full_log
    out = tmp_path / "all.npz"
    assert main(["convert-log", "--top-k", "40", str(path), str(out)]) == 0
    capsys.readouterr()
    full = bound_json(capsys, str(path), "-n", "2", "3", "--verifiers", "rrs", "greedy", "spechub")
    top = bound_json(capsys, str(out), "-n", "2", "3", "--verifiers", "rrs", "greedy", "spechub")
    for draft in ("iid", "wor"):
        for n in ("2", "3"):
            entry = top["optimal"][draft][n]
            assert entry["high"] - entry["low"] < 1e-12
            assert entry["mean"] == pytest.approx(full["optimal"][draft][n]["mean"], abs=1e-6)
    assert top["verifiers"]["greedy"]["n"]["3"]["low"] == pytest.approx(
        full["verifiers"]["greedy"]["n"]["3"]["low"], abs=1e-6
    )


def test_out_directory_gets_json_markdown_plot_and_shard_results(full_log, tmp_path, capsys):
    path, _, _ = full_log
    out = tmp_path / "report"
    assert (
        main(["bound", "--logs", str(path), "--workers", "0", "--no-progress", "--out", str(out), "-n", "2"])
        == 0
    )
    assert "alpha* n = 2" in capsys.readouterr().out
    assert json.loads((out / "report.json").read_text())["positions"] == 6
    markdown = (out / "report.md").read_text()
    assert "| iid |" in markdown
    report = json.loads((out / "report.json").read_text())
    for label, group in report["by_feature"].items():  # one Markdown row per feature bin, with its quantiles
        quantiles = group["iid@2"]["quantiles_low"]
        cell = " / ".join(f"{quantiles[k]:.3f}" for k in ("0.05", "0.5", "0.95"))
        assert f"| {group['feature']} | {group['bin']} | {group['positions']} |" in markdown
        assert cell in markdown, label
    assert (out / "bound_vs_n.png").stat().st_size > 1000
    assert len(list((out / "shards").glob("*.json"))) == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["bound", "--logs", "{tmp}/nothing*.npz"], "--logs: no file matches"),
        (["bound", "--logs", "{full}", "--workers", "-1"], "--workers must be >= 0"),
        (["bound", "--logs", "{full}", "-n", "0"], "-n: drafts per step must be at least 1"),
        (["bound", "--logs", "{full}", "--verifiers", "magic"], "--verifiers: unknown magic"),
        (["bound", "--logs", "{full}", "--out", "{full}"], "--out: "),
        (["bound", "--logs", "{full}", "--example"], "do not combine"),
        (["bound", "--logs", "{full}", "--draft", "greedy"], "--draft: with --logs"),
        (["convert-log", "--top-k", "0", "{full}", "{tmp}/o.npz"], "--top-k must be at least 1"),
        (["convert-log", "--top-k", "3", "{tmp}/missing.npz", "{tmp}/o.npz"], "IN.npz"),
    ],
)
def test_bad_arguments_exit_non_zero_naming_the_argument(full_log, tmp_path, capsys, arguments, message):
    path, _, _ = full_log
    arguments = [a.replace("{full}", str(path)).replace("{tmp}", str(tmp_path)) for a in arguments]
    assert main(arguments) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specbound") and message in err and "\n" not in err


def test_top_k_arrays_keep_ties_in_token_order():
    p = np.array([[0.25, 0.25, 0.25, 0.25]])
    arrays = top_k_arrays(p, p, 2)
    np.testing.assert_array_equal(arrays["p_ids"], [[0, 1]])


def test_generation_logs_are_written_from_the_executor_step_logs(tmp_path):
    import torch

    from executor.logs import DistributionLog, GenerationResult, StepLog
    from experiments.logformat import write_generation_log

    p, q = lm_pair(4, rows=5, vocab=30)
    steps = [
        StepLog(
            [1, 2],
            [-1, 0],
            [0],
            [3],
            [0],
            [False],
            DistributionLog("full", torch.tensor(p[:2]), torch.tensor(q[:2])),
        ),
        StepLog(
            [1, 2],
            [-1, 0],
            [0, 1],
            [2, 3],
            [0],
            [True],
            DistributionLog("full", torch.tensor(p[2:]), torch.tensor(q[2:])),
        ),
    ]
    result = GenerationResult([0], [3, 2, 3], steps, 1.0, 0.1)
    assert write_generation_log([result], tmp_path / "full.npz", temperature=1.0) == 5
    with np.load(tmp_path / "full.npz") as archive:
        np.testing.assert_allclose(archive["p"], p, rtol=1e-6)
    write_generation_log([result], tmp_path / "top.npz", top_k=3)
    assert LogShard.open(tmp_path / "top.npz").kind == "topk"
    with pytest.raises(ValueError, match="--log-top-k must be at least 1"):
        write_generation_log([result], tmp_path / "x.npz", top_k=0)
    nothing_drafted = StepLog([1], [-1], [0], [3], [], [])  # a lookup that found no match
    mixed = GenerationResult([0], [3, 3, 2, 3], [nothing_drafted, *steps], 1.0, 0.1)
    assert write_generation_log([mixed], tmp_path / "mixed.npz") == 5
    empty = GenerationResult([0], [3], [nothing_drafted], 1.0, 0.1)
    with pytest.raises(ValueError, match="drafted no position"):
        write_generation_log([empty], tmp_path / "x.npz")
    unlogged = StepLog([1, 2], [-1, 0], [0], [3], [0], [False])
    with pytest.raises(ValueError, match="full distribution logs"):
        write_generation_log([GenerationResult([0], [3], [unlogged], 1.0, 0.1)], tmp_path / "x.npz")


@pytest.mark.slow
def test_generate_log_out_writes_a_log_that_bound_reads(tmp_path, capsys):
    out = tmp_path / "gen.npz"
    arguments = ["generate", "--prompt", "def add(a, b):", "--decoder", "chain", "--gamma", "2"]
    arguments += ["--temperature", "1", "--max-new-tokens", "4", "--threads", "1", "--log-out", str(out)]
    assert main([*arguments, "--log-top-k", "20"]) == 0
    capsys.readouterr()
    result = bound_json(capsys, str(out), "-n", "2", "--verifiers", "rrs")
    assert result["positions"] >= 2 and result["kinds"] == ["topk"]
    entry = result["optimal"]["iid"]["2"]
    assert 0 <= entry["low"] <= entry["high"] <= 1
