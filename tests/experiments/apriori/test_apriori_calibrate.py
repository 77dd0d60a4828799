"""experiments.apriori.calibrate: the prompt split, event records, the calibration profile, the latency profile.

Exact oracles: a synthetic chain whose every drafted position has acceptance ``sum(min(p, q)) = a`` must give
the positional profile ``[a, a, ...]`` whatever its sampled outcomes; at temperature 0 the rank of the
target's argmax decides every acceptance.
"""

import json

import numpy as np
import pytest
import torch

import theory
from executor.logs import DistributionLog, StepLog
from experiments.apriori.calibrate import (
    MIN_EVENTS,
    LatencyProfile,
    RecordingDrafter,
    calibrate,
    confidence_buckets,
    event_record,
    read_latency,
    shallow_profile,
    split_prompts,
    verification_events,
)
from tests.tiny_models import build_tiny_model

LATENCY = LatencyProfile({1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3, 5: 1.4}, 0.25)


def test_split_is_a_partition_fixed_by_the_seed():
    calibration, evaluation = split_prompts(10, seed=3)
    assert sorted(calibration + evaluation) == list(range(10)) and len(calibration) == 5
    assert split_prompts(10, seed=3) == (calibration, evaluation)
    assert split_prompts(10, seed=4) != (calibration, evaluation)


def test_split_needs_two_prompts():
    with pytest.raises(ValueError, match="prompts"):
        split_prompts(1, seed=0)


def chain_step(a: float, gamma: int, accepted: int) -> StepLog:
    """A chain step whose every drafted position has p = [a, 1-a, 0], q = [a, 0, 1-a]: acceptance a."""
    p = torch.tensor([[a, 1 - a, 0.0]] * gamma)
    q = torch.tensor([[a, 0.0, 1 - a]] * gamma)
    return StepLog(
        tokens=[0] * (gamma + 1),
        parents=[-1, *range(gamma)],
        accepted_path=list(range(accepted + 1)),
        emitted=[0] * (accepted + 1),
        expanded=list(range(gamma)),
        accepted=[accepted > d for d in range(gamma)],
        distributions=DistributionLog("full", p, q),
    )


def records_of(steps, temperature=1.0, grid=()):
    from executor.logs import step_distributions

    records = []
    for step in steps:
        p_rows, q_rows = step_distributions(step)
        for row, _node, n_children, accepted, depth in verification_events(step):
            records.append(
                event_record(
                    p_rows[row],
                    q_rows[row],
                    np.log(q_rows[row] + 1e-30),
                    temperature=temperature,
                    depth=depth,
                    n_children=n_children,
                    accepted=accepted,
                    verifier="rrs",
                    grid=grid,
                )
            )
    return records


def test_bernoulli_chain_calibrates_to_its_constant_acceptance():
    a, gamma = 0.6, 4
    rng = np.random.default_rng(0)
    steps = []
    for _ in range(400):
        accepted = 0
        while accepted < gamma and rng.random() < a:
            accepted += 1
        steps.append(chain_step(a, gamma, accepted))
    cal = calibrate(records_of(steps, grid=(("rrs", 2),)), LATENCY, temperature=1.0, depth=gamma)
    assert cal.positional == pytest.approx([a] * gamma, abs=1e-6)
    assert cal.events[0] == 400 and cal.events[1] < 400
    # The rank vector is RRS without replacement with one and two drafts: p = [a, 1-a, 0], q = [a, 0, 1-a].
    p, q = np.array([a, 1 - a, 0]), np.array([a, 0, 1 - a])
    alpha2 = theory.verifier("rrs_wor").acceptance(p, q, 2)
    assert cal.rank_matrix[0] == pytest.approx([a, alpha2 - a], abs=1e-6)
    assert cal.multidraft["rrs-n2"] == pytest.approx(theory.verifier("rrs").acceptance(p, q, 2), abs=1e-6)


def test_events_stop_at_the_first_rejection():
    step = chain_step(0.5, 3, accepted=1)
    assert [(d, accepted) for _, _, _, accepted, d in verification_events(step)] == [(0, True), (1, False)]


