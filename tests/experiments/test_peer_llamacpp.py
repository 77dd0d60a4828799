"""llama.cpp as a peer: the plumbing with a fake ``Llama`` (no llama.cpp needed), and the real thing.

The tests marked ``llamacpp`` need the optional extra (``pip install 'specbound[llamacpp]'``); without it they
are reported as skipped with that install command (``pytest -ra`` lists the reason), never silently. Run them
alone with ``pytest -m llamacpp``.
"""

import json

import numpy as np
import pytest
import torch

from executor.drafters import PromptLookupDrafter
from experiments import bench_llamacpp, bench_rows, peer_llamacpp
from experiments.bench import Record, RowKey, summarise
from experiments.bench_rows import BenchConfig
from experiments.peer_predict import held_out_prediction
from tests.tiny_models import build_tiny_model


class FakeLlama:
    """What the peer code uses of ``llama_cpp.Llama``: ``reset``, ``generate``, ``eval``, ``sample``,
    ``n_tokens``. Generates ``10, 11, 12, ...`` forever; counts the calls."""

    def __init__(self, weights="q4_1", lookup=None):
        self.weights, self.lookup = weights, lookup
        self.n_tokens = 0
        self.resets = 0
        self.evals: list[tuple[int, int]] = []  # (n_tokens before, tokens evaluated)
        self.samples = 0

    def reset(self):
        self.resets += 1
        self.n_tokens = 0

    def generate(self, tokens, temp, repeat_penalty, reset):
        assert temp == 0.0 and repeat_penalty == 1.0 and reset
        self.eval(tokens)
        token = 10
        while True:
            yield token
            token += 1

    def eval(self, tokens):
        self.evals.append((self.n_tokens, len(tokens)))
        self.n_tokens += len(tokens)

    def sample(self, temp, repeat_penalty, idx):
        self.samples += 1
        return 0


def test_runner_resets_prefills_and_stops_at_max_new_tokens():
    llm = FakeLlama()
    run = peer_llamacpp.llamacpp_runner(llm)
    record = run([1, 2, 3], 5, seed=0)
    assert record.token_ids == [10, 11, 12, 13, 14] and record.tokens == 5
    assert llm.resets == 1 and llm.evals == [(0, 3)]  # the prompt is prefilled from an empty cache
    assert 0 <= record.first_token_seconds <= record.seconds
    run([1, 2, 3], 2, seed=1)
    assert llm.resets == 2 and llm.evals[-1] == (0, 3)  # no reuse of the previous run's cache


def test_llamacpp_rows_are_greedy_named_per_weights_and_lookup():
    loaded = []

    def load(weights, lookup):
        loaded.append((weights, lookup))
        return FakeLlama(weights, lookup)

    config = BenchConfig(dtypes=("float32",), temperatures=(0.0, 1.0), lookups=(2, 10), peer="llamacpp")
    int8 = build_tiny_model(3, vocab_size=24, n_layers=2, max_seq_len=64)
    runners = bench_rows.llamacpp_runners(config, load, int8)
    expected = {
        RowKey(name, dtype, 0.0)
        for dtype in ("q4_1", "float32", "bfloat16")
        for name in ("llamacpp", "llamacpp-lookup-k2", "llamacpp-lookup-k10")
    } | {RowKey("ar-int8", "float32", 0.0)}
    assert set(runners) == expected
    assert set(loaded) == {(w, k) for w in ("q4_1", "f32", "bf16") for k in (None, 2, 10)}
    assert runners[RowKey("ar-int8", "float32", 0.0)]([1, 2, 3], 4, 0).tokens == 4
    # no rows at T > 0 only, and --rows selects
    assert bench_rows.llamacpp_runners(BenchConfig(temperatures=(1.0,), peer="llamacpp"), load) == {}
    some = BenchConfig(temperatures=(0.0,), peer="llamacpp", peer_weights=("f32",), rows=("llamacpp",))
    assert set(bench_rows.llamacpp_runners(some, load)) == {RowKey("llamacpp", "float32", 0.0)}


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"peer": "vllm"}, "--peer"),
        ({"peer_weights": ("f16",)}, "--peer-weights"),
        ({"peer_weights": ()}, "--peer-weights"),
    ],
)
def test_bad_peer_options_are_named(options, match):
    with pytest.raises(ValueError, match=match):
        BenchConfig(**options)


