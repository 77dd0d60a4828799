"""Peer implementations for fidelity tests and benchmarks: the same GGUF model loaded by ``transformers``.

``transformers`` (with ``gguf`` and ``accelerate``) is an optional extra (``specbound[peer]``), imported
only here and only when called. It dequantizes the GGUF file itself: an independent reading of the weights.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["load_transformers_model"]


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

    from executor.weights import default_model_path

    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise ValueError("transformers is not installed; run: pip install 'specbound[peer]'") from None
    path = Path(default_model_path() if path is None else path)
    if not path.is_file():
        raise ValueError(f"path {str(path)!r} is not a file")
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=dtype or torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tokenizer
