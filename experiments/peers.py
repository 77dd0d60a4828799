"""Peer implementations for fidelity tests and benchmarks: the same GGUF model loaded by ``transformers``.

``transformers`` (with ``gguf`` and ``accelerate``) is an optional extra (``specbound[peer]``), imported
only here and only when called. It dequantizes the GGUF file itself: an independent reading of the weights.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["load_transformers_model", "load_transformers_tokenizer"]


def load_transformers_model(path: str | Path | None = None, *, dtype=None):
    """Load a llama GGUF file with ``transformers``: ``(model, tokenizer)``, model in eval mode on the CPU.

    Parameters
    ----------
    path : str or Path, optional
        The ``.gguf`` file; default the embedded SmolLM2-135M-Instruct
        (:func:`executor.weights.default_model_path`).
    dtype : torch.dtype, optional
        Default float32.

    Raises
    ------
    ValueError
        If ``transformers`` is not installed (it names the install command).
    """
    import torch

    path = _gguf_path(path)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=dtype or torch.float32
    )
    return model.eval(), load_transformers_tokenizer(path)


def load_transformers_tokenizer(path: str | Path | None = None):
    """``transformers``' tokenizer of a llama GGUF file (default the embedded one), without its model: about a
    third of :func:`load_transformers_model`'s time. ``ValueError`` as there."""
    path = _gguf_path(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _gguf_path(path) -> Path:
    """``path`` (default the embedded model) checked to be a file, after checking ``transformers`` imports."""
    from executor.weights import default_model_path

    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ValueError("transformers is not installed; run: pip install 'specbound[peer]'") from None
    path = Path(default_model_path() if path is None else path)
    if not path.is_file():
        raise ValueError(f"path {str(path)!r} is not a file")
    return path