@pytest.mark.parametrize(
    "info, weights, refused",
    [
        (b"CPU : AVX512 = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 |", "q4_1", True),
        (b"CPU : AVX512 = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 |", "f32", False),
        (b"CPU : AVX512 = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 |", "bf16", False),
        (b"CPU : AVX2 = 1 | FMA = 1 | LLAMAFILE = 1 |", "q4_1", False),
        ("CPU : AVX512 = 1 | AMX_INT8 = 0 |", "q4_1", False),
    ],
)
def test_q4_1_is_refused_before_loading_on_a_build_with_amx_kernels(monkeypatch, info, weights, refused):
    class FakeModule:
        @staticmethod
        def llama_print_system_info():
            return info

    reason = peer_llamacpp.unsupported_weights_reason(FakeModule, weights)
    assert (reason is not None) == refused
    if refused:
        assert "--peer-weights q4_1" in reason and "AMX" in reason
        monkeypatch.setattr(peer_llamacpp, "import_llama_cpp", lambda: FakeModule)
        with pytest.raises(ValueError, match="AMX"):  # before any Llama is built
            peer_llamacpp.load_llama(weights, threads=1)
    with pytest.raises(ValueError, match="weights must be one of"):
        peer_llamacpp.unsupported_weights_reason(FakeModule, "q8_0")


def test_decoding_rate_leaves_the_first_token_out_and_ratios_use_llamacpp_plain():
    def record(seconds, first, tokens=11):
        return Record(
            tokens=tokens, seconds=seconds, token_ids=list(range(tokens)), first_token_seconds=first
        )

    plain, lookup = RowKey("llamacpp", "q4_1", 0.0), RowKey("llamacpp-lookup-k2", "q4_1", 0.0)
    done = [
        {plain: record(2.0, 1.0), lookup: record(1.5, 1.0)},
        {plain: record(3.0, 1.0), lookup: record(2.0, 1.0)},
    ]
    rows = {row["decoder"]: row for row in summarise(done)}
    assert rows["llamacpp"]["decode_tokens_per_s"] == pytest.approx(20 / 3.0)
    assert rows["llamacpp-lookup-k2"]["decode_tokens_per_s"] == pytest.approx(20 / 1.5)
    assert rows["llamacpp-lookup-k2"]["vs_llamacpp"] == pytest.approx((22 / 3.5) / (22 / 5.0))
    assert rows["llamacpp"]["vs_ar"] is None  # no ar at q4_1


def test_profile_interleaves_sizes_and_rolls_back_to_the_context():
    llms = {"q4_1": FakeLlama(), "f32": FakeLlama("f32")}
    context = list(range(20))
    proposals = []

    def propose(ids, ngram, k):
        proposals.append((len(ids), ngram, k))
        return ids[:0]

    result = peer_llamacpp.profile_llamacpp(
        llms, context, sizes=(1, 2, 3), repeats=3, warmup=1, propose=propose
    )
    for name, llm in llms.items():
        assert llm.evals[0] == (0, 19)  # the context without its last token, once
        passes = llm.evals[1:]
        assert all(before == 19 for before, _ in passes)  # every pass starts at the committed context
        # An untimed one-token pass, the sizes in turn, then the sample's one-token pass.
        assert [n for _, n in passes][:5] == [1, 1, 2, 3, 1]
        assert llm.samples == 4
        part = result[name]
        assert part["target"]["sizes"] == [1, 2, 3] and part["repeats"] == 3
        assert [s["repeats"] for s in part["target"]["stats"]] == [3, 3, 3]
        assert part["drafter"]["per_token"]["repeats"] == 3 and part["sample_time"]["repeats"] == 3
    assert proposals[0] == (20, 2, 3)
    with pytest.raises(ValueError, match="sizes must contain 1"):
        peer_llamacpp.profile_llamacpp(llms, context, sizes=(2, 4), propose=propose)
    with pytest.raises(ValueError, match="context"):
        peer_llamacpp.profile_llamacpp(llms, [1], propose=propose)


