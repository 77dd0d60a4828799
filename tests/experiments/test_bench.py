"""experiments.bench and `specbound bench`: interleaved, rotated runs; exact ratios; bad arguments named.

The engine is tested with fake runners (no model): each records its calls and reports fixed tokens and
seconds, so the order of the calls and every tokens/s ratio are known exactly.
"""

import pytest

from experiments.bench import render_markdown, run_bench, summarise
from experiments.cli import main


def test_runs_are_interleaved_rotated_and_summed():
    calls = []

    def runner(name, tokens, seconds):
        def run(prompt, max_new_tokens):
            calls.append((name, tuple(prompt), max_new_tokens))
            return tokens, seconds

        return run

    runners = {
        "hf-generate@float32": runner("hf", 10, 1.0),
        "ar@float32": runner("ar", 10, 2.0),
        "chain@float32": runner("chain", 10, 0.5),
    }
    totals = run_bench(runners, [[1], [2], [3]], 10)
    timed = [(name, prompt) for name, prompt, n in calls if n == 10]
    assert timed == [
        ("hf", (1,)),
        ("ar", (1,)),
        ("chain", (1,)),
        ("ar", (2,)),
        ("chain", (2,)),
        ("hf", (2,)),
        ("chain", (3,)),
        ("hf", (3,)),
        ("ar", (3,)),
    ]
    assert [c for c in calls if c[2] == 4] == [
        ("hf", (1,), 4),
        ("ar", (1,), 4),
        ("chain", (1,), 4),
    ]  # warm-up
    rows = {row["decoder"]: row for row in summarise(totals)}
    assert rows["chain"]["tokens"] == 30 and rows["chain"]["tokens_per_s"] == 20.0
    assert (
        rows["chain"]["vs_hf_generate"] == 2.0
        and rows["chain"]["vs_ar"] == 4.0
        and rows["ar"]["dtype"] == "float32"
    )
    text = render_markdown(
        {"settings": {"prompts": 3, "max_new_tokens": 10, "threads": 1}, "rows": list(rows.values())}
    )
    assert "| chain | float32 | 20.00 | 2.00 | 4.00 |" in text


def test_empty_inputs_are_refused():
    with pytest.raises(ValueError, match="non-empty"):
        run_bench({}, [[1]], 4)


@pytest.mark.parametrize(
    "extra, name",
    [
        (["--dtypes", "float16"], "--dtypes"),
        (["--prompts", "0"], "--prompts"),
        (["--exit-layer", "0"], "--exit-layer"),
    ],
)
def test_bad_arguments_exit_non_zero_naming_them(extra, name, tmp_path, capsys):
    assert main(["bench", *extra, "--out", str(tmp_path / "bench.json")]) == 2
    assert name in capsys.readouterr().err
