"""Tests of the tokenizer rebuilt from the GGUF vocabulary: against an independent llama.cpp-rule oracle,
round trips, special tokens, the chat template and bad input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.tokenizer import Tokenizer
from executor.weights import _gguf_metadata, _gguf_reader, default_model_path, load_tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return load_tokenizer()


# Characters that exercise every pre-tokenizer rule: letters, digits, contractions, punctuation, whitespace
# runs of every kind, accents, CJK, emoji (with a zero-width joiner).
texts = st.text(
    alphabet=st.sampled_from(list("ab Z019'sltmdv.,:;(){}_-+=\"#\t\n\r é日本😀\u200d👩ß")),
    max_size=40,
)


def test_ids_equal_llama_cpp_rule_oracle_on_corpus(tokenizer, smollm_reference_tokenizer, tokenizer_corpus):
    for text in tokenizer_corpus:
        assert tokenizer.encode(text) == smollm_reference_tokenizer.encode(text), text


@given(text=texts)
def test_ids_equal_llama_cpp_rule_oracle_on_random_text(tokenizer, smollm_reference_tokenizer, text):
    assert tokenizer.encode(text) == smollm_reference_tokenizer.encode(text)


def test_oracle_catches_a_tokenizer_without_digit_isolation(tokenizer, smollm_reference_tokenizer):
    # Negative control: the plain GPT-2 pre-tokenizer (no digit isolation) keeps "  " and the digit's space
    # apart, so the oracle comparison must fail on a whitespace run before a digit.
    metadata = _gguf_metadata(_gguf_reader(default_model_path()))
    plain = Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.pre": "gpt2"})
    text = "x  1\n\t\t42"
    assert plain.encode(text) != smollm_reference_tokenizer.encode(text) == tokenizer.encode(text)


@given(text=st.text(max_size=60))
def test_decode_inverts_encode_or_encode_refuses_a_missing_byte(tokenizer, text):
    if tokenizer.unencodable_bytes.intersection(text.encode("utf-8", "surrogatepass")):
        with pytest.raises(ValueError, match="cannot encode"):
            tokenizer.encode(text)
    else:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_smollm2_vocabulary_lacks_exactly_these_bytes(tokenizer):
    # Control characters absent from the training data, bytes never valid in UTF-8 (C0, C1, F5-FF), and the
    # lead bytes F1, F2 (code points U+40000-U+BFFFF).
    missing = {4, 6, 19, 20, 22, 29, 192, 193, 241, 242, *range(245, 256)}
    assert tokenizer.unencodable_bytes == missing
    with pytest.raises(ValueError, match="cannot encode"):
        tokenizer.encode("ok\x06")


def test_special_tokens_and_sizes(tokenizer):
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.vocab_size) == (1, 2, 49152)
    assert tokenizer.encode("<|im_start|>user<|im_end|>")[0] == 1
    assert tokenizer.encode("<|im_start|>user<|im_end|>")[-1] == 2
    assert tokenizer.decode([2]) == "<|im_end|>"
    assert tokenizer.encode("") == []


def test_chat_template_renders_smollm2_format(tokenizer):
    system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi!"}])
    assert (
        rendered
        == f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )
    own_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    assert tokenizer.apply_chat_template(own_system, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    )


def test_saved_tokenizer_json_reloads_identically(tokenizer, tokenizer_corpus, tmp_path):
    tokenizer.save(tmp_path)
    reloaded = Tokenizer.from_directory(tmp_path)
    assert (reloaded.bos_id, reloaded.eos_id, reloaded.chat_template) == (
        tokenizer.bos_id,
        tokenizer.eos_id,
        tokenizer.chat_template,
    )
    for text in tokenizer_corpus:
        assert reloaded.encode(text) == tokenizer.encode(text)


def test_bad_input_is_rejected(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="text"):
        tokenizer.encode(123)
    with pytest.raises(ValueError, match="ids"):
        tokenizer.decode([49152])
    with pytest.raises(ValueError, match="messages"):
        tokenizer.apply_chat_template("hello")
    with pytest.raises(ValueError, match="tokenizer.ggml.pre"):
        Tokenizer.from_gguf_metadata(
            {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.tokens": ["a"],
                "tokenizer.ggml.merges": [],
                "tokenizer.ggml.pre": "unknown-pre",
            }
        )
    with pytest.raises(ValueError, match="gpt2"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "llama"})
    with pytest.raises(ValueError, match="tokenizer.json"):
        Tokenizer.from_directory(tmp_path)
    with pytest.raises(ValueError, match="chat template"):
        Tokenizer(tokenizer.backend, bos_id=1, eos_id=2).apply_chat_template(
            [{"role": "user", "content": "x"}]
        )
