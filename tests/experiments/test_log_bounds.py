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
