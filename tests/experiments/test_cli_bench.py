"""`specbound bench` end to end on a tiny random model and its transformers twin (seconds), and bad arguments.

The command's model loaders are the seams (:func:`experiments.bench_rows.load_target` and ``load_peer``): the
tiny llama model is ours, and transformers' ``LlamaForCausalLM`` reads the same weights from safetensors.
"""

import json

import pytest
import torch

from executor.weights import save_safetensors
from experiments import bench_rows
from experiments.cli import main
from tests.tiny_models import build_tiny_model

transformers = pytest.importorskip("transformers", reason="the bench's peer rows need transformers")


class Tokenizer:
    eos_token_id = 0

    def encode(self, text: str) -> list[int]:
        return [1 + ord(c) % 23 for c in text][:10]


@pytest.fixture
def tiny_models(monkeypatch, tmp_path):
    def load_target(dtype, config):
        return build_tiny_model(3, vocab_size=24, n_layers=3, max_seq_len=96).to(
            getattr(torch, dtype)
        ), Tokenizer()

    def load_peer(dtype, config):
        save_safetensors(build_tiny_model(3, vocab_size=24, n_layers=3, max_seq_len=96), tmp_path / "peer")
        peer = transformers.LlamaForCausalLM.from_pretrained(
            str(tmp_path / "peer"), dtype=getattr(torch, dtype)
        )
        return peer.eval(), Tokenizer()

    monkeypatch.setattr(bench_rows, "load_target", load_target)
    monkeypatch.setattr(bench_rows, "load_peer", load_peer)


def test_bench_writes_every_section_for_both_temperatures(tiny_models, tmp_path, capsys):
    out = tmp_path / "runs" / "bench.json"
    arguments = ["--prompts", "2", "--max-new-tokens", "5", "--dtypes", "float32", "--exit-layer", "1"]
    arguments += ["--drafters", "early-exit:1", "--context", "12", "--calibration-tokens", "4"]
    arguments += ["--latency-repeats", "1", "--plan-budget", "4", "--plan-width", "2", "--threads", "1"]
    arguments += ["--ns", "2", "--rows", "hf-*,ar,chain-early-exit,multidraft-*,plan-tree-*"]
    assert main(["bench", *arguments, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {(r["decoder"], r["temperature"]): r for r in result["rows"]}
    peers = ["hf-generate", "hf-prompt-lookup-k2", "hf-early-exit"]
    ours = ["ar", "chain-early-exit", "plan-tree-early-exit"]
    assert set(rows) == (
        {(name, t) for name in peers + ours for t in (0.0, 1.0)}
        | {("multidraft-argmax-n2-early-exit", 0.0)}
        | {(f"multidraft-{v}-n2-early-exit", 1.0) for v in ("rrs", "optimal")}
    )
    for (name, temperature), row in rows.items():
        assert row["tokens"] == 10 and row["tokens_per_s"] > 0 and row["vs_ar"] > 0
        assert (row["tau"] is None) == name.startswith("hf-")
        if temperature == 0:  # transformers' greedy decoding of the same weights, and our greedy decoders
            assert row["agrees_with_ar"] == 1.0, name
            # Our decoders are checked for divergences at ties (none here); transformers' rows are not.
            expected = None if name.startswith("hf-") or name == "ar" else 1.0
            assert row["agrees_with_ar_up_to_ties"] == expected, name
    assert len(result["plans"]) == 2 and [r["n"] for r in result["forward"]] == [1, 2, 4]
    markdown = (tmp_path / "runs" / "bench.md").read_text()
    assert "## Temperature 0" in markdown and "## Temperature 1" in markdown and "plan-tree" in markdown
    assert not (tmp_path / "runs" / "bench.partial.json").exists()
    assert "| plan-tree-early-exit | float32 |" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, name",
    [
        (["--dtypes", "float16"], "--dtypes"),
        (["--prompts", "0"], "--prompts"),
        (["--rounds", "0"], "--rounds"),
        (["--exit-layer", "0"], "--exit-layer"),
        (["--temperatures", "0,-1"], "--temperatures"),
        (["--temperatures", "zero"], "--temperatures"),
        (["--ns", "1"], "--ns"),
        (["--verifiers", "rrs,unknown"], "--verifiers"),
        (["--prompt-set", "other", "--prompts", "9"], "count"),
    ],
)
def test_bad_arguments_exit_non_zero_naming_them(extra, name, tmp_path, capsys):
    assert main(["bench", *extra, "--out", str(tmp_path / "bench.json")]) == 2
    assert name in capsys.readouterr().err


def test_rows_matching_nothing_exit_non_zero(tiny_models, tmp_path, capsys):
    arguments = ["--prompts", "1", "--dtypes", "float32", "--exit-layer", "1", "--drafters", "early-exit:1"]
    arguments += [
        "--context",
        "12",
        "--calibration-tokens",
        "2",
        "--latency-repeats",
        "1",
        "--plan-budget",
        "2",
    ]
    assert main(["bench", *arguments, "--rows", "nothing*", "--out", str(tmp_path / "bench.json")]) == 2
    assert "--rows" in capsys.readouterr().err