def test_temperature_zero_acceptance_is_decided_by_the_rank_of_the_target_argmax():
    p = np.array([0.0, 0.0, 1.0, 0.0])
    logits = np.array([3.0, 1.0, 2.0, 2.0])  # token 2 is the draft's second choice (ties go to the lower id)
    record = event_record(
        p,
        p,
        logits,
        temperature=0.0,
        depth=0,
        n_children=2,
        accepted=True,
        verifier="rrs",
        grid=(("rrs", 1), ("kseq", 2)),
    )
    assert record["chain"] == 0.0 and record["ranks"] == [0.0, 1.0, 0.0, 0.0]
    assert record["replay"] == 1.0 and record["grid"] == {"rrs-n1": 0.0, "kseq-n2": 1.0}
    softmax = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert record["confidence"] == pytest.approx(softmax.max())


def test_temperature_one_record_holds_the_theory_exact_values_computed_once_each():
    """Shared values (rank 1 = the chain, the run's own verifier in the grid = the replay, one alpha* per draft
    law and n) are reused, each at its own key."""
    rng = np.random.default_rng(5)
    p, q = rng.dirichlet(np.full(12, 0.5)), rng.dirichlet(np.full(12, 0.5))
    grid = (("rrs", 2), ("rrs", 4), ("kseq", 2), ("optimal", 4), ("spechub", 2))
    record = event_record(
        p, q, np.log(q), temperature=1.0, depth=0, n_children=4, accepted=True, verifier="optimal", grid=grid
    )
    wor = theory.verifier("rrs_wor")
    assert record["chain"] == pytest.approx(theory.acceptance_rate(p, q), abs=1e-15)
    ranks = [wor.acceptance(p, q, 1), wor.acceptance(p, q, 2) - wor.acceptance(p, q, 1)]
    assert record["ranks"] == pytest.approx(ranks, abs=1e-12)
    assert record["replay"] == pytest.approx(theory.verifier("optimal").acceptance(p, q, 4), abs=1e-12)
    for name, n in grid:
        check = theory.verifier(name)
        assert record["grid"][f"{name}-n{n}"] == pytest.approx(check.acceptance(p, q, n), abs=1e-12)
        optimum = theory.optimal_acceptance(p, q, n, draft=check.draft)
        assert record["bound"][f"{name}-n{n}"] == pytest.approx(optimum, abs=1e-12)
    assert record["bound"]["spechub-n2"] != pytest.approx(record["bound"]["rrs-n2"], abs=1e-6)  # not vacuous


def test_a_shallow_depth_without_enough_events_reuses_the_estimate_above_it():
    records = [
        {"depth": 0, "chain": 0.5, "ranks": [0.5, 0.1], "confidence": 0.5, "grid": {}, "bound": {}}
    ] * 10
    records += [{"depth": 1, "chain": 0.9, "ranks": [0.9, 0.0], "confidence": 0.9}] * (MIN_EVENTS - 1)
    cal = calibrate(records, LATENCY, temperature=1.0, depth=3)
    assert cal.positional == [0.5, 0.5, 0.5] and cal.events == [10, MIN_EVENTS - 1, 0]
    with pytest.raises(ValueError, match="records"):
        calibrate(records[10:], LATENCY, temperature=1.0, depth=3)


def test_confidence_buckets_are_quantiles_with_their_mean_acceptance():
    confidence = [0.1, 0.2, 0.8, 0.9]
    buckets = confidence_buckets(confidence, [0.0, 0.2, 0.6, 1.0], 2)
    assert buckets["probability"] == [0.5, 0.5]
    assert buckets["confidence"] == pytest.approx([0.15, 0.85]) and buckets["acceptance"] == pytest.approx(
        [0.1, 0.8]
    )
    assert np.searchsorted(buckets["edges"], 0.85, side="right") == 1


