"""experiments.profiling: measurements on a tiny model (schema, round-robin order) and the profile readers."""

from __future__ import annotations

import pytest
import torch

from executor.drafters import EarlyExitDrafter, PromptLookupDrafter
from experiments.profiling import (
    PROFILE_FORMAT,
    PROFILE_VERSION,
    check_profile,
    context_ids,
    power_of_two_sizes,
    profile_costs,
    profile_target_times,
    summarise_times,
)
from tests.tiny_models import build_tiny_model

CONTEXT = [3, 5, 7, 1, 3, 5, 7, 2, 4, 6, 8, 3, 5, 7, 1, 9, 10, 11, 3, 5]


def synthetic_profile(sizes, times, drafter=None) -> dict:
    return {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "target": {"sizes": sizes, "times": times},
        "drafter": drafter,
    }


def test_profile_of_a_tiny_model_has_the_documented_schema():
    model = build_tiny_model(0, n_layers=2)
    sizes, widths = [1, 2, 4, 8, 16], [1, 2, 4]
    result = profile_costs(
        model, CONTEXT, drafter=EarlyExitDrafter(model, 1), sizes=sizes, widths=widths, repeats=3, warmup=1
    )
    target = result["target"]
    assert result["context_tokens"] == len(CONTEXT) and result["repeats"] == 3
    assert target["sizes"] == sizes and len(target["times"]) == len(sizes)
    assert target["relative"][0] == 1.0
    for row, median in zip(target["stats"], target["times"], strict=True):
        assert row["repeats"] == 3 and row["median"] == median > 0
        assert row["min"] <= row["q1"] <= row["median"] <= row["q3"] <= row["max"]
        assert row["iqr"] == pytest.approx(row["q3"] - row["q1"])
    drafter = result["drafter"]
    assert drafter["name"] == "early-exit:1" and drafter["per_level"]["widths"] == widths
    assert drafter["draft_time"] == drafter["per_token"]["median"] > 0
    assert drafter["level_time"] == drafter["per_level"]["times"][-1] > 0
    assert drafter["cost_ratio"] == pytest.approx(drafter["draft_time"] / target["times"][0])
    # The profile is itself a valid latency file for the planners.
    assert sorted(
        profile_target_times({"format": PROFILE_FORMAT, "version": PROFILE_VERSION, **result})
    ) == list(range(1, 17))


def test_repeats_are_round_robin_over_sizes_and_at_the_next_slots(monkeypatch):
    model = build_tiny_model(1)
    calls = []
    forward = model.forward

    def recording(tokens, cache_positions, **kwargs):
        calls.append((tokens.shape[1], int(cache_positions[0])))
        return forward(tokens, cache_positions, **kwargs)

    monkeypatch.setattr(model, "forward", recording)
    profile_costs(model, CONTEXT, sizes=[1, 2, 4], repeats=3, warmup=2)
    committed = len(CONTEXT) - 1
    assert calls[0] == (committed, 0)  # the prefill
    # Every round measures each size once, in turn, always from the committed length (rollback is free).
    assert calls[1:] == [(n, committed) for _ in range(5) for n in (1, 2, 4)]


def test_the_profile_leaves_the_committed_context_intact():
    model = build_tiny_model(2)
    profile_costs(model, CONTEXT, drafter=EarlyExitDrafter(model, 1), sizes=[1, 2, 4, 8], repeats=2, warmup=0)
    after = model(torch.tensor([[CONTEXT[-1]]]), torch.tensor([len(CONTEXT) - 1]))
    fresh = build_tiny_model(2)
    fresh(torch.tensor([CONTEXT[:-1]]), torch.arange(len(CONTEXT) - 1))
    expected = fresh(torch.tensor([[CONTEXT[-1]]]), torch.tensor([len(CONTEXT) - 1]))
    torch.testing.assert_close(after, expected)


def test_prompt_lookup_drafter_is_profiled_too():
    model = build_tiny_model(3)
    result = profile_costs(
        model, CONTEXT, drafter=PromptLookupDrafter(), sizes=[1, 2], widths=[1, 2], repeats=2
    )
    assert result["drafter"]["name"] == "ngram" and result["drafter"]["draft_time"] > 0


