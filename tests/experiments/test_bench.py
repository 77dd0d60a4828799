"""experiments.bench, the engine of `specbound bench`: interleaved and rotated rounds, exact summaries, resume.

The engine is tested with fake runners (no model): each records its calls and returns fixed records, so the
order of the calls, every tokens/s ratio, tau and acceptance by position are known exactly.
"""

import json

import pytest

from experiments.bench import (
    Record,
    RowKey,
    checkpoint_path,
    greedy_divergences,
    render_markdown,
    run_bench,
    summarise,
    write_report,
)


def fake(name, calls, tokens=10, seconds=1.0, **extra):
    def run(prompt, max_new_tokens, seed):
        calls.append((name, tuple(prompt), max_new_tokens, seed))
        return Record(tokens=tokens, seconds=seconds, token_ids=list(prompt), **extra)

    return run


def keys(*names, dtype="float32", temperature=0.0):
    return [RowKey(name, dtype, temperature) for name in names]


def test_rounds_are_interleaved_rotated_seeded_and_warmed_up():
    calls = []
    hf, ar, chain = keys("hf-generate", "ar", "chain")
    runners = {hf: fake("hf", calls), ar: fake("ar", calls), chain: fake("chain", calls)}
    done = run_bench(runners, [[1], [2]], 10, rounds=2, seed=7)
    timed = [(name, prompt, seed) for name, prompt, n, seed in calls if n == 10]
    assert timed == [
        ("hf", (1,), 7),
        ("ar", (1,), 7),
        ("chain", (1,), 7),
        ("ar", (2,), 8),
        ("chain", (2,), 8),
        ("hf", (2,), 8),
        ("chain", (1,), 9),
        ("hf", (1,), 9),
        ("ar", (1,), 9),
        ("hf", (2,), 10),
        ("ar", (2,), 10),
        ("chain", (2,), 10),
    ]
    assert [c[:3] for c in calls if c[2] == 4] == [("hf", (1,), 4), ("ar", (1,), 4), ("chain", (1,), 4)]
    assert len(done) == 4 and all(list(rnd) == [hf, ar, chain] for rnd in done)


def test_summary_ratios_tau_and_acceptance_by_position_are_exact():
    calls = []
    hf, ar, chain, other = keys("hf-generate", "ar", "chain", "chain-bf16")
    bf16_ar = RowKey("ar", "bfloat16", 0.0)
    runners = {
        hf: fake("hf", calls, tokens=10, seconds=1.0),
        ar: fake("ar", calls, tokens=10, seconds=2.0, steps=10, emitted=10, reached=[], drafting=0),
        # 3 steps that drafted, depth 2 reached once and depth 1 twice; 5 emitted tokens over 3 passes.
        chain: fake("chain", calls, tokens=10, seconds=0.5, steps=3, emitted=5, reached=[2, 1], drafting=3),
        bf16_ar: fake("ar16", calls, tokens=10, seconds=4.0, steps=10, emitted=10, reached=[], drafting=0),
        other: fake("x", calls, tokens=10, seconds=1.0),
    }
    rows = {(r["decoder"], r["dtype"]): r for r in summarise(run_bench(runners, [[1], [2], [3]], 10))}
    c = rows[("chain", "float32")]
    assert c["tokens"] == 30 and c["tokens_per_s"] == 20.0
    assert c["vs_hf_generate"] == 2.0 and c["vs_ar"] == 4.0
    assert c["tau"] == 5 / 3 and c["acceptance_per_position"] == [2 / 3, 1 / 3]
    assert rows[("ar", "float32")]["tau"] == 1.0 and rows[("ar", "float32")]["acceptance_per_position"] == []
    assert rows[("hf-generate", "float32")]["tau"] is None
    # Ratios compare rows of the same dtype only; a dtype without hf-generate has no vs_hf_generate.
    assert rows[("ar", "bfloat16")]["vs_ar"] == 1.0 and rows[("ar", "bfloat16")]["vs_hf_generate"] is None
    assert all(row["agrees_with_ar"] == 1.0 for row in rows.values())  # every fake echoes its prompt


