"""Shared fixtures of the executor tests: random tiny llama models and the embedded SmolLM2 model.

``tiny_model(...)`` builds a random 2-layer llama model with a vocabulary of 8-16 tokens whose logits are
far from uniform (weights drawn with unit-scale embeddings), so that verifiers see interesting distributions.
``smollm`` loads the embedded SmolLM2-135M-Instruct once per session: ``(model, tokenizer)``. It is shared,
so a test must call ``model.setup_cache(...)`` itself before its first forward.
"""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import build_tiny_model
from tests.tokenizer_oracle import LlamaCppSmolLMTokenizer


@pytest.fixture(scope="session")
def tiny_model():
    """Factory ``tiny_model(seed=0, **config_overrides) -> Transformer`` (see :func:`build_tiny_model`)."""
    return build_tiny_model


@pytest.fixture(scope="session")
def smollm():
    """The embedded SmolLM2-135M-Instruct as ``(model, tokenizer)`` in float32 on the CPU, loaded once."""
    from executor.weights import load_model

    return load_model(device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def smollm_reference_tokenizer():
    """:class:`LlamaCppSmolLMTokenizer` over the embedded GGUF file's vocabulary and merges."""
    from executor.weights import _gguf_metadata, _gguf_reader, default_model_path

    metadata = _gguf_metadata(_gguf_reader(default_model_path()))
    tokens = list(metadata["tokenizer.ggml.tokens"])
    special = [t for t, kind in zip(tokens, metadata["tokenizer.ggml.token_type"], strict=True) if kind == 3]
    return LlamaCppSmolLMTokenizer(tokens, list(metadata["tokenizer.ggml.merges"]), special)


@pytest.fixture(scope="session")
def tokenizer_corpus() -> list[str]:
    """Text with code, Unicode (CJK, emoji, accents, combining marks), whitespace runs, newlines, tabs."""
    return [
        "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
        'for (int i = 0; i < 10; ++i) {\n\tprintf("%d\\n", i);\n}\n',
        "import numpy as np\n\n\nx = np.arange(12).reshape(3, 4)  # comment\r\n",
        "The café's naïve façade — “quoted” ‘text’ … ½ × ÷ ±",
        "日本語のテキストと中文文本，한국어 텍스트。",
        "Emoji: 😀🎉👩‍💻🇫🇷 and ❤️ (with variation selector)",
        "Combining: e\u0301 a\u0308 n\u0303; Greek αβγ Δ; Cyrillic Привет мир",
        "    leading spaces, trailing spaces    ",
        "tabs\t\tand\t\t\tmore\ttabs\n\n\n\nnew   lines  \n  \t \n",
        "numbers: 3.14159, 1e-10, 0x1F, 1,000,000 and 2024-06-01",
        "x  1\n\t\t42  foo   7",
        "<|im_start|>user\nWrite a function.<|im_end|>\n<|im_start|>assistant\n",
        "I'm sure they'll say we've done it, isn't it? You'd think so. HELLO World",
        "",
        " ",
        "\n",
    ]
