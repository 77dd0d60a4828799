"""EasySpec's layer-parallel drafting speed model: hand values, invariants and the break-even drop."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from theory import break_even_alpha_drop, expected_tokens, layer_parallel_draft_time, layer_parallel_speedup

times = st.floats(0.0, 5.0)
fractions = st.floats(0.0, 1.0)


def test_hand_values():
    # 32 layers, groups of 4 on 4 devices, attention share 0.25, sync 0.1: each group costs
    # 0.25 + 0.75 * 4 + 0.1 = 3.35 layer times, 8 groups -> 26.8.
    assert layer_parallel_draft_time(1.0, 32, 4, sync_time=0.1, parallel_fraction=0.25) == pytest.approx(26.8)
    # fully parallel layers, free sync: 8 groups of one layer time each, plus 4 + 4 exact layers and the head
    assert layer_parallel_draft_time(1.0, 40, 4, sequential_layers=8, head_time=2.0) == pytest.approx(18.0)
    # one device is sequential drafting
    assert layer_parallel_draft_time(0.5, 30, 1, sync_time=9.0, head_time=1.0) == pytest.approx(16.0)


def test_speedup_hand_value():
    # alpha 0.8, drop 0.05, gamma 3, 8 layers of time 1 on 2 devices (free sync, fully parallel), target 100:
    # T_seq = 8, T_par = 4; sequential 3 * 8 + 100 = 124, parallel 8 + 2 * 4 + 100 = 116.
    result = layer_parallel_speedup(0.8, 0.05, 3, 8, 2, layer_time=1.0, target_time=100.0)
    tokens = 1 + 0.8 + 0.8 * 0.75 + 0.8 * 0.75**2
    assert result.tokens_per_step == pytest.approx(tokens)
    assert result.speedup == pytest.approx(tokens * 100 / 116)
    assert result.sequential_speedup == pytest.approx(expected_tokens(0.8, 3) * 100 / 124)
    assert result.pays_off == (tokens / 116 > expected_tokens(0.8, 3) / 124)


@given(
    times,
    st.integers(1, 64),
    st.integers(1, 16),
    times,
    st.integers(1, 16),
    fractions,
    st.integers(0, 64),
    times,
)
def test_more_devices_never_slow_drafting_down(
    layer_time, layers, devices, sync, group, fraction, exact, head
):
    assume(exact <= layers)
    kwargs = dict(sync_time=sync, parallel_group=group, parallel_fraction=fraction, sequential_layers=exact)
    fewer = layer_parallel_draft_time(layer_time, layers, devices, head_time=head, **kwargs)
    more = layer_parallel_draft_time(layer_time, layers, devices + 1, head_time=head, **kwargs)
    assert more <= fewer + 1e-12
    assert fewer <= layers * layer_time + head + 1e-9  # never worse than sequential drafting


@given(st.floats(0.0, 1.0), st.integers(0, 12), st.integers(1, 48), st.integers(1, 8), fractions, times)
def test_lossless_free_fuzzy_drafting_is_at_least_as_fast_as_sequential(alpha, gamma, layers, devices, f, t):
    result = layer_parallel_speedup(
        alpha, 0.0, gamma, layers, devices, layer_time=t, target_time=10.0, parallel_fraction=f
    )
    assert result.speedup >= result.sequential_speedup * (1 - 1e-12)
    assert result.tokens_per_step == pytest.approx(result.sequential_tokens_per_step)


@given(st.floats(0.05, 1.0), fractions, st.integers(0, 10))
def test_speedup_decreases_with_the_acceptance_drop(alpha, share, gamma):
    drops = [alpha * share * x for x in (0.0, 0.5, 1.0)]
    values = [
        layer_parallel_speedup(alpha, d, gamma, 16, 4, layer_time=1.0, target_time=50.0).speedup
        for d in drops
    ]
    assert values[0] >= values[1] >= values[2]


@given(st.floats(0.3, 0.99), st.integers(2, 10), st.integers(2, 8), st.floats(0.0, 2.0), st.floats(0.0, 0.5))
def test_break_even_drop_separates_paying_and_losing_drops(alpha, gamma, devices, sync, overhead):
    costs = dict(layer_time=1.0, target_time=60.0, sync_time=sync, calibration_overhead=overhead)
    drop = break_even_alpha_drop(alpha, gamma, 24, devices, **costs)
    assert 0.0 <= drop <= alpha
    if 0.0 < drop < alpha:
        at = layer_parallel_speedup(alpha, drop, gamma, 24, devices, **costs)
        assert at.speedup == pytest.approx(at.sequential_speedup, rel=1e-9)
        assert layer_parallel_speedup(alpha, drop * 0.99, gamma, 24, devices, **costs).pays_off
        assert not layer_parallel_speedup(
            alpha, min(alpha, drop * 1.01 + 1e-9), gamma, 24, devices, **costs
        ).pays_off


def test_costly_synchronisation_means_it_never_pays():
    costs = dict(layer_time=1.0, target_time=60.0, sync_time=100.0)
    assert break_even_alpha_drop(0.8, 5, 24, 4, **costs) == 0.0


@given(fractions, st.floats(0.0, 1.0), st.integers(0, 8), st.integers(1, 8))
def test_a_constant_per_position_acceptance_gives_the_scalar_model_bitwise(alpha, share, gamma, devices):
    drop = alpha * share
    costs = {"layer_time": 1.0, "target_time": 40.0, "sync_time": 0.1, "calibration_overhead": 0.2}
    scalar = layer_parallel_speedup(alpha, drop, gamma, 12, devices, **costs)
    vector = layer_parallel_speedup([alpha] * (gamma + 2), [drop] * (gamma + 2), gamma, 12, devices, **costs)
    assert vector == scalar


def test_per_position_acceptance_hand_value():
    # Exact drafter 0.8, 0.5, 0.4 by depth; fuzzy drops 0.1, 0.1 at positions 2 and 3 (position 1's unused).
    result = layer_parallel_speedup(
        [0.8, 0.5, 0.4], [0.3, 0.1, 0.1], 3, 8, 2, layer_time=1.0, target_time=100.0
    )
    assert result.tokens_per_step == pytest.approx(1 + 0.8 + 0.8 * 0.4 + 0.8 * 0.4 * 0.3)
    assert result.sequential_tokens_per_step == pytest.approx(1 + 0.8 + 0.8 * 0.5 + 0.8 * 0.5 * 0.4)
    assert result.speedup == pytest.approx(result.tokens_per_step * 100 / 116)


@given(st.lists(st.floats(0.05, 1.0), min_size=3, max_size=3), st.integers(1, 8), st.floats(0, 2.0))
def test_break_even_drop_with_per_position_acceptance_separates_paying_and_losing_drops(
    alphas, devices, sync
):
    costs = {"layer_time": 1.0, "target_time": 30.0, "sync_time": sync}
    drop = break_even_alpha_drop(alphas, 3, 24, devices, **costs)
    assert 0.0 <= drop <= min(alphas[1:])
    if 0.0 < drop < min(alphas[1:]):
        assert layer_parallel_speedup(alphas, drop * 0.99, 3, 24, devices, **costs).pays_off
        assert not layer_parallel_speedup(
            alphas, min(drop * 1.01 + 1e-9, min(alphas[1:])), 3, 24, devices, **costs
        ).pays_off


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: layer_parallel_draft_time(-1.0, 8, 2), "layer_time"),
        (lambda: layer_parallel_draft_time(1.0, 0, 2), "n_layers"),
        (lambda: layer_parallel_draft_time(1.0, 8, 0), "n_devices"),
        (lambda: layer_parallel_draft_time(1.0, 8, 2, sync_time=-0.1), "sync_time"),
        (lambda: layer_parallel_draft_time(1.0, 8, 2, parallel_fraction=1.5), "parallel_fraction"),
        (lambda: layer_parallel_draft_time(1.0, 8, 2, sequential_layers=9), "sequential_layers"),
        (lambda: layer_parallel_draft_time(1.0, 8, 2, parallel_group=0), "parallel_group"),
        (lambda: layer_parallel_speedup(1.2, 0.0, 3, 8, 2, layer_time=1, target_time=10), "alpha"),
        (lambda: layer_parallel_speedup(0.5, 0.6, 3, 8, 2, layer_time=1, target_time=10), "alpha_drop"),
        (lambda: layer_parallel_speedup(0.5, 0.1, -1, 8, 2, layer_time=1, target_time=10), "gamma"),
        (lambda: layer_parallel_speedup([0.5, 0.4], 0.1, 3, 8, 2, layer_time=1, target_time=10), "alpha"),
        (
            lambda: layer_parallel_speedup([0.5, 0.4, 0.1], 0.2, 3, 8, 2, layer_time=1, target_time=10),
            "alpha_drop .* position 3",
        ),
        (
            lambda: layer_parallel_speedup(0.5, [0.1, 0.1], 3, 8, 2, layer_time=1, target_time=10),
            "alpha_drop",
        ),
        (lambda: layer_parallel_speedup(0.5, 0.1, 3, 8, 2, layer_time=1, target_time=0), "target_time"),
        (
            lambda: layer_parallel_speedup(
                0.5, 0.1, 3, 8, 2, layer_time=1, target_time=1, calibration_overhead=-1
            ),
            "calibration_overhead",
        ),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()
