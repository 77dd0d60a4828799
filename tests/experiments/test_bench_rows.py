"""experiments.bench_rows on tiny random models (seconds): every row is built and runs the decoder it names,
greedy rows reproduce plain decoding, transformers rows get their options, bad options are named.
"""

import pytest
import torch

from executor.decoders import AutoregressiveDecoder, Sampling
from experiments import bench_rows
from experiments.bench import run_bench, summarise
from experiments.bench_rows import VERIFIERS, BenchConfig, build_runners
from tests.tiny_models import build_tiny_model

PROMPTS = [[3, 1, 4, 1, 5], [2, 7, 1, 8]]


def tiny(seed=3, dtype=torch.float32):
    return build_tiny_model(seed, vocab_size=24, n_layers=3, max_seq_len=96).to(dtype)


def test_every_row_is_built_and_greedy_rows_reproduce_plain_decoding():
    model = tiny()
    config = BenchConfig(dtypes=("float32",), temperatures=(0.0, 1.0), lookups=(3,), gamma=2)
    targets = {"float32": (model, {"early-exit": "early-exit:1"})}
    plans = [
        {"drafter": "early-exit", "dtype": "float32", "temperature": t, "parents": [-1, 0, 0, 1]}
        for t in (0.0, 1.0)
    ]
    runners = build_runners(config, targets, {}, plans)
    names = {(key.decoder, key.temperature) for key in runners}
    ours = [
        "ar",
        "chain-ngram-g3",
        "chain-early-exit",
        "chain-ngram+early-exit",
        "tree-early-exit",
        "plan-tree-early-exit",
    ]
    greedy = {f"multidraft-argmax-n{n}-early-exit" for n in (2, 4)}
    sampled = {f"multidraft-{v}-n{n}-early-exit" for v in ("rrs", "optimal") for n in (2, 4)}
    assert names == {(n, 0.0) for n in [*ours, *greedy]} | {(n, 1.0) for n in [*ours, *sampled]}
    rows = summarise(run_bench(runners, PROMPTS, 6))
    reference = [AutoregressiveDecoder(model).generate(p, 6).token_ids for p in PROMPTS]
    for row in rows:
        assert row["tokens"] == 12 and row["tau"] >= 1.0, row["decoder"]
        if row["temperature"] == 0:
            assert row["agrees_with_ar"] == 1.0, row["decoder"]
    # ar at temperature 0 is our plain greedy decoding, and sampled ar is not (the row's temperature is used).
    ar = next(key for key in runners if key.decoder == "ar" and key.temperature == 0)
    sampled_ar = next(key for key in runners if key.decoder == "ar" and key.temperature == 1)
    assert [runners[ar](p, 6, 0).token_ids for p in PROMPTS] == reference
    assert [runners[sampled_ar](p, 6, 0).token_ids for p in PROMPTS] != reference
    by_name = {(r["decoder"], r["temperature"]): r for r in rows}
    assert by_name[("ar", 0.0)]["tau"] == 1.0 and by_name[("ar", 0.0)]["vs_ar"] == 1.0
    assert len(by_name[("chain-early-exit", 0.0)]["acceptance_per_position"]) == 2  # gamma = 2


def test_every_multidraft_verifier_gets_its_rows_and_spechub_only_at_two_drafts():
    model = tiny()
    config = BenchConfig(
        dtypes=("float32",), temperatures=(1.0,), verifiers=VERIFIERS, ns=(2, 3), rows=("multidraft-*",)
    )
    runners = build_runners(config, {"float32": (model, {"early-exit": "early-exit:1"})}, {}, [])
    expected = {
        f"multidraft-{v}-n{n}-early-exit" for v in VERIFIERS for n in (2, 3) if v != "spechub" or n == 2
    }
    assert {key.decoder for key in runners} == expected
    for row in summarise(run_bench(runners, PROMPTS, 6)):
        assert row["tokens"] == 12 and row["tau"] >= 1.0, row["decoder"]


def test_rows_option_selects_rows_by_pattern():
    config = BenchConfig(dtypes=("float32",), temperatures=(0.0,), rows=("ar", "chain-*"))
    targets = {"float32": (tiny(), {"early-exit": "early-exit:1"})}
    assert {key.decoder for key in build_runners(config, targets, {}, [])} == {
        "ar",
        "chain-ngram-g2",
        "chain-early-exit",
        "chain-ngram+early-exit",
    }