def test_recording_drafter_keeps_each_expanded_node_logits():
    from executor.decoders import ChainDecoder, Sampling
    from executor.drafters import parse_drafter

    model = build_tiny_model(seed=1, vocab_size=10, n_layers=4)
    inner = parse_drafter("early-exit:1", model)
    decoder = ChainDecoder(
        model, inner, gamma=3, sampling=Sampling(temperature=1.0), log_distributions="full"
    )
    recorder = RecordingDrafter(inner)
    recorder.attach(decoder)
    result = decoder.generate([1, 2, 3], 8, generator=torch.Generator().manual_seed(0))
    assert len(recorder.logits_per_step) == len(result.steps)
    for step, logits in zip(result.steps, recorder.logits_per_step, strict=True):
        assert sorted(logits) == step.expanded
        q = torch.softmax(torch.tensor(np.stack([logits[v] for v in step.expanded])), -1)
        assert torch.allclose(q, step.distributions.q, atol=1e-5)
    assert [n for _, n, _ in recorder.call_times] == [1] * (3 * len(result.steps))  # one node per level
    assert [level for level, _, _ in recorder.call_times] == [0, 1, 2] * len(result.steps)


def test_latency_profile_interpolates_and_extrapolates_linearly():
    assert LATENCY.t(2.5) == pytest.approx(1.15) and LATENCY.t(7) == pytest.approx(1.6)
    assert (
        LatencyProfile.from_json(json.loads(json.dumps(LATENCY.to_json()))).target_time == LATENCY.target_time
    )


def test_read_latency_names_the_argument(tmp_path):
    path = tmp_path / "latency.json"
    path.write_text(json.dumps({"target_time": {"1": 0.02, "4": 0.03}, "draft_time": 0.01}))
    assert read_latency(str(path)).t(4) == 0.03
    path.write_text(json.dumps({"something": 1}))
    with pytest.raises(ValueError, match="--latency"):
        read_latency(str(path))
    with pytest.raises(ValueError, match="--latency"):
        read_latency(str(tmp_path / "missing.json"))


def test_read_latency_reads_a_specbound_profile_file(tmp_path):
    path = tmp_path / "profile.json"
    profile = {
        "format": "specbound-profile",
        "version": 1,
        "target": {"sizes": [1, 2, 4, 8], "times": [0.03, 0.032, 0.036, 0.044]},
        "drafter": {"name": "early-exit:20", "draft_time": 0.02},
    }
    path.write_text(json.dumps(profile))
    latency = read_latency(str(path))
    assert latency.draft_time == 0.02 and latency.t(3) == pytest.approx(0.034) and latency.t(8) == 0.044
    profile["drafter"] = None  # measured with --drafter none: no draft cost to plan with
    path.write_text(json.dumps(profile))
    with pytest.raises(ValueError, match="--latency"):
        read_latency(str(path))


def test_latency_is_measured_for_every_size_and_the_drafter():
    from experiments.apriori.calibrate import measure_latency

    model = build_tiny_model(seed=1, vocab_size=10, n_layers=4, max_seq_len=64)
    latency = measure_latency(model, "early-exit:1", [1, 2, 4], temperature=1.0, context=16, repeats=2)
    assert sorted(latency.target_time) == [1, 2, 4] and all(t > 0 for t in latency.target_time.values())
    assert latency.draft_time > 0 and "measured" in latency.source