def test_summary_is_the_median_and_linear_quartiles():
    stats = summarise_times([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (stats["median"], stats["q1"], stats["q3"], stats["iqr"]) == (3.0, 2.0, 4.0, 2.0)
    assert (stats["min"], stats["max"], stats["repeats"]) == (1.0, 5.0, 5)
    with pytest.raises(ValueError, match="times is empty"):
        summarise_times([])


def test_power_of_two_sizes():
    assert power_of_two_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert power_of_two_sizes(1) == [1]
    for bad in (0, 3, 48, -2, True, 2.0):
        with pytest.raises(ValueError, match="--max-size must be a power of two"):
            power_of_two_sizes(bad, "--max-size")


def test_context_is_the_prompts_concatenated_and_cut():
    class Letters:
        def encode(self, text):
            return [ord(c) for c in text]

    assert context_ids(Letters(), 5, texts=["ab", "cde", "fgh"]) == [97, 98, 99, 100, 101]
    with pytest.raises(ValueError, match="only 5 tokens, fewer than 9"):
        context_ids(Letters(), 9, texts=["ab", "cde"])
    with pytest.raises(ValueError, match="context must be an integer >= 2"):
        context_ids(Letters(), 1, texts=["ab"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sizes": [2, 4]}, "sizes must contain 1"),
        ({"widths": [0, 1]}, "widths must be integers >= 1"),
        ({"repeats": 0}, "repeats must be an integer >= 1"),
        ({"warmup": -1}, "warmup must be an integer >= 0"),
        ({"sizes": [1, 64]}, "the model's context is 64"),
    ],
)
def test_bad_arguments_are_rejected(options, message):
    with pytest.raises(ValueError, match=message):
        profile_costs(build_tiny_model(0), CONTEXT, **options)


def test_a_width_beyond_the_vocabulary_is_rejected():
    model = build_tiny_model(0, vocab_size=12)
    with pytest.raises(ValueError, match="widths must be at most the vocabulary"):
        profile_costs(model, CONTEXT[:4], drafter=EarlyExitDrafter(model, 1), widths=[1, 16], sizes=[1])


def test_target_times_are_interpolated_between_measured_sizes_only():
    table = profile_target_times(synthetic_profile([1, 2, 4, 8], [1.0, 2.0, 6.0, 6.0]))
    assert table == {1: 1.0, 2: 2.0, 3: 4.0, 4: 6.0, 5: 6.0, 6: 6.0, 7: 6.0, 8: 6.0}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"target": {"sizes": [1], "times": [1.0]}}, "not a specbound profile"),
        ({**synthetic_profile([1], [1.0]), "version": 99}, "version 99 is not supported"),
        (synthetic_profile([2, 4], [1.0, 2.0]), "starting at 1"),
        (synthetic_profile([1, 4, 2], [1.0, 2.0, 3.0]), "strictly increasing"),
        (synthetic_profile([1, 2], [1.0]), "same length"),
        (synthetic_profile([1, 2], [1.0, -2.0]), "positive finite seconds"),
        (synthetic_profile([1, 2], [1.0, 2.0], {"draft_time": 0.1}), "drafter times"),
    ],
)
def test_malformed_profiles_are_rejected_naming_the_option(data, message):
    with pytest.raises(ValueError, match=message) as error:
        check_profile(data, "--latency")
    assert str(error.value).startswith("--latency")


def test_a_feature_head_is_profiled_from_the_targets_hidden_states_one_entry_per_root_call():
    from tests.executor.test_drafters_feature import drafter_for

    model = build_tiny_model(4)
    drafter = drafter_for(model)
    fed = []
    run = drafter._run

    def recording(features, tokens, slots, positions, mask):
        fed.append(len(tokens))
        return run(features, tokens, slots, positions, mask)

    drafter._run = recording
    result = profile_costs(model, CONTEXT, drafter=drafter, sizes=[1, 2], widths=[1, 2], repeats=2, warmup=0)
    assert result["drafter"]["draft_time"] > 0 and result["drafter"]["per_level"]["widths"] == [1, 2]
    # The first call feeds the whole committed prefix; every later root call the one rolled-back entry, and a
    # level of width w feeds w nodes: per round root, (root, 1), (root, 2).
    assert fed[0] == len(CONTEXT) - 1
    assert fed[1:] == [1, 1, 1, 1, 2] * 2
