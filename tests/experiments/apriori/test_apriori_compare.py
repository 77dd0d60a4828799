"""experiments.apriori.compare: bootstrap intervals, within_ci and the diagnosis of a miss.

Exact checks: constant data gives zero-width intervals; the diagnosis parts add up to the gap. Statistical
check (fixed seed, threshold stated): the 95% interval of a ratio of sums covers the true ratio in 88-99% of
300 simulated evaluations; the negative control (a value 30% off) is covered in under 10%. Over four
heterogeneous prompts the expanded interval covers 93.8% (seed 5; threshold 90-99%) where the plain percentile
interval covers 78.9% (the negative control, threshold < 88%).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import norm

from experiments.apriori.compare import (
    bootstrap_ratio,
    bootstrap_speedup,
    chance_within,
    diagnose,
    expand,
    expansion,
    interval,
    position_intervals,
    ratio_samples,
    unbiased_spread,
    within_ci,
    within_floor,
)


def test_constant_data_has_a_zero_width_interval():
    rng = np.random.default_rng(0)
    assert bootstrap_ratio([6, 9, 3], [3, 4.5, 1.5], rng) == pytest.approx([2.0, 2.0])
    assert bootstrap_speedup([10, 20], [1, 2], [5, 10], [1, 2], rng) == pytest.approx([2.0, 2.0])
    measured, intervals = position_intervals([[2, 1], [4, 2]], [4, 8], rng)
    assert measured == pytest.approx([0.5, 0.25])
    assert np.allclose(intervals, [[0.5, 0.5], [0.25, 0.25]])


def test_interval_covers_the_true_ratio_at_its_level():
    rng = np.random.default_rng(1)
    covered = wrong = 0
    for _ in range(300):
        steps = rng.integers(20, 40, size=20).astype(float)
        tokens = steps + rng.binomial(steps.astype(int), 0.4)  # true tau = 1.4
        interval = bootstrap_ratio(tokens, steps, rng, resamples=500)
        covered += within_ci(1.4, interval)
        wrong += within_ci(1.4 * 1.3, interval)
    assert 0.88 <= covered / 300 <= 0.99
    assert wrong / 300 < 0.10


def test_prompts_that_agree_by_chance_still_get_the_steps_sampling_error():
    # 4 prompts, each 32 tokens in 22 steps (10 steps of 2 tokens): every prompt resample gives 32/22.
    prompts = [[2] * 10 + [1] * 12] * 4
    tokens = np.array([sum(p) for p in prompts], dtype=float)
    steps = np.array([len(p) for p in prompts], dtype=float)
    rng = np.random.default_rng(0)
    estimate = 32 / 22
    bootstrap = bootstrap_ratio(tokens, steps, rng)
    assert bootstrap == pytest.approx([estimate, estimate])
    floored = within_floor(bootstrap, estimate, prompts)
    # By hand: the pooled within-prompt variance (sum of squares over N - k steps), z = 1.96.
    squares = 4 * (10 * (2 - estimate) ** 2 + 12 * (1 - estimate) ** 2)
    half = 1.959963984540054 * np.sqrt(squares / (88 - 4) / 88)
    assert floored == pytest.approx([estimate - half, estimate + half])
    assert within_ci(1.556, floored) and not within_ci(1.556, bootstrap)
    # A bootstrap interval already wider than the steps' error is left as it is.
    assert within_floor([1.0, 2.0], estimate, prompts) == [1.0, 2.0]
    # Too few steps to estimate a spread (one per prompt): unchanged.
    assert within_floor([1.5, 1.5], 1.5, [[1], [2]]) == [1.5, 1.5]


def test_the_floor_keeps_coverage_and_still_rejects_a_wrong_tau():
    """Four prompts with the same true tau of 1.4 (the case the floor is for). The floor is conservative: the
    interval is the wider of two estimates of the same noise, so it covers at least as often as the expanded
    prompt bootstrap (measured: 0.95 plain, 0.98 floored at these seeds), and it still excludes a tau 25% off
    most of the time (negative control: the floor is not so wide that nothing can miss)."""
    rng = np.random.default_rng(3)
    plain = floored = wrong = 0
    trials = 300
    for _ in range(trials):
        prompts = [1 + rng.binomial(1, 0.4, size=20) for _ in range(4)]
        tokens = np.array([p.sum() for p in prompts], dtype=float)
        steps = np.full(4, 20.0)
        estimate = tokens.sum() / steps.sum()
        samples = expand(ratio_samples(tokens, steps, rng, resamples=400), estimate, 4)
        bootstrap = [float(np.percentile(samples, 2.5)), float(np.percentile(samples, 97.5))]
        interval_ = within_floor(bootstrap, estimate, prompts)
        plain += within_ci(1.4, bootstrap)
        floored += within_ci(1.4, interval_)
        wrong += within_ci(1.4 * 1.25, interval_)
    assert floored >= plain
    assert 0.93 <= floored / trials <= 1.0
    assert wrong / trials < 0.05


def test_within_ci_is_closed_and_refuses_undefined_intervals():
    assert within_ci(1.0, [1.0, 2.0]) and within_ci(2.0, [1.0, 2.0]) and not within_ci(2.01, [1.0, 2.0])
    assert not within_ci(1.0, [float("nan"), float("nan")])


def test_diagnosis_parts_add_up_to_the_gap_and_name_the_largest():
    d = diagnose(
        predicted_tau=2.0,
        profiled_tau=1.5,
        replay_tau=1.45,
        measured_tau=1.4,
        predicted_step_ratio=2.0,
        measured_step_ratio=2.2,
    )
    assert sum(d["parts"].values()) == pytest.approx(d["tau_gap"]) == pytest.approx(0.6)
    assert d["broke"] == "positional acceptance" and d["latency_drift"] == pytest.approx(0.1)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda rng: bootstrap_ratio([], [], rng), "numerators"),
        (lambda rng: bootstrap_ratio([1, 2], [1], rng), "numerators and denominators"),
        (lambda rng: bootstrap_ratio([1, -2], [1, 1], rng), "numerators"),
        (lambda rng: bootstrap_speedup([1], [1], [1, 2], [1, 2], rng), "tokens"),
        (lambda rng: bootstrap_ratio([1], [1], "seed"), "rng"),
        (lambda rng: position_intervals([1, 2], [1, 2], rng), "reached"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call(np.random.default_rng(0))


def test_expansion_is_the_t_correction_of_the_plug_in_spread():
    """sqrt(n / (n - 1)) t_{n-1} / z: exact values from the t table, 1 in the limit, undefined below 2 units."""
    assert expansion(4) == pytest.approx(np.sqrt(4 / 3) * 3.182446 / 1.959964, rel=1e-6)
    assert expansion(8) == pytest.approx(np.sqrt(8 / 7) * 2.364624 / 1.959964, rel=1e-6)
    assert expansion(10_000) == pytest.approx(1.0, abs=1e-3)
    assert expansion(1) == float("inf")
    assert np.isnan(expand([1.0, 2.0], 1.5, 1)).all()
    assert expand([1.0, 2.0], 1.5, 4) == pytest.approx(1.5 + expansion(4) * np.array([-0.5, 0.5]))


def test_expanded_interval_covers_at_its_level_over_four_heterogeneous_prompts():
    """Four prompts whose acceptance differs (Beta(8, 12) per prompt, mean 0.4): the expanded 95% interval of
    the ratio covers the true tau = 1.4 in 90-99% of 1000 simulated runs; the plain percentile interval of
    the same bootstrap samples (the negative control) in under 88%, and a value 30% off is covered in under
    10%."""
    rng = np.random.default_rng(5)
    expanded = plain = wrong = 0
    runs = 1000
    for _ in range(runs):
        steps = rng.integers(20, 40, size=4).astype(float)
        tokens = steps + rng.binomial(steps.astype(int), rng.beta(8, 12, size=4))
        samples = ratio_samples(tokens, steps, rng, resamples=400)
        estimate = tokens.sum() / steps.sum()
        expanded_ci = interval(expand(samples, estimate, 4))
        expanded += within_ci(1.4, expanded_ci)
        plain += within_ci(1.4, interval(samples))
        wrong += within_ci(1.4 * 1.3, expanded_ci)
    assert 0.90 <= expanded / runs <= 0.99
    assert plain / runs < 0.88
    assert wrong / runs < 0.10


def test_chance_within_counts_the_centred_ratios_inside_the_tolerance():
    """Exact on five samples: the prediction is a point, the measurement's samples are 0.85, 0.95, 1, 1.05 and
    1.2 times its estimate; the ratios 1/0.95, 1 and 1/1.05 are within 10%, 1/0.85 and 1/1.2 are not."""
    measured = 2.0 * np.array([0.85, 0.95, 1.0, 1.05, 1.2])
    assert chance_within(measured, 2.0, [1.3], 1.3, 0.10) == pytest.approx(0.6)
    assert chance_within([2.0], 2.0, [1.3], 1.3, 0.0) == 1.0  # no spread: an exact prediction always lands
    assert np.isnan(chance_within([np.nan, np.nan], 2.0, [1.3], 1.3, 0.1))  # a half of one prompt: undefined


@given(
    st.lists(st.floats(0.5, 2.0), min_size=1, max_size=40),
    st.lists(st.floats(0.5, 2.0), min_size=1, max_size=40),
    st.integers(-8, 8),
)
def test_chance_within_depends_on_the_spread_not_on_the_prediction_error(measured, predicted, power):
    """Scaling the prediction (samples and estimate) by 2**k, an error of any size, leaves the chance as it
    was (negative control: the raw ratio predicted*/measured* without centring would change with k)."""
    scale = 2.0**power
    base = chance_within(measured, float(np.median(measured)), predicted, float(np.median(predicted)), 0.1)
    scaled = chance_within(
        measured,
        float(np.median(measured)),
        scale * np.array(predicted),
        scale * float(np.median(predicted)),
        0.1,
    )
    assert scaled == base


def test_chance_within_matches_the_lognormal_law():
    """measured* = m exp(s Z), prediction a point: chance = P(-ln 1.1 <= s Z <= -ln 0.9), to 0.005 over
    200,000 samples (seed 3)."""
    rng = np.random.default_rng(3)
    spread = 0.08
    measured = 1.4 * np.exp(spread * rng.standard_normal(200_000))
    expected = norm.cdf(-np.log(0.9) / spread) - norm.cdf(-np.log(1.1) / spread)
    assert chance_within(measured, 1.4, [1.1], 1.1, 0.1) == pytest.approx(expected, abs=0.005)


@pytest.mark.parametrize(
    "arguments, name",
    [
        (([[1.0]], 1.0, [1.0], 1.0, 0.1), "measured and predicted"),
        (([1.0], 0.0, [1.0], 1.0, 0.1), "measured_estimate"),
        (([1.0], 1.0, [1.0], float("nan"), 0.1), "predicted_estimate"),
        (([1.0], 1.0, [1.0], 1.0, -0.1), "tolerance"),
    ],
)
def test_chance_within_refuses_bad_input_by_name(arguments, name):
    with pytest.raises(ValueError, match=name):
        chance_within(*arguments)


def test_unbiased_spread_scales_deviations_by_the_variance_correction_alone():
    """sqrt(n / (n - 1)) about the estimate (2/sqrt(3) over 4 units, no Student factor); nan below 2 units."""
    samples = np.array([0.8, 1.0, 1.3])
    np.testing.assert_allclose(unbiased_spread(samples, 1.0, 4), 1.0 + np.sqrt(4 / 3) * (samples - 1.0))
    assert np.isnan(unbiased_spread(samples, 1.0, 1)).all()
    assert np.sqrt(4 / 3) < expansion(4)  # narrower than the interval's expansion
