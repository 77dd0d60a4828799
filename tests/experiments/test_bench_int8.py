"""Tests of the int8 benchmark's pieces on tiny models: the fidelity numbers against exact cases, the forward and
head timings' shape, the interleaved decoding rows, and argument checks."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from executor.quantize import quantize_model
from experiments.bench_int8 import main, measure_decoding, measure_fidelity, measure_forward
from tests.tiny_models import build_tiny_model


class ByteTokenizer:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [ord(c) % self.vocab_size for c in text]


def tiny_configs():
    base = build_tiny_model(3, vocab_size=16, max_seq_len=96)
    other = build_tiny_model(4, vocab_size=16, max_seq_len=96)
    return {
        "float32": base,
        "copy": copy.deepcopy(base),
        "other": other,
        "int8": quantize_model(copy.deepcopy(base)),
    }


def test_fidelity_is_exact_for_a_copy_and_measures_other_models():
    models = tiny_configs()
    result = measure_fidelity(models, ByteTokenizer(16), prompts=2, positions=20)
    assert result["positions"] == 40
    assert result["top1_agreement"]["copy"] == 1 and result["mean_tv"]["copy"] == 0
    # An unrelated model disagrees; the int8 copy of the float model is close but not equal.
    assert result["mean_tv"]["other"] > 0.1 and result["top1_agreement"]["other"] < 0.9
    assert 0 < result["mean_tv"]["int8"] < 0.05 and result["max_tv"]["int8"] >= result["mean_tv"]["int8"]
    assert measure_fidelity({"int8": models["int8"]}, ByteTokenizer(16), 1, 8) is None


def test_forward_times_have_one_row_per_config_and_size():
    models = tiny_configs()
    ticks = itertools.count()  # a clock that advances one second per reading: every call "takes" 1 s
    result = measure_forward(models, list(range(1, 12)), [1, 2, 4], repeats=2, clock=lambda: next(ticks))
    assert set(result) == set(models)
    for row in result.values():
        assert row["sizes"] == [1, 2, 4] and row["median_ms"] == [1000.0] * 3
        assert row["relative_to_t1"] == [1.0] * 3 and row["vs_float32"] == [1.0] * 3


def test_decoding_rows_are_ratios_to_plain_decoding_of_the_same_config():
    models = {"float32": build_tiny_model(3, vocab_size=16, max_seq_len=512)}
    models["int8"] = quantize_model(build_tiny_model(3, vocab_size=16, max_seq_len=512))
    result = measure_decoding(models, ByteTokenizer(16), prompts=1, max_new_tokens=6)
    rows = {(row["decoder"], row["config"]): row for row in result["rows"]}
    assert set(rows) == {(d, c) for d in ("ar", "chain-ngram") for c in ("float32", "int8")}
    assert rows[("ar", "int8")]["vs_ar_same_config"] == 1 and rows[("ar", "float32")]["vs_ar_float32"] == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--configs", "int4"], "--configs: unknown int4"),
        (["--sizes", "2,4"], "--sizes must start at 1"),
        (["--sizes", "a"], "--sizes must be comma-separated integers"),
    ],
)
def test_bad_arguments_exit_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_the_int8_head_is_a_copy_of_the_float_head():
    models = tiny_configs()
    head = models["int8"].quantized_head
    weight = models["float32"].tok_embeddings.weight
    assert (head.dequantized() - weight).abs().max() <= head.scales.float().max() / 2 + 1e-6
    assert torch.equal(models["int8"].tok_embeddings.weight, weight)