def test_agreement_with_ar_counts_rounds_with_other_tokens_and_is_none_when_sampling():
    ar, good, bad = keys("ar", "good", "bad")
    sampled_ar, sampled = keys("ar", "sampled", temperature=1.0)

    def echo(prompt, n, seed):
        return Record(tokens=n, seconds=1.0, token_ids=[prompt[0]] * n)

    def wrong_on_prompt_2(prompt, n, seed):
        return Record(tokens=n, seconds=1.0, token_ids=[prompt[0] + (prompt[0] == 2)] * n)

    runners = {ar: echo, good: echo, bad: wrong_on_prompt_2, sampled_ar: echo, sampled: wrong_on_prompt_2}
    rows = {(r["decoder"], r["temperature"]): r for r in summarise(run_bench(runners, [[1], [2], [3]], 4))}
    assert rows[("good", 0.0)]["agrees_with_ar"] == 1.0
    assert rows[("bad", 0.0)]["agrees_with_ar"] == pytest.approx(2 / 3)
    assert rows[("sampled", 1.0)]["agrees_with_ar"] is None


def test_rounds_diverging_at_a_tie_count_as_agreeing_up_to_ties_and_others_do_not():
    ar, tied, broken = keys("ar", "tied", "broken")
    record = lambda ids: Record(tokens=len(ids), seconds=1.0, token_ids=ids)  # noqa: E731
    done = [
        {ar: record([1, 2]), tied: record([1, 2]), broken: record([1, 2])},
        {ar: record([3, 4]), tied: record([3, 5]), broken: record([6, 4])},
    ]
    divergences = {
        (0, tied): None,
        (0, broken): None,
        (1, tied): {"position": 1, "gap": 0.0, "spacing": 0.25, "within_one_step": True},
        (1, broken): {"position": 0, "gap": 1.5, "spacing": 0.25, "within_one_step": False},
    }
    rows = {r["decoder"]: r for r in summarise(done, divergences)}
    assert rows["tied"]["agrees_with_ar"] == 0.5 and rows["tied"]["agrees_with_ar_up_to_ties"] == 1.0
    assert rows["broken"]["agrees_with_ar_up_to_ties"] == 0.5
    assert rows["broken"]["divergences"] == [divergences[(1, broken)]]
    assert rows["ar"]["agrees_with_ar_up_to_ties"] is None
    # Without the check (peers, old reports) the column stays empty.
    assert summarise(done)[1]["agrees_with_ar_up_to_ties"] is None


def test_greedy_divergences_are_measured_on_the_rows_own_target_for_our_rows_only():
    from tests.tiny_models import build_tiny_model

    model = build_tiny_model(3, vocab_size=8, max_seq_len=32)
    ar, ours, peer = keys("ar", "chain", "hf-generate")
    sampled_ar, sampled = keys("ar", "chain", temperature=1.0)
    record = lambda ids: Record(tokens=len(ids), seconds=1.0, token_ids=ids)  # noqa: E731
    done = [
        {
            ar: record([1, 2]),
            ours: record([1, 3]),
            peer: record([4, 4]),
            sampled_ar: record([1]),
            sampled: record([2]),
        },
        {
            ar: record([5, 6]),
            ours: record([5, 6]),
            peer: record([5, 6]),
            sampled_ar: record([1]),
            sampled: record([1]),
        },
    ]
    found = greedy_divergences(done, [[7, 7], [6, 6]], {"float32": model}, {ar, ours, sampled})
    # The peer is not ours and the sampled row is not greedy; round 1 agrees (checked: None).
    assert set(found) == {(0, ours), (1, ours)} and found[(1, ours)] is None
    assert found[(0, ours)]["position"] == 1 and (
        found[(0, ours)]["reference_token"],
        found[(0, ours)]["token"],
    ) == (2, 3)