def _document(times):
    sizes = list(range(1, len(times) + 1))
    return {
        "target": {"sizes": sizes, "times": times, "relative": [t / times[0] for t in times], "stats": []},
        "drafter": {"draft_time": 0.001, "level_time": 0.001},
        "sample_time": {"median": 0.002},
    }


def test_section_predicts_from_the_profile_and_compares_with_the_measured_decoding_ratio():
    steps = [[[2, 2], [2, 1], [0, 0]], [[2, 0], [2, 2]], [[1, 1], [2, 2], [2, 1]]]
    prepared = {
        "profiles": {"q4_1": "x.latency-llamacpp-q4_1.json"},
        "documents": {"q4_1": _document([0.01, 0.015, 0.02, 0.03])},
        "steps": {"2": steps},
    }
    rows = [
        {"decoder": "ar", "dtype": "float32", "temperature": 0.0, "tokens_per_s": 20.0},
        {"decoder": "ar-int8", "dtype": "float32", "temperature": 0.0, "tokens_per_s": 25.0},
        {"decoder": "llamacpp", "dtype": "q4_1", "temperature": 0.0, "tokens_per_s": 100.0,
         "decode_tokens_per_s": 110.0, "vs_llamacpp": 1.0},
        {"decoder": "llamacpp-lookup-k2", "dtype": "q4_1", "temperature": 0.0, "tokens_per_s": 90.0,
         "decode_tokens_per_s": 99.0, "vs_llamacpp": 0.9},
    ]  # fmt: skip
    section = bench_llamacpp.section(rows, prepared, max_new_tokens=9)
    [prediction] = section["predictions"]
    times = {1: 0.01, 2: 0.015, 3: 0.02, 4: 0.03}
    expected = held_out_prediction(times, steps, [8, 8, 8], 2, lookup_time=0.001, token_time=0.002)
    assert prediction["predicted"] == pytest.approx(expected["speedup"])
    assert prediction["measured_decode"] == pytest.approx(0.9) and prediction[
        "measured_total"
    ] == pytest.approx(0.9)
    assert prediction["error"] == pytest.approx(expected["speedup"] / 0.9 - 1)
    assert prediction["t_ratio"] == pytest.approx(2.0)
    ratios = {row["decoder"]: (row["vs_f32"], row["vs_int8"]) for row in section["rows"]}
    assert ratios["llamacpp"] == pytest.approx((5.0, 4.0))
    markdown = "\n".join(bench_llamacpp.render_markdown(section))
    assert "| q4_1 | 2 | 2.00 |" in markdown and "x.latency-llamacpp-q4_1.json" in markdown


def test_prediction_charges_the_mean_of_the_profiles_before_and_after_the_rounds():
    steps = [[[2, 2], [2, 1], [0, 0]], [[2, 0], [2, 2]], [[1, 1], [2, 2], [2, 1]]]
    prepared = {
        "profiles": {"q4_1": "x.latency-llamacpp-q4_1.json"},
        "documents": {"q4_1": _document([0.01, 0.015, 0.02, 0.03])},
        "profiles_after": {"q4_1": "x.latency-llamacpp-q4_1-after.json"},
        "documents_after": {"q4_1": _document([0.01, 0.025, 0.03, 0.05])},
        "steps": {"2": steps},
    }
    [prediction] = bench_llamacpp.predictions(prepared, [], max_new_tokens=9)
    mean = {1: 0.01, 2: 0.02, 3: 0.025, 4: 0.04}
    expected = held_out_prediction(mean, steps, [8, 8, 8], 2, lookup_time=0.001, token_time=0.002)
    assert prediction["predicted"] == pytest.approx(expected["speedup"])
    before_only = held_out_prediction(
        {1: 0.01, 2: 0.015, 3: 0.02, 4: 0.03}, steps, [8, 8, 8], 2, lookup_time=0.001, token_time=0.002
    )
    assert prediction["predicted"] != pytest.approx(before_only["speedup"])
    assert (
        prediction["t_ratio"],
        prediction["t_ratio_before"],
        prediction["t_ratio_after"],
    ) == pytest.approx((2.5, 2.0, 3.0))
    assert prediction["latency_after"] == "x.latency-llamacpp-q4_1-after.json"
    markdown = "\n".join(bench_llamacpp.render_markdown({"rows": [], "predictions": [prediction]}))
    assert "| q4_1 | 2 | 2.50 (2.00 / 3.00) |" in markdown


