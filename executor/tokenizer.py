"""Byte-level BPE tokenizers rebuilt from a GGUF file's vocabulary, or read from a ``tokenizer.json``.

A GGUF file stores no ``tokenizer.json``: it keeps the vocabulary (``tokenizer.ggml.tokens``), the merges
(``tokenizer.ggml.merges``), the token types (3 = control, i.e. special), the BOS/EOS ids, the name of the
pre-tokenizer (``tokenizer.ggml.pre``) and the chat template (``tokenizer.chat_template``). From those we
build a :class:`tokenizers.Tokenizer`: byte-level BPE (Sennrich et al., ACL 2016, arXiv 1508.07909; the GPT-2
byte alphabet of Radford et al., 2019) with the pre-tokenization llama.cpp assigns to that name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

__all__ = ["Tokenizer"]

#: GGUF token type of control (special) tokens such as ``<|im_start|>`` (llama.cpp's TOKEN_TYPE_CONTROL).
CONTROL_TOKEN_TYPE = 3

#: Pre-tokenizers by GGUF ``tokenizer.ggml.pre`` name. The GPT-2 split regex comes first in every one;
#: "smollm" (like "starcoder") also isolates every digit, as llama.cpp's ``llama-vocab.cpp`` does with the
#: extra regex ``\p{N}`` -- SmolLM2's vocabulary has no multi-digit token, since its BPE was learned that way.
_DIGIT_SPLITTING = ("smollm", "starcoder", "refact", "codeshell")


def _gguf_pre_tokenizer(name: str | None) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name in _DIGIT_SPLITTING:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if name in (None, "default", "gpt2", "gpt-2"):
        return byte_level
    raise ValueError(
        f"tokenizer.ggml.pre {name!r} is not supported; supported: "
        f"{', '.join(sorted({'gpt2', 'default', *_DIGIT_SPLITTING}))}"
    )


class Tokenizer:
    """Text <-> token ids for a llama-family model, with its chat template.

    Parameters
    ----------
    backend : tokenizers.Tokenizer
        The Hugging Face ``tokenizers`` object that does the work.
    bos_id, eos_id : int or None
        Beginning- and end-of-sequence token ids.
    chat_template : str or None
        Jinja template rendering a list of ``{"role", "content"}`` messages (Hugging Face convention).
    add_bos : bool
        Prepend ``bos_id`` in :meth:`encode` (SmolLM2: no).
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_id: int | None,
        eos_id: int | None,
        chat_template: str | None = None,
        add_bos: bool = False,
    ) -> None:
        self.backend = backend
        self.unencodable_bytes = _bytes_without_token(backend)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.chat_template = chat_template
        self.add_bos = add_bos

    @property
    def vocab_size(self) -> int:
        """Number of token ids, special tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings such as ``<|im_start|>`` become their single id."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        # The BPE would silently drop a byte that has no token; refuse instead (SmolLM2 lacks a few control
        # characters, e.g. "\x06", and the UTF-8 lead bytes of code points above U+3FFFF).
        if self.unencodable_bytes.intersection(text.encode("utf-8", "surrogatepass")):
            # Added tokens are matched whole, so only the text outside them matters.
            rest = text
            for added in self.backend.get_added_tokens_decoder().values():
                rest = rest.replace(added.content, "")
            for character in rest:
                if self.unencodable_bytes.intersection(character.encode("utf-8", "surrogatepass")):
                    raise ValueError(f"text contains {character!r}, which this vocabulary cannot encode")
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if self.add_bos and self.bos_id is not None else ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens written out (decoding is the inverse of :meth:`encode`)."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"ids must lie in [0, {self.vocab_size}), got {bad[0]}")
        return self.backend.decode(ids, skip_special_tokens=False)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """Render ``messages`` with the model's chat template (Jinja, as Hugging Face renders it)."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        if isinstance(messages, (str, Mapping)) or not all(
            isinstance(m, Mapping) and {"role", "content"} <= set(m) for m in messages
        ):
            raise ValueError("messages must be a list of mappings with 'role' and 'content'")
        return _compile_template(self.chat_template).render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self._token(self.bos_id),
            eos_token=self._token(self.eos_id),
        )

    def _token(self, token_id: int | None) -> str:
        return "" if token_id is None else self.backend.id_to_token(token_id)

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, object]) -> Tokenizer:
        """Build the tokenizer described by a GGUF file's decoded ``tokenizer.*`` metadata."""
        model = metadata.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"only byte-level BPE GGUF tokenizers ('gpt2') are supported, got {model!r}")
        if "tokenizer.ggml.tokens" not in metadata:
            raise ValueError("metadata lacks tokenizer.ggml.tokens (the vocabulary)")
        tokens = list(metadata["tokenizer.ggml.tokens"])
        merges = [tuple(merge.split(" ", 1)) for merge in metadata.get("tokenizer.ggml.merges") or ()]
        backend = tokenizers.Tokenizer(
            models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges, fuse_unk=False)
        )
        backend.pre_tokenizer = _gguf_pre_tokenizer(metadata.get("tokenizer.ggml.pre"))
        backend.decoder = decoders.ByteLevel()
        types = metadata.get("tokenizer.ggml.token_type") or ()
        special = [token for token, kind in zip(tokens, types, strict=False) if kind == CONTROL_TOKEN_TYPE]
        # normalized=False: match the literal text, as llama.cpp does for control tokens.
        backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in special])
        return cls(
            backend,
            bos_id=metadata.get("tokenizer.ggml.bos_token_id"),
            eos_id=metadata.get("tokenizer.ggml.eos_token_id"),
            chat_template=metadata.get("tokenizer.chat_template"),
            add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        )

    @classmethod
    def from_directory(cls, directory: str | Path) -> Tokenizer:
        """Load ``tokenizer.json`` (and ``tokenizer_config.json`` for BOS/EOS and the chat template)."""
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"directory {str(directory)!r} has no tokenizer.json")
        backend = tokenizers.Tokenizer.from_file(str(path))
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}

        def token_id(key: str) -> int | None:
            token = config.get(key)
            token = token.get("content") if isinstance(token, dict) else token
            return None if token is None else backend.token_to_id(token)

        return cls(
            backend,
            bos_id=token_id("bos_token"),
            eos_id=token_id("eos_token"),
            chat_template=config.get("chat_template"),
            add_bos=bool(config.get("add_bos_token", False)),
        )

    def save(self, directory: str | Path) -> None:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` (Hugging Face layout) into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(directory / "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self._token(self.bos_id) or None,
            "eos_token": self._token(self.eos_id) or None,
            "add_bos_token": self.add_bos,
            "chat_template": self.chat_template,
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))


def _bytes_without_token(backend: tokenizers.Tokenizer) -> frozenset[int]:
    """Bytes whose GPT-2 alphabet character is not a token (only for byte-level vocabularies, else empty)."""
    if not isinstance(backend.decoder, decoders.ByteLevel):
        return frozenset()
    vocab = backend.get_vocab()
    # GPT-2's byte -> character table (Radford et al., 2019, encoder.py ``bytes_to_unicode``).
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    shifted = iter(range(256, 512))
    spelling = {b: chr(b if b in printable else next(shifted)) for b in range(256)}
    return frozenset(b for b, character in spelling.items() if character not in vocab)


def _compile_template(source: str):
    # jinja2 ships with torch. The sandbox and block trimming match transformers' chat-template rendering.
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ValueError(f"chat template: {message}")

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = raise_exception
    return environment.from_string(source)