def test_an_interrupted_run_resumes_at_the_first_unfinished_round(tmp_path):
    out = str(tmp_path / "bench.json")
    checkpoint = checkpoint_path(out)
    calls = []
    ar, chain = keys("ar", "chain")
    state = {"left": 3}

    def flaky(prompt, n, seed):  # fails on its third timed call: rounds 0 and 1 are finished by then
        if n == 10:
            state["left"] -= 1
            if state["left"] == 0:
                raise KeyboardInterrupt
        return fake("chain", calls)(prompt, n, seed)

    runners = {ar: fake("ar", calls), chain: flaky}
    fingerprint = {"setting": 1}
    with pytest.raises(KeyboardInterrupt):
        run_bench(
            runners, [[1], [2], [3]], 10, checkpoint=checkpoint, fingerprint=fingerprint, prepared={"p": 1}
        )
    saved = json.loads(open(checkpoint).read())
    assert len(saved["rounds"]) == 2 and saved["prepared"] == {"p": 1}
    calls.clear()
    runners[chain] = fake("chain", calls)
    done = run_bench(runners, [[1], [2], [3]], 10, checkpoint=checkpoint, fingerprint=fingerprint)
    assert len(done) == 3
    assert [(name, prompt) for name, prompt, n, _ in calls if n == 10] == [("ar", (3,)), ("chain", (3,))]
    # Another fingerprint (other settings) starts again from the first round.
    calls.clear()
    done = run_bench(runners, [[1], [2], [3]], 10, checkpoint=checkpoint, fingerprint={"setting": 2})
    assert len(done) == 3 and sum(n == 10 for *_, n, _ in calls) == 6
    rows = summarise(done)
    write_report({"settings": _settings(), "rows": rows}, out)
    assert not (tmp_path / "bench.partial.json").exists()
    assert (tmp_path / "bench.md").read_text().startswith("# specbound bench")


def test_after_round_runs_once_per_finished_round_and_what_it_adds_is_checkpointed(tmp_path):
    calls = []
    ar, chain = RowKey("ar", "float32", 0.0), RowKey("chain", "float32", 0.0)
    runners = {ar: fake("ar", calls), chain: fake("chain", calls)}
    prepared = {"during": []}
    seen = []

    def after_round(index):
        timed = [c for c in calls if c[2] == 10]
        seen.append((index, len(timed)))
        prepared["during"].append(index)

    checkpoint = str(tmp_path / "bench.partial.json")
    run_bench(
        runners, [[1], [2]], 10, rounds=2, checkpoint=checkpoint, fingerprint={}, prepared=prepared,
        after_round=after_round,
    )  # fmt: skip
    # After each round's last row (2 rows per round), with the round's index; 2 prompts x 2 rounds.
    assert seen == [(0, 2), (1, 4), (2, 6), (3, 8)]
    assert json.loads(open(checkpoint).read())["prepared"] == {"during": [0, 1, 2, 3]}


def _settings():
    return {
        "prompt_set": "humaneval",
        "prompts": 3,
        "rounds": 1,
        "max_new_tokens": 10,
        "threads": 1,
        "torch": "x",
    }


def test_markdown_has_a_section_per_temperature_and_the_forward_and_plan_tables():
    rows = [
        {
            "decoder": "chain",
            "dtype": "float32",
            "temperature": t,
            "tokens_per_s": 20.0,
            "tau": 1.5,
            "acceptance_per_position": [0.5, 0.25],
            "vs_ar": 4.0,
            "vs_hf_generate": 2.0,
            "agrees_with_ar": 1.0 if t == 0 else None,
        }
        for t in (0.0, 1.0)
    ]
    forward = [{"n": 1, "median_ms": {"float32": 10.0, "bfloat16": 8.0}, "bfloat16_over_float32": 0.8}]
    plans = [
        {
            "drafter": "feature",
            "dtype": "float32",
            "temperature": 0.0,
            "acceptance": [0.5, 0.1],
            "cost_ratio": 0.06,
            "size": 4,
            "depth": 2,
            "speedup": 1.25,
            "command": "specbound plan-tree --acceptance a.json --latency l.json --budget 16",
        }
    ]
    text = render_markdown({"settings": _settings(), "rows": rows, "forward": forward, "plans": plans})
    assert "## Temperature 0" in text and "## Temperature 1" in text
    assert "| chain | float32 | 20.00 | 1.50 | 0.50 0.25 | 4.00 | 2.00 | 1.00 |" in text
    assert "| chain | float32 | 20.00 | 1.50 | 0.50 0.25 | 4.00 | 2.00 | – |" in text
    assert "| 1 | 10.00 | 8.00 | 0.80 |" in text
    assert "| feature | float32 | 0 | 0.50 0.10 | 0.060 | 4 | 2 | 1.250 |" in text
    assert "specbound plan-tree --acceptance a.json" in text


def test_empty_or_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="non-empty"):
        run_bench({}, [[1]], 4)
    with pytest.raises(ValueError, match="rounds"):
        run_bench({RowKey("ar", "float32", 0.0): fake("ar", [])}, [[1]], 4, rounds=0)
    with pytest.raises(ValueError, match="done"):
        summarise([])