def test_prediction_charges_the_profile_between_the_rounds_when_there_is_one():
    steps = [[[2, 2], [2, 1], [0, 0]], [[2, 0], [2, 2]], [[1, 1], [2, 2], [2, 1]]]
    during = _document([0.01, 0.012, 0.014, 0.02])
    during["drafter"]["draft_time"], during["sample_time"]["median"] = 0.0005, 0.001
    prepared = {
        "profiles": {"q4_1": "x.latency-llamacpp-q4_1.json"},
        "documents": {"q4_1": _document([0.01, 0.015, 0.02, 0.03])},
        "documents_after": {"q4_1": _document([0.01, 0.025, 0.03, 0.05])},
        "documents_during": {"q4_1": during},
        "profiles_during": {"q4_1": "x.latency-llamacpp-q4_1-during.json"},
        "steps": {"2": steps},
    }
    [prediction] = bench_llamacpp.predictions(prepared, [], max_new_tokens=9)
    times = {1: 0.01, 2: 0.012, 3: 0.014, 4: 0.02}
    expected = held_out_prediction(times, steps, [8, 8, 8], 2, lookup_time=0.0005, token_time=0.001)
    assert prediction["predicted"] == pytest.approx(expected["speedup"])
    assert prediction["costs"] == "between the rounds"
    assert (prediction["t_ratio"], prediction["t_ratio_during"]) == pytest.approx((1.4, 1.4))
    markdown = "\n".join(bench_llamacpp.render_markdown({"rows": [], "predictions": [prediction]}))
    assert "| q4_1 | 2 | 1.40 (2.00 / 3.00) |" in markdown
    assert "--latency x.latency-llamacpp-q4_1-during.json" in markdown


def test_profile_pools_the_samples_of_several_calls():
    llms = {"q4_1": FakeLlama()}
    samples = {}
    for call in range(3):
        result = peer_llamacpp.profile_llamacpp(
            llms, list(range(20)), sizes=(1, 2), repeats=2, warmup=1, propose=lambda ids, n, k: ids[:0],
            samples=samples,
        )  # fmt: skip
        assert result["q4_1"]["repeats"] == 2 * (call + 1)  # the summaries cover every call so far
    assert {key: len(values) for key, values in samples["q4_1"].items()} == {
        "1": 6, "2": 6, "lookup": 6, "sample": 6,
    }  # fmt: skip
    stats = result["q4_1"]["target"]["stats"]
    assert stats[1]["median"] == pytest.approx(float(np.median(samples["q4_1"]["2"])))
    json.dumps(samples)  # checkpointed with the rounds


def test_text_steps_worked_by_hand():
    # (1, 2) recurs: propose [3, 1]; 3 matches, 9 does not. (3, 9) and (9) never occurred: no draft. (1) first
    # occurred at 0: propose [2, 3], both match and end the text.
    assert bench_llamacpp.text_steps([1, 2, 3, 1, 2], [3, 9, 1, 2, 3], 2) == [[2, 1], [0, 0], [2, 2]]
    assert bench_llamacpp.text_steps([5], [], 3) == []


def test_text_steps_of_our_greedy_text_are_the_steps_our_lookup_decoder_took():
    """The exact oracle: decode with our chain decoder and prompt lookup, then recover every step from the
    emitted text alone."""
    from executor.decoders import ChainDecoder, Sampling

    model = build_tiny_model(5, vocab_size=6, n_layers=2, max_seq_len=200)  # 6 tokens: lookups often hit
    for lookup in (1, 2, 5):
        decoder = ChainDecoder(
            model,
            PromptLookupDrafter(max_ngram=peer_llamacpp.LOOKUP_NGRAM, max_tokens=lookup),
            gamma=lookup,
            sampling=Sampling(temperature=0.0),
        )
        for prompt in ([1, 2, 3, 1, 2, 4], [0, 5, 0, 5, 1], [3, 3, 3]):
            result = decoder.generate(prompt, 40, generator=torch.Generator())
            text = [t for step in result.steps for t in step.emitted]
            taken = [[s.n_drafted, s.n_accepted] for s in result.steps]
            assert sum(d > 0 for d, _ in taken) > 0 and sum(a for _, a in taken) > 0  # not vacuous
            assert bench_llamacpp.text_steps(prompt, text, lookup) == taken


