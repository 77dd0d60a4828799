"""Intermediate-layer hidden states added to a feature cache, only for the layers a head needs.

The exit heads (``exit:K``) and Kangaroo's adapter (``kangaroo:K``) read the target's hidden state after its
first ``K`` layers, which :mod:`executor.training.features` does not store (it keeps the final hidden states,
from which the target's distribution ``p`` is recomputed). This module adds, next to each shard
``split-NNNNN.safetensors`` of a finished feature cache, one file ``split-NNNNN.layer-KK.safetensors`` per
requested layer holding ``hidden`` ``(n, T, d)`` in the cache's storage dtype, computed from the shard's own
tokens by running only the first ``max(K)`` layers (no LM head): the cost is ``max(K) / n_layers`` of the
first prefill and the memory ``n T d`` storage-dtype numbers per layer (SmolLM2-135M, 65,536 training tokens,
bfloat16: 75 MB per layer; only requested layers are ever computed, loaded or kept).

Files are written atomically, so an interrupted run resumes at the first missing one; layers already present
are not recomputed when another layer is requested later.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from executor.files import write_bytes
from executor.training.features import MANIFEST

__all__ = ["add_layer_features", "load_layer_features", "shallow_forward"]


def _layer_path(directory: Path, split: str, index: int, layer: int) -> Path:
    return directory / f"{split}-{index:05d}.layer-{layer:02d}.safetensors"


def shallow_forward(target, tokens: torch.Tensor, layers: list[int]) -> dict[int, torch.Tensor]:
    """Hidden states ``(B, T, d)`` after each of ``layers`` (counts of layers run), for a causal batch from
    slot 0, running only the first ``max(layers)`` decoder layers (the target's K/V cache is overwritten)."""
    device = target.tok_embeddings.weight.device
    batch, length = tokens.shape
    target.setup_cache(length, batch_size=batch)
    slots = torch.arange(length, device=device)
    cos, sin = target._rope(slots)
    x = target.tok_embeddings(tokens.to(device))
    n_slots, mask = target._additive_mask(slots, None, x.dtype)
    out = {}
    for index, layer in enumerate(target.layers[: max(layers)], start=1):
        x = layer(x, cos, sin, slots, mask, n_slots)
        if index in layers:
            out[index] = x
    return out


def _check_layers(target, layers) -> list[int]:
    layers = sorted(set(layers))
    n_layers = target.config.n_layers
    if not layers or any(
        isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < n_layers for k in layers
    ):
        raise ValueError(
            f"layers must be integers in [1, {n_layers}) (layers run before the exit), got {layers}"
        )
    return layers


def add_layer_features(
    target, directory: str | Path, layers, *, batch_size: int = 4, progress: bool = True
) -> Path:
    """Write the hidden states after each of ``layers`` for every shard of the finished cache ``directory``."""
    from safetensors.torch import load_file, save
    from tqdm import tqdm

    directory = Path(directory)
    if not (directory / MANIFEST).is_file():
        raise ValueError(f"feature cache {str(directory)!r} is incomplete (no {MANIFEST}); build it first")
    layers = _check_layers(target, layers)
    manifest = json.loads((directory / MANIFEST).read_text())
    storage = getattr(torch, manifest["storage_dtype"].removeprefix("torch."))
    work = [
        (split, index, [k for k in layers if not _layer_path(directory, split, index, k).is_file()])
        for split, info in manifest["splits"].items()
        for index in range(info["shards"])
    ]
    work = [item for item in work if item[2]]
    total = sum(len(load_file(str(directory / f"{s}-{i:05d}.safetensors"))["tokens"]) for s, i, _ in work)
    with tqdm(total=total, unit="chunk", desc=f"layer features {layers}", disable=not progress) as bar:
        for split, index, missing in work:
            tokens = load_file(str(directory / f"{split}-{index:05d}.safetensors"))["tokens"]
            rows: dict[int, list[torch.Tensor]] = {k: [] for k in missing}
            with torch.no_grad():
                for start in range(0, len(tokens), batch_size):
                    hidden = shallow_forward(target, tokens[start : start + batch_size], missing)
                    for k in missing:
                        rows[k].append(hidden[k].to("cpu", storage))
                    bar.update(min(batch_size, len(tokens) - start))
            for k in missing:
                data = save({"hidden": torch.cat(rows[k]).contiguous()})
                write_bytes(data, _layer_path(directory, split, index, k))
    return directory


def load_layer_features(directory: str | Path, split: str, layer: int) -> torch.Tensor:
    """The hidden states after ``layer`` layers for every chunk of ``split``, ``(n, T, d)``."""
    from safetensors.torch import load_file

    directory = Path(directory)
    manifest = json.loads((directory / MANIFEST).read_text())
    if split not in manifest["splits"]:
        raise ValueError(f"feature cache {str(directory)!r} has no split {split!r}")
    paths = [_layer_path(directory, split, i, layer) for i in range(manifest["splits"][split]["shards"])]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ValueError(
            f"feature cache {str(directory)!r} lacks layer-{layer} features ({missing[0]}); "
            "run add_layer_features first"
        )
    return torch.cat([load_file(str(p))["hidden"] for p in paths])
