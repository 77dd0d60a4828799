"""Logs: summary metrics from hand-made steps, distribution records, JSON round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from executor.decoders import ChainDecoder, Sampling, TreeDecoder
from executor.drafters import EarlyExitDrafter, PromptLookupDrafter
from executor.logs import (
    GenerationResult,
    StepLog,
    parse_log_mode,
    record_distributions,
    step_distributions,
)


def chain_step(gamma: int, accepted: int) -> StepLog:
    tokens = list(range(gamma + 1))
    return StepLog(
        tokens=tokens,
        parents=[-1] + list(range(gamma)),
        accepted_path=list(range(accepted + 1)),
        emitted=[0] * (accepted + 1),
        expanded=list(range(gamma)),
        accepted=[accepted > d for d in range(gamma)],
    )


def test_tau_and_per_position_acceptance_follow_the_ecosystem_definitions():
    steps = [chain_step(3, 0), chain_step(3, 3), chain_step(3, 1), chain_step(0, 0)]
    result = GenerationResult([1], [0] * 8, steps, wall_time=2.0, prefill_time=0.5)
    assert result.tau == 8 / 4  # bonus tokens included
    assert result.acceptance_per_position == [2 / 3, 1 / 3, 1 / 3]  # over the 3 steps that drafted
    assert result.acceptance_rate == 4 / 9
    assert result.tokens_per_second == 4.0


@given(st.integers(2, 12), st.integers(1, 4), st.integers(0, 2**16))
def test_topk_record_keeps_the_exact_mass_of_logged_tokens_and_the_rest(vocab, k, seed):
    generator = torch.Generator().manual_seed(seed)
    p = torch.rand(3, vocab, generator=generator).softmax(-1)
    q = torch.rand(3, vocab, generator=generator).softmax(-1)
    log = record_distributions(p, q, f"topk:{k}")
    p_np, q_np = step_distributions(StepLog([0], [-1], [0], [0], [0, 1, 2], [], distributions=log))
    for row in range(3):
        ids = log.ids[row][log.ids[row] >= 0]
        assert set(torch.topk(p[row], min(k, vocab)).indices.tolist()) <= set(ids.tolist())
        np.testing.assert_allclose(p_np[row, : len(ids)], p[row, ids].double().numpy(), rtol=1e-5)
        exact = float(torch.minimum(p[row], q[row]).sum())
        # The rest bucket can only over-count min(p, q): an upper bound on the acceptance.
        assert np.minimum(p_np[row], q_np[row]).sum() >= exact - 1e-6
    np.testing.assert_allclose(p_np.sum(-1), 1.0)


def test_full_logs_give_the_distributions_that_were_verified(tiny_model):
    model = tiny_model(3, vocab_size=8, max_seq_len=64)
    decoder = ChainDecoder(
        model,
        EarlyExitDrafter(model, 1),
        gamma=2,
        sampling=Sampling(temperature=1.0),
        log_distributions="full",
    )
    result = decoder.generate([1, 2, 3], 6, generator=torch.Generator().manual_seed(0))
    for step in result.steps:
        p, q = step_distributions(step)
        assert p.shape == q.shape == (len(step.expanded), 8)
        # Each drafted token had positive draft probability at its position.
        for row, node in enumerate(step.expanded):
            assert q[row, step.tokens[node + 1]] > 0


def test_prompt_lookup_steps_say_their_drafts_are_deterministic(tiny_model):
    model = tiny_model(3, vocab_size=8, max_seq_len=64)
    result = ChainDecoder(model, PromptLookupDrafter(), gamma=2, log_distributions="topk:2").generate(
        [1, 2, 1, 2, 1], 6
    )
    drafted = [s for s in result.steps if s.n_drafted]
    assert drafted and all(s.deterministic_drafts for s in drafted)
    _, q = step_distributions(drafted[0])
    assert np.all(q.max(-1) == 1.0)


def test_result_json_round_trips_without_tensors(tiny_model, tmp_path):
    model = tiny_model(3, vocab_size=8, max_seq_len=64)
    decoder = TreeDecoder(model, EarlyExitDrafter(model, 1), tree=[-1, 0, 0, 1], log_distributions="full")
    result = decoder.generate([1, 2, 3], 5)
    path = tmp_path / "out" / "result.json"
    path.parent.mkdir()
    path.write_text(json.dumps(result.to_json()))
    loaded = json.loads(path.read_text())
    assert loaded["token_ids"] == result.token_ids
    assert loaded["tau"] == pytest.approx(result.tau)
    assert len(loaded["step_logs"]) == len(result.steps)


def test_bad_log_modes_are_rejected():
    for mode in ("top3", "topk:0", "topk:x", "all"):
        with pytest.raises(ValueError, match="log_distributions must be"):
            parse_log_mode(mode)