class FakeHF:
    """Records ``generate``'s options; returns the prompt followed by ``max_new_tokens`` ones."""

    def __init__(self):
        self.calls = []

    def generate(self, ids, **options):
        self.calls.append(options)
        return torch.cat([ids, torch.ones(1, options["max_new_tokens"], dtype=ids.dtype)], dim=1)


class FakeTokenizer:
    eos_token_id = 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_transformers_rows_pass_their_options_and_sample_the_plain_softmax(temperature):
    hf = FakeHF()
    config = BenchConfig(dtypes=("float32",), temperatures=(temperature,), lookups=(5,), exit_layer=2)
    runners = build_runners(config, {"float32": (tiny(), {})}, {"float32": (hf, FakeTokenizer())}, [])
    for key, runner in runners.items():
        if key.decoder.startswith("hf-"):
            record = runner([1, 2, 3], 4, 0)
            assert record.tokens == 4 and record.token_ids == [1] * 4 and record.steps is None
    generate, lookup, early = hf.calls
    assert lookup["prompt_lookup_num_tokens"] == 5 and early["assistant_early_exit"] == 2
    for options in hf.calls:
        assert options["min_new_tokens"] == options["max_new_tokens"] == 4
        if temperature == 0:
            assert options["do_sample"] is False
        else:  # no top-k (transformers' default is 50) and no top-p: the law our decoders sample
            assert options["do_sample"] and options["temperature"] == 1.0
            assert options["top_k"] == 0 and options["top_p"] == 1.0


def test_default_drafters_are_early_exit_and_the_cached_feature_head(monkeypatch):
    import executor.drafters.parse as parse

    model = tiny()
    monkeypatch.setattr(parse, "feature_checkpoint", lambda target, train_if_missing: None)
    assert bench_rows.model_drafters(BenchConfig(exit_layer=2), model) == {"early-exit": "early-exit:2"}
    monkeypatch.setattr(parse, "feature_checkpoint", lambda target, train_if_missing: "/cache/head")
    assert bench_rows.model_drafters(BenchConfig(exit_layer=2), model) == {
        "early-exit": "early-exit:2",
        "feature": "feature:/cache/head",
    }
    two = BenchConfig(drafters=("early-exit:1", "early-exit:2"))
    assert bench_rows.model_drafters(two, model) == {
        "early-exit-1": "early-exit:1",
        "early-exit-2": "early-exit:2",
    }


def test_two_cached_heads_are_labelled_by_their_keys_and_clashing_keys_by_their_whole_specs():
    model = tiny()
    heads = BenchConfig(
        drafters=(
            "feature:/c/drafters/feature-6e90-c6f1757fcd",
            "feature:/c/drafters/feature-6e90-11eddd8be6/",
        )
    )
    assert list(bench_rows.model_drafters(heads, model)) == ["feature-c6f1757fcd", "feature-11eddd8be6"]
    clash = BenchConfig(drafters=("feature:/a/head-x", "feature:/b/head-x", "early-exit:3"))
    assert bench_rows.model_drafters(clash, model) == {
        "feature_a_head-x": "feature:/a/head-x",
        "feature_b_head-x": "feature:/b/head-x",
        "early-exit": "early-exit:3",
    }


@pytest.mark.parametrize(
    "options, name",
    [
        ({"dtypes": ("float16",)}, "--dtypes"),
        ({"temperatures": (-1.0,)}, "--temperatures"),
        ({"ns": (1,)}, "--ns"),
        ({"verifiers": ("magic",)}, "--verifiers"),
        ({"verifiers": ("spechub",), "ns": (4,)}, "--verifiers spechub needs 2 in --ns"),
        ({"plan_budget": 0}, "--plan-budget"),
        ({"lookups": (0,)}, "--lookups"),
    ],
)
def test_bad_options_are_refused_naming_them(options, name):
    with pytest.raises(ValueError, match=name):
        BenchConfig(**options)
    assert Sampling(temperature=1.0).temperature == 1.0