class CountingDrafter:
    """Wraps a drafter and keeps what each ``draft_logits`` call returned (``None`` or a row count)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.returned: list[int | None] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def draft_logits(self, state, tree, nodes):
        logits = self.inner.draft_logits(state, tree, nodes)
        self.returned.append(None if logits is None else logits.shape[0])
        return logits


def test_a_feature_drafter_is_timed_on_the_state_the_decoders_give_it():
    # A feature head drafts nothing without the target's hidden states: timing it on a bare state measured a
    # call that returns None, so c = 0 and every predicted speedup was inflated.
    from experiments.apriori.calibrate import measure_latency
    from tests.executor.test_drafters_feature import drafter_for

    model = build_tiny_model(seed=1, vocab_size=10, n_layers=2, max_seq_len=64)
    drafter = CountingDrafter(drafter_for(model))
    latency = measure_latency(model, drafter, [1, 2], temperature=1.0, context=16, repeats=3)
    # One untimed call feeding the context, then a root and a child call per round (4 rounds): all drafted.
    assert drafter.returned == [1] * 9
    cost = latency.draft_time / latency.target_time[1]
    assert cost > 0.05, (
        f"a one-layer head on a two-layer target must cost a fair part of a pass, got c = {cost}"
    )


class HiddenBlindDrafter(CountingDrafter):
    """The bug's state: the feature head is not given the target's hidden states."""

    needs_target_hidden = False


def test_a_feature_drafter_without_hidden_states_drafts_nothing_and_looks_free():
    # Negative control for the test above: the old bare state gives None at every call and c close to 0.
    from experiments.apriori.calibrate import measure_latency
    from tests.executor.test_drafters_feature import drafter_for

    model = build_tiny_model(seed=1, vocab_size=10, n_layers=2, max_seq_len=64)
    drafter = HiddenBlindDrafter(drafter_for(model))
    latency = measure_latency(model, drafter, [1, 2], temperature=1.0, context=16, repeats=3)
    assert drafter.returned == [None] * 5
    assert latency.draft_time / latency.target_time[1] < 0.05


class FakeClock:
    """``time.perf_counter`` that advances only when a timed piece of work says it ran."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class SlowDrafter(CountingDrafter):
    """A drafter whose every ``draft_logits`` call takes ``seconds`` on the fake clock."""

    def __init__(self, inner, clock: FakeClock, seconds: float) -> None:
        super().__init__(inner)
        self.clock, self.seconds = clock, seconds

    def draft_logits(self, state, tree, nodes):
        self.clock.now += self.seconds
        return super().draft_logits(state, tree, nodes)


@pytest.mark.parametrize("forward, probs, draft", [(0.25, 0.0, 0.125), (0.25, 1.0, 0.125)])
def test_latency_profile_times_what_the_run_clocks_time_so_overhead_is_not_counted_twice(
    monkeypatch, forward, probs, draft
):
    # The prediction charges t(n) + passes * t_draft + the configuration's overhead, where the run's clocks
    # (StepClock, RecordingDrafter) count the target's forward and the draft call, and everything else (the
    # probabilities, the mask, verification) is overhead. With a fake clock on which a forward takes `forward`,
    # a probability computation `probs` and a draft call `draft`, the profile must be exactly (forward, draft)
    # whatever `probs` costs; the previous profile gave forward + probs and draft + probs / 2.
    import importlib

    from executor.decoders import base
    from experiments.apriori.calibrate import measure_latency

    module = importlib.import_module("experiments.apriori.calibrate")
    from tests.executor.test_drafters_feature import drafter_for

    clock = FakeClock()
    monkeypatch.setattr(module, "time", clock)
    model = build_tiny_model(seed=1, vocab_size=10, n_layers=2, max_seq_len=64)
    own_forward = model.forward

    def slow_forward(*args, **kwargs):
        clock.now += forward
        return own_forward(*args, **kwargs)

    model.forward = slow_forward
    own_probs = base.Sampling.probs

    def slow_probs(self, logits):
        clock.now += probs
        return own_probs(self, logits)

    monkeypatch.setattr(base.Sampling, "probs", slow_probs)
    drafter = SlowDrafter(drafter_for(model), clock, draft)
    latency = measure_latency(model, drafter, [1, 2, 3], temperature=1.0, context=16, repeats=3)
    assert latency.target_time == {1: forward, 2: forward, 3: forward}
    assert latency.draft_time == draft
    assert model.forward is slow_forward  # the profile's clock is gone, the model's forward is back


