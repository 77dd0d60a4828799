"""Fidelity against ``transformers``: the same GGUF file read by transformers' own GGUF loader, and our
safetensors export read by ``LlamaForCausalLM``. ``transformers`` is a test extra, not a run-time dependency.
"""

from __future__ import annotations

import pytest
import regex
import torch

from executor.weights import load_model, save_safetensors

transformers = pytest.importorskip(
    "transformers", reason="fidelity tests need the 'peer' extra (transformers)"
)

# transformers builds the GGUF "smollm" tokenizer with the plain GPT-2 split; llama.cpp also isolates every
# numeric character (\p{N}), as SmolLM2's BPE was trained (its vocabulary has no token joining a numeral to
# anything). The two differ only where whitespace would join a numeral: two or more whitespace characters
# before it ("x  1"), or a space before a non-ASCII numeral (" ½"). We follow llama.cpp; test_tokenizer.py
# checks that against an independent oracle.
WHITESPACE_BEFORE_NUMERAL = regex.compile(r"\s\s\p{N}| (?![0-9])\p{N}")


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def our_logits(model, ids: list[int]) -> torch.Tensor:
    model.setup_cache(len(ids))
    with torch.no_grad():
        return model(torch.tensor([ids]), torch.arange(len(ids)))


# Two fixtures, not one (model, tokenizer) pair: under `--dist worksteal` the two tests that use them may run on
# different workers, each then loading what it uses only (the model takes ~21 s, the tokenizer ~8 s).
@pytest.fixture(scope="module")
def peer_model():
    """transformers' reading of the embedded GGUF file's model."""
    from experiments.peers import load_transformers_model

    return load_transformers_model()[0]


@pytest.fixture(scope="module")
def peer_tokenizer():
    """transformers' reading of the embedded GGUF file's tokenizer."""
    from experiments.peers import load_transformers_tokenizer

    return load_transformers_tokenizer()


@pytest.mark.slow
def test_logits_equal_transformers_gguf_loading(smollm, peer_model):
    from experiments.prompts import humaneval_prompts

    model, tokenizer = smollm
    prompts = [
        humaneval_prompts(1)[0],
        tokenizer.apply_chat_template([{"role": "user", "content": "Write a haiku about the sea."}]),
        "Ünïcødé: 日本語, emoji 😀, tabs\t\tand  spaces.",
    ]
    for prompt in prompts:
        ids = tokenizer.encode(prompt)
        difference = (our_logits(model, ids) - hf_logits(peer_model, ids)).abs().max()
        assert difference <= 1e-3, prompt


@pytest.mark.slow
def test_token_ids_equal_transformers_tokenizer(
    smollm, peer_tokenizer, tokenizer_corpus, smollm_reference_tokenizer
):
    _, tokenizer = smollm
    for text in tokenizer_corpus:
        theirs = peer_tokenizer(text, add_special_tokens=False)["input_ids"]
        if WHITESPACE_BEFORE_NUMERAL.search(text):
            # The documented divergence: ours is llama.cpp's split (the oracle), transformers' is not.
            assert tokenizer.encode(text) == smollm_reference_tokenizer.encode(text) != theirs, text
        else:
            assert tokenizer.encode(text) == theirs, text


@pytest.mark.slow
def test_safetensors_export_loads_identically_here_and_in_transformers(smollm, tmp_path):
    model, tokenizer = smollm
    save_safetensors(model, tmp_path, tokenizer)
    ours, our_tokenizer = load_model(tmp_path, device="cpu", dtype=torch.float32)
    theirs = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    ids = tokenizer.encode("def add(a, b):\n    return")
    expected = our_logits(model, ids)
    torch.testing.assert_close(our_logits(ours, ids), expected, atol=0, rtol=0)
    assert (hf_logits(theirs, ids) - expected).abs().max() <= 1e-4
    assert our_tokenizer.encode("x = 1  # ok") == tokenizer.encode("x = 1  # ok")


@pytest.mark.parametrize(
    "overrides",
    [{}, {"n_kv_heads": 1, "tie_embeddings": False}, {"n_kv_heads": 4, "n_layers": 3, "rope_theta": 500.0}],
)
def test_tiny_models_match_transformers_llama(tiny_model, tmp_path, overrides):
    # An independent implementation of the architecture: transformers' LlamaForCausalLM on our weights.
    model = tiny_model(13, vocab_size=16, **overrides)
    save_safetensors(model, tmp_path)
    theirs = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    ids = [3, 14, 15, 9, 2, 6, 5, 3, 5, 8, 9, 7]
    assert (hf_logits(theirs, ids) - our_logits(model, ids)).abs().max() <= 1e-4
