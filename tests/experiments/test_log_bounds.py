"""``bound_shard``: the shard's bounds run inside ``retained_heap``, and its summary does not depend on it."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import experiments.log_bounds as log_bounds
from experiments.logformat import top_k_arrays, write_topk_log

NS = (2, 4)


@pytest.fixture
def top_k_shard(tmp_path):
    """LM-like pairs (V = 80) logged as top-6 / top-9: the without-replacement quadrature runs on them."""
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(40, 80)) * 2.0
    p = np.exp(logits)
    q = np.exp(logits + rng.normal(size=logits.shape))
    p, q = p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)
    path = tmp_path / "top.npz"
    write_topk_log(path, top_k_arrays(p, q, 6, 9), 80, temperature=1.0)
    return str(path)


def test_the_shard_is_bounded_inside_the_retained_heap_block(top_k_shard, monkeypatch):
    inside = []

    @contextlib.contextmanager
    def recording():
        inside.append(True)
        yield
        inside.append(False)

    calls = []
    real = log_bounds._topk_values
    monkeypatch.setattr(log_bounds, "retained_heap", recording)
    monkeypatch.setattr(log_bounds, "_topk_values", lambda *a: calls.append(inside[-1]) or real(*a))
    log_bounds.bound_shard(top_k_shard, NS, verifiers=())
    assert calls and all(calls) and inside[-1] is False


@pytest.mark.parametrize("wor_low", ["dust", "iid"])
def test_the_summary_is_bit_for_bit_that_of_the_plain_allocator(top_k_shard, monkeypatch, wor_low):
    tuned = log_bounds.bound_shard(top_k_shard, NS, wor_low=wor_low)
    monkeypatch.setattr(log_bounds, "retained_heap", contextlib.nullcontext)
    plain = log_bounds.bound_shard(top_k_shard, NS, wor_low=wor_low)
    assert tuned == plain  # floats compared exactly: sums, histograms, groups, counts
    assert tuned["positions"] == 40 and tuned["sums"]["wor@4"][0] < tuned["sums"]["wor@4"][1]


def test_rows_with_fewer_draft_tokens_than_n_draft_them_all_as_the_top_k_path_does(tmp_path):
    """A prompt-lookup log (one-hot q) next to LM rows: the distinct-draft laws take k = min(n, |supp q|)."""
    from experiments.logformat import write_full_log
    from theory import optimal_acceptance, verifier

    rng = np.random.default_rng(8)
    p = rng.dirichlet(np.ones(12), size=6)
    q = rng.dirichlet(np.ones(12), size=6)
    q[:2] = np.eye(12)[[3, 7]]  # one token: the lookup's draft
    q[2] = 0.0
    q[2, [1, 5]] = 0.5  # two tokens, fewer than n = 3
    path = tmp_path / "full.npz"
    write_full_log(path, p, q, temperature=1.0)
    with np.load(path) as archive:  # the oracle reads the rows as stored (float32, renormalised)
        p, q = (archive[k].astype(np.float64) for k in ("p", "q"))
    p, q = p / p.sum(1, keepdims=True), q / q.sum(1, keepdims=True)
    summary = log_bounds.bound_shard(str(path), (3,), verifiers=("rrs", "rrs_wor"))
    overlap = np.minimum(p, q).sum(1)
    wor = np.concatenate(
        [
            overlap[:2],
            [optimal_acceptance(p[2], q[2], 2, draft="wor")],
            optimal_acceptance(p[3:], q[3:], 3, draft="wor"),
        ]
    )
    rrs_wor = np.concatenate(
        [
            overlap[:2],
            [verifier("rrs_wor").acceptance(p[2], q[2], 2)],
            verifier("rrs_wor").acceptance(p[3:], q[3:], 3),
        ]
    )
    np.testing.assert_allclose(summary["sums"]["wor@3"], [wor.sum()] * 2, rtol=1e-12)
    np.testing.assert_allclose(summary["sums"]["rrs_wor@3"], [rrs_wor.sum()] * 2, rtol=1e-12)
    assert summary["sums"]["wor@3"][0] >= summary["sums"]["rrs_wor@3"][0] - 1e-12
    # One token drafted: every verifier is plain speculative sampling; all of q's support: p(supp q) accepted.
    np.testing.assert_allclose(wor[2], p[2, [1, 5]].sum(), rtol=1e-12)
    top = tmp_path / "top.npz"
    write_topk_log(top, top_k_arrays(p, q, 12), 12, temperature=1.0)
    interval = log_bounds.bound_shard(str(top), (3,), verifiers=("rrs_wor",))["sums"]["wor@3"]
    assert interval[0] - 1e-6 <= wor.sum() <= interval[1] + 1e-6  # float32 log-probabilities