def test_latency_ratios_survive_a_drift_of_the_machines_speed(monkeypatch):
    # The machine slows by 1% of its first speed with every forward pass (2.6x over the profile). A size timed
    # right after a one-token pass sees nearly its speed; one median per size, each taken at its own place in
    # the round, gave t(12) / t(1) ~10% too high (the gap of 11 passes between them).
    import importlib

    from experiments.apriori.calibrate import measure_latency

    module = importlib.import_module("experiments.apriori.calibrate")
    from tests.executor.test_drafters_feature import drafter_for

    clock = FakeClock()
    monkeypatch.setattr(module, "time", clock)
    model = build_tiny_model(seed=1, vocab_size=16, n_layers=2, max_seq_len=64)
    own_forward = model.forward
    passes = [0]

    def drifting_forward(tokens, *args, **kwargs):
        passes[0] += 1
        clock.now += (1.0 + 0.1 * tokens.shape[-1]) * (1.0 + 0.01 * passes[0])
        return own_forward(tokens, *args, **kwargs)

    model.forward = drifting_forward
    sizes = list(range(1, 13))
    latency = measure_latency(
        model, SlowDrafter(drafter_for(model), clock, 0.5), sizes, temperature=1.0, context=16, repeats=5
    )
    for n in sizes:
        true_ratio = (1.0 + 0.1 * n) / 1.1
        assert latency.target_time[n] / latency.target_time[1] == pytest.approx(true_ratio, rel=0.01), n


def test_shallow_profile_averages_the_root_events_only():
    records = [
        {
            "depth": 0,
            "chain": 0.2,
            "ranks": [0.2, 0.1, 0.0],
            "grid": {"rrs-n2": 0.3},
            "bound": {"rrs-n2": 0.4},
        },
        {
            "depth": 0,
            "chain": 0.6,
            "ranks": [0.6, 0.3, 0.1],
            "grid": {"rrs-n2": 0.7},
            "bound": {"rrs-n2": 0.8},
        },
        {"depth": 1, "chain": 1.0, "ranks": [1.0, 0.0], "grid": {}, "bound": {}},
    ]
    shallow = shallow_profile(records, temperature=1.0)  # sampled trees: two children per node
    assert shallow["positional"] == pytest.approx(0.4) and shallow["events"] == 2
    assert shallow["rank_matrix"] == pytest.approx([0.4, 0.2])
    assert shallow["multidraft"] == pytest.approx({"rrs-n2": 0.5})
    assert shallow["bound"] == pytest.approx({"rrs-n2": 0.6})
    with pytest.raises(ValueError, match="no verification event at the root"):
        shallow_profile(records[2:], temperature=1.0)


def test_drafting_charges_each_pass_of_a_step():
    flat = LatencyProfile({1: 1.0}, 0.25)
    assert flat.drafting(0) == 0.0 and flat.drafting(3) == 0.75
    measured = LatencyProfile({1: 1.0}, 0.25, pass_times=[0.3, 0.2, 0.1])
    assert measured.drafting(1) == pytest.approx(0.3) and measured.drafting(3) == pytest.approx(0.6)
    assert measured.drafting(5) == pytest.approx(
        0.8
    )  # the last measured pass repeats beyond the chains' depth
    assert LatencyProfile.from_json(json.loads(json.dumps(measured.to_json()))) == measured
    with pytest.raises(ValueError, match="pass_times"):
        LatencyProfile({1: 1.0}, 0.25, pass_times=[0.1, -0.2])


def test_pass_times_are_medians_per_level_on_the_profiles_scale():
    """Each call is scaled by its path's profile time of the target's passes over their measured time: a path
    measured in a spell twice as slow as the profile counts its calls at half their seconds."""
    latency = LatencyProfile({1: 1.0, 3: 2.0}, 0.5)
    slow = {
        "step_sizes": [3, 3],
        "target_seconds": 8.0,
        "draft_calls": [[0, 0.8], [1, 0.4], [0, 1.2], [1, 0.4]],
    }
    even = {"step_sizes": [1, 3], "target_seconds": 3.0, "draft_calls": [[0, 0.5], [1, 0.3], [2, 0.2]]}
    timed = latency.with_pass_times([slow, even])
    # slow scales by 4 / 8: roots 0.4, 0.6, level 1: 0.2, 0.2; even by 3 / 3
    assert timed.pass_times == pytest.approx([0.5, 0.2, 0.2])
    assert timed.target_time == latency.target_time and timed.draft_time == 0.5
    assert "calibration chains" in timed.source
    unlogged = {"step_sizes": [3], "target_seconds": 2.0, "steps": 1}  # units from before the field
    assert latency.with_pass_times([unlogged]) is latency and latency.with_pass_times([]) is latency