def test_prediction_takes_the_acceptance_from_llamacpps_own_text_of_the_other_prompts():
    prompts = [[1, 2, 3, 1, 2], [4, 4, 4, 4], [1, 5, 1, 5, 1]]
    texts = [[3, 9, 1, 2, 3], [4, 4, 4, 4, 4, 7], [5, 1, 5, 2, 2]]
    ours = [[[2, 0], [0, 0]], [[2, 0]], [[1, 0], [1, 0]]]  # what our float32 text would give (different)
    prepared = {
        "profiles": {"bf16": "x.latency-llamacpp-bf16.json"},
        "documents": {"bf16": _document([0.01, 0.015, 0.02])},
        "steps": {"2": ours},
    }
    own = {("bf16", 2): list(zip(prompts, texts, strict=True))}
    [prediction] = bench_llamacpp.predictions(prepared, [], max_new_tokens=6, texts=own)
    steps = [bench_llamacpp.text_steps(p, t, 2) for p, t in own[("bf16", 2)]]
    expected = held_out_prediction(
        {1: 0.01, 2: 0.015, 3: 0.02}, steps, [5, 5, 5], 2, lookup_time=0.001, token_time=0.002
    )
    assert prediction["predicted"] == pytest.approx(expected["speedup"])
    assert prediction["acceptance_from"] == "llama.cpp's own text"
    others = {("f32", 2): own[("bf16", 2)], ("bf16", 10): own[("bf16", 2)]}  # another format, another K
    [fallback] = bench_llamacpp.predictions(prepared, [], max_new_tokens=6, texts=others)
    assert fallback["acceptance_from"] == "our float32 text" and fallback["predicted"] != pytest.approx(
        expected["speedup"]
    )
    # own_texts reads the lookup row of each K, in the first round of every prompt (a second round repeats).
    key, plain = RowKey("llamacpp-lookup-k2", "bfloat16", 0.0), RowKey("llamacpp", "bfloat16", 0.0)
    done = [
        {key: Record(tokens=5, seconds=1.0, token_ids=t), plain: Record(5, 1.0)} for t in [*texts, [0], [0]]
    ]
    assert bench_llamacpp.own_texts(done, prompts, ["bf16", "f32"], [2, 10]) == own


