"""The prompt-lookup prediction: the acceptance model of observed steps and the speedup on synthetic profiles,
checked against hand computations (exact fractions) and the renewal ratio summed step by step."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from experiments.peer_predict import LookupModel, held_out_prediction, lookup_model, predict_speedup

# Six steps: two found no match, four drafted 2 tokens and accepted 0, 1, 2, 2.
STEPS = [(0, 0), (0, 0), (2, 0), (2, 1), (2, 2), (2, 2)]
LINEAR = {n: 1 + 0.25 * (n - 1) for n in range(1, 12)}  # t(n) = 1 + (n - 1) / 4


def test_lookup_model_counts_lengths_and_conditional_acceptance_by_hand():
    model = lookup_model(STEPS, 2)
    assert model.drafted.tolist() == pytest.approx([2 / 6, 0, 4 / 6])
    # alpha_1 = accepted >= 1 (3) / drafted >= 1 (4); alpha_2 = accepted 2 (2) / drafted 2 with 1 accepted (3)
    assert model.alpha.tolist() == pytest.approx([3 / 4, 2 / 3])
    # 2/6 * 1 + 4/6 * (1 + 3/4 + 3/4 * 2/3) = 11/6, the observed mean of accepted + 1
    assert model.expected_tokens() == pytest.approx(11 / 6, abs=1e-12)


def test_prediction_on_a_synthetic_linear_profile_is_exact():
    model = lookup_model(STEPS, 2)
    t = {n: Fraction(4 + n - 1, 4) for n in range(1, 4)}
    tokens = Fraction(11, 6)
    step = Fraction(2, 6) * t[1] + Fraction(4, 6) * t[3]  # 4/3
    assert predict_speedup(LINEAR, model)["speedup"] == pytest.approx(float(t[1] * tokens / step), abs=1e-12)
    d, s = Fraction(1, 10), Fraction(1, 20)
    per_token = (step + d) / tokens + s
    result = predict_speedup(LINEAR, model, lookup_time=0.1, token_time=0.05)
    assert result["seconds_per_token"] == pytest.approx(float(per_token), abs=1e-12)
    assert result["speedup"] == pytest.approx(float((t[1] + s) / per_token), abs=1e-12)  # 1.2623
    assert result["speedup"] == pytest.approx(1.2622950819672, abs=1e-9)


@given(
    k=st.integers(1, 6),
    accepted=st.lists(st.integers(0, 6), min_size=1, max_size=40),
    slope=st.floats(0.0, 2.0),
)
def test_single_length_prediction_equals_the_renewal_ratio_of_the_steps(k, accepted, slope):
    # Every step drafts k: the positional model telescopes to the observed mean, so the predicted time per
    # token is exactly the steps' total time over their total tokens.
    steps = [(k, min(a, k)) for a in accepted]
    times = {n: 1.0 + slope * (n - 1) for n in range(1, k + 2)}
    predicted = predict_speedup(times, lookup_model(steps, k))
    observed = len(steps) * times[k + 1] / sum(a + 1 for _, a in steps)
    assert predicted["seconds_per_token"] == pytest.approx(observed, rel=1e-12)


def test_no_acceptance_and_expensive_passes_predict_a_slowdown():
    # Negative control: drafts that are never accepted only add verification cost.
    model = lookup_model([(3, 0)] * 5, 3)
    assert predict_speedup(LINEAR, model)["speedup"] == pytest.approx(1 / LINEAR[4])
    assert predict_speedup(LINEAR, model)["speedup"] < 1
    # and free passes with full acceptance give K + 1 tokens per pass
    flat = dict.fromkeys(range(1, 5), 1.0)
    assert predict_speedup(flat, lookup_model([(3, 3)] * 5, 3))["speedup"] == pytest.approx(4.0)


def test_held_out_predicts_each_prompt_from_the_others_only():
    a = [(2, 2)] * 4  # prompt 0: everything accepted
    b = [(2, 0)] * 4  # prompt 1: nothing accepted
    result = held_out_prediction(LINEAR, [a, b], [10, 30], 2)
    # prompt 0 is predicted from b (1 token per t(3) = 1.5 s), prompt 1 from a (3 tokens per 1.5 s)
    assert result["per_prompt"] == pytest.approx([1 / 1.5, 3 / 1.5])
    assert result["speedup"] == pytest.approx((10 + 30) * 1.0 / (10 * 1.5 + 30 * 0.5))
    same = held_out_prediction(LINEAR, [STEPS, STEPS, STEPS], [5, 5, 5], 2)
    assert same["speedup"] == pytest.approx(predict_speedup(LINEAR, lookup_model(STEPS, 2))["speedup"])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: lookup_model([(3, 1)], 2), "steps must hold"),
        (lambda: lookup_model([(1, 2)], 2), "steps must hold"),
        (lambda: lookup_model([], 2), "steps is empty"),
        (lambda: lookup_model(STEPS, 0), "max_length"),
        (lambda: predict_speedup({1: 1.0, 2: 1.0}, lookup_model(STEPS, 2)), r"missing \[3\]"),
        (lambda: predict_speedup({1: 1.0, 2: 0.0, 3: 1.0}, lookup_model(STEPS, 2)), "positive"),
        (lambda: predict_speedup(LINEAR, lookup_model(STEPS, 2), lookup_time=-1), "lookup_time"),
        (lambda: held_out_prediction(LINEAR, [STEPS], [5], 2), "2 prompts"),
        (lambda: LookupModel([0.5, 0.6], [0.5]), "drafted"),
        (lambda: LookupModel([0.5, 0.5], [1.5]), "alpha"),
    ],
)
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_model_round_trips_to_json():
    model = lookup_model(STEPS, 2)
    again = LookupModel(**model.to_json())
    assert np.array_equal(again.drafted, model.drafted) and np.array_equal(again.alpha, model.alpha)