def test_bench_peer_llamacpp_end_to_end_with_fakes(monkeypatch, tmp_path):
    from experiments.cli import main
    from experiments.commands import bench as command

    class Tokenizer:
        eos_token_id = 0

        def encode(self, text):
            return [1 + ord(c) % 23 for c in text][:12]

    monkeypatch.setattr(
        bench_rows,
        "load_target",
        lambda dtype, config: (build_tiny_model(3, vocab_size=24, n_layers=2, max_seq_len=160), Tokenizer()),
    )
    monkeypatch.setattr(peer_llamacpp, "import_llama_cpp", lambda: None)
    monkeypatch.setattr(
        command, "load_llama", lambda weights, lookup, threads, n_ctx: FakeLlama(weights, lookup)
    )
    monkeypatch.setattr(
        peer_llamacpp, "profile_llamacpp", _fake_profile
    )  # no llama_cpp import for the lookup's timing
    out = tmp_path / "bench.json"
    code = main(
        ["bench", "--peer", "llamacpp", "--peer-weights", "q4_1,f32", "--dtypes", "float32", "--temperatures",
         "0", "--prompt-set", "other", "--prompts", "3", "--max-new-tokens", "6", "--lookups", "2",
         "--rows", "ar,ar-int8,llamacpp*", "--latency-repeats", "1", "--context", "16", "--exit-layer", "1", "--drafters", "early-exit:1", "--threads", "1",
         "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    names = {(row["decoder"], row["dtype"]) for row in result["rows"]}
    assert names == {
        ("ar", "float32"), ("ar-int8", "float32"), ("llamacpp", "q4_1"), ("llamacpp-lookup-k2", "q4_1"),
        ("llamacpp", "float32"), ("llamacpp-lookup-k2", "float32"),
    }  # fmt: skip
    assert {(p["weights"], p["lookup"]) for p in result["llamacpp"]["predictions"]} == {
        ("q4_1", 2),
        ("f32", 2),
    }
    assert (tmp_path / "bench.latency-llamacpp-f32.json").is_file()
    assert (tmp_path / "bench.latency-llamacpp-f32-after.json").is_file()  # profiled again after the rounds
    assert all(p["t_ratio_after"] is not None for p in result["llamacpp"]["predictions"])
    # Profiled between the rounds too (once per round: 3 prompts), and that profile is the one charged.
    assert result["llamacpp"] is not None and (tmp_path / "bench.latency-llamacpp-f32-during.json").is_file()
    for p in result["llamacpp"]["predictions"]:
        assert p["costs"] == "between the rounds"
        assert p["acceptance_from"] == "llama.cpp's own text"
        assert (p["t_ratio"], p["t_ratio_during"], p["t_ratio_after"]) == pytest.approx((1.4, 1.4, 1.2))
    assert "t(n) charged: between the rounds" in (tmp_path / "bench.md").read_text()
    steps = json.loads((tmp_path / "bench.lookup-steps-k2.json").read_text())["steps"]
    assert len(steps) == 3  # one list of steps per prompt
    alpha = json.loads((tmp_path / "bench.acceptance-lookup-k2.json").read_text())["per_position"]
    assert len(alpha) == 2 and all(0 <= a <= 1 for a in alpha)
    assert "## llama.cpp on the same weights" in (tmp_path / "bench.md").read_text()


def _fake_profile(llms, context, sizes, repeats, warmup, progress=False, samples=None):
    """Before and after the rounds t(n) = 0.01 (1 + 0.1 (n - 1)); between them (``samples`` given) twice the slope."""
    slope = 0.1 if samples is None else 0.2
    if samples is not None:
        samples.setdefault("calls", []).append(len(llms))
    return {
        name: _document([0.01 * (1 + slope * (n - 1)) for n in range(1, max(sizes) + 1)]) for name in llms
    }


def test_bench_compile_runs_our_targets_compiled_next_to_eager_twins(monkeypatch, tmp_path):
    """``--compile`` with ``torch.compile`` faked (the plumbing, not Inductor): the ``ar`` rows go through the
    compiled step, the ``-eager`` twins never do, compile time is reported apart, the rows decode alike."""
    from executor import compiled
    from experiments.cli import main
    from experiments.commands import bench as command

    class Tokenizer:
        eos_token_id = 0

        def encode(self, text):
            return [1 + ord(c) % 23 for c in text][:12]

    loaded = []

    def load_target(dtype, config):
        loaded.append(config.quantize)
        return build_tiny_model(3, vocab_size=24, n_layers=2, max_seq_len=160), Tokenizer()

    compiled_models = []

    def fake_compile(function, **options):
        model = function.__self__
        compiled_models.append(model)

        def step(*args):
            model.compiled_calls = getattr(model, "compiled_calls", 0) + 1
            return function(*args)

        return step

    monkeypatch.setattr(bench_rows, "load_target", load_target)
    monkeypatch.setattr(compiled, "compiler_available", lambda: True)
    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(peer_llamacpp, "import_llama_cpp", lambda: None)
    monkeypatch.setattr(
        command, "load_llama", lambda weights, lookup, threads, n_ctx: FakeLlama(weights, lookup)
    )
    monkeypatch.setattr(peer_llamacpp, "profile_llamacpp", _fake_profile)
    out = tmp_path / "bench.json"
    code = main(
        ["bench", "--peer", "llamacpp", "--peer-weights", "f32", "--dtypes", "float32", "--temperatures", "0",
         "--prompt-set", "other", "--prompts", "2", "--max-new-tokens", "5", "--lookups", "2",
         "--rows", "ar*,llamacpp", "--latency-repeats", "1", "--context", "16", "--exit-layer", "1",
         "--drafters", "early-exit:1", "--threads", "1", "--compile", "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    rows = {row["decoder"]: row for row in result["rows"]}
    assert set(rows) == {
        "ar", "ar-eager", "ar-int8", "ar-int8-eager", "ar-q4_1", "ar-q4_1-eager", "llamacpp"
    }  # fmt: skip
    assert sorted(loaded) == sorted(["none", "none", "int8", "int8", "q4_1", "q4_1"])
    assert set(result["compile_seconds"]) == {"float32", "ar-int8", "ar-q4_1"}
    assert all(s >= 0 for s in result["compile_seconds"].values())
    # Three models compiled (ar, ar-int8, ar-q4_1), each ran its forwards through the compiled step ...
    assert len(compiled_models) == 3 and all(m.compiled_calls > 5 for m in compiled_models)
    # ... and the same tiny weights decode the same tokens compiled or eager.
    assert all(rows[name]["agrees_with_ar"] == 1 for name in rows if name.startswith("ar"))
    section = {row["decoder"]: row for row in result["llamacpp"]["rows"]}
    assert set(section) == set(rows) and section["ar-q4_1-eager"]["vs_q4_1"] > 0
    assert "compile time, not in the rows" in (tmp_path / "bench.md").read_text()
    assert "vs our q4_1 ar" in (tmp_path / "bench.md").read_text()


# --- the real llama.cpp (the optional extra) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_cpp():
    return pytest.importorskip(
        "llama_cpp", reason="needs the llamacpp extra: pip install 'specbound[llamacpp]' (builds from source)"
    )


@pytest.mark.llamacpp
def test_llamacpp_prompt_lookup_proposes_what_our_drafter_proposes(llama_cpp):
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    ours = PromptLookupDrafter(max_ngram=peer_llamacpp.LOOKUP_NGRAM, max_tokens=5)
    rng = np.random.default_rng(0)
    proposed = 0
    for _ in range(500):
        ids = rng.integers(0, 4, size=int(rng.integers(2, 30))).astype(np.intc)
        theirs = LlamaPromptLookupDecoding.find_candidate_pred_tokens(ids, peer_llamacpp.LOOKUP_NGRAM, 5)
        assert theirs.tolist() == ours.propose(ids.tolist())
        proposed += len(theirs) > 0
    assert proposed > 100  # most draws propose something: the comparison is not vacuous


@pytest.mark.slow
@pytest.mark.llamacpp
def test_llamacpp_f32_greedy_text_equals_ours_and_profile_runs(llama_cpp):
    from executor.decoders import AutoregressiveDecoder
    from executor.weights import load_model

    torch.set_num_threads(1)
    path = peer_llamacpp.weights_path("f32")
    assert path.is_file() and peer_llamacpp.weights_path("f32") == path  # made once, then cached
    model, tokenizer = load_model(dtype="float32")
    prompt = tokenizer.encode("def fibonacci(n):\n")
    ours = AutoregressiveDecoder(model).generate(prompt, 16, generator=torch.Generator()).token_ids
    llm = peer_llamacpp.load_llama("f32", threads=1, n_ctx=128)
    theirs = peer_llamacpp.llamacpp_runner(llm)(prompt, 16, 0).token_ids
    assert theirs == list(ours)
    # Q4_1 where this build runs it (its AMX kernels crash: refused, see unsupported_weights_reason).
    weights = "q4_1" if peer_llamacpp.unsupported_weights_reason(llama_cpp, "q4_1") is None else "f32"
    lookup = peer_llamacpp.load_llama(weights, threads=1, lookup=2, n_ctx=128)
    assert peer_llamacpp.llamacpp_runner(lookup)(prompt, 16, 0).tokens == 16
    measured = peer_llamacpp.profile_llamacpp({weights: lookup}, prompt, sizes=(1, 2, 4), repeats=2, warmup=1)
    assert measured[weights]["target"]["sizes"] == [1, 2, 4]
    assert all(t > 0 for t in measured[weights]["target"]["times"])
