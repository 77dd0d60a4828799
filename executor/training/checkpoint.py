"""Drafter checkpoints: safetensors weights plus a JSON card, stored atomically under the user cache directory.

A checkpoint is a directory holding ``weights.safetensors`` and ``card.json``. The card records what the
weights are for and how good they are::

    {"format": 1, "kind": "feature", "target": {"hash": ..., "vocab_size": ..., "vocab_hash": ...},
     "config": {...}, "corpus": {...}, "steps": ..., "tokens": ..., "seconds": ...,
     "held_out": {"top1": ..., "sum_min": ..., "kl": ..., "tokens": ...},  # at T = 1, first drafted position
     "weights_sha256": ...}

Loading checks, in this order, with a ``ValueError`` that says which: both files exist; the card parses and has
format 1; the weights file's sha256 equals the card's (a truncated or corrupted file never loads); the target
model's hash and vocabulary size equal the card's (a head trained for another model would draft nonsense).

The default location is ``$XDG_CACHE_HOME/specbound/drafters/<key>/`` (``~/.cache`` when the variable is unset),
where ``<key>`` names the kind, the target's hash and the training configuration (:func:`checkpoint_key`).
"""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from pathlib import Path

import torch

from executor.files import write_bytes
from executor.products import tensor_key

__all__ = [
    "CARD_NAME",
    "WEIGHTS_NAME",
    "cache_root",
    "checkpoint_key",
    "default_checkpoint_dir",
    "load_checkpoint",
    "model_fingerprint",
    "save_checkpoint",
]

CARD_NAME = "card.json"
_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (tensors' key, fingerprint)
WEIGHTS_NAME = "weights.safetensors"
FORMAT = 1


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/specbound`` (default ``~/.cache/specbound``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specbound"


def model_fingerprint(model) -> dict:
    """Identify a target model independently of its dtype and device.

    ``hash`` = sha256 over the config and, for every parameter in name order, its name, shape and every
    997th entry rounded to bfloat16 (so a float32 and a bfloat16 copy of the same weights agree);
    ``vocab_size`` from the config. A quantised model (:mod:`executor.quantize`) answers with the fingerprint
    of the float weights it was made from, so that drafters trained for them serve it too.
    """
    if getattr(model, "source_fingerprint", None) is not None:
        return dict(model.source_fingerprint)
    config = repr(sorted(vars(model.config).items()))
    # The hash reads the whole state dict (~30 ms for SmolLM2, whose fused weights are split and copied), and
    # loading one drafter asked for it three times; kept per model until a tensor is replaced or changed.
    key = (
        config,
        *((tensor_key(t), t.dtype) for t in (*model.parameters(), *model.buffers())),
    )
    cached = _FINGERPRINTS.get(model)
    if cached is not None and cached[0] == key:
        return dict(cached[1])
    digest = hashlib.sha256(config.encode())
    for name, parameter in sorted(model.state_dict().items()):
        sample = parameter.detach().reshape(-1)[::997].to("cpu", torch.bfloat16).view(torch.int16)
        digest.update(name.encode() + str(tuple(parameter.shape)).encode() + sample.numpy().tobytes())
    fingerprint = {"hash": digest.hexdigest(), "vocab_size": int(model.config.vocab_size)}
    _FINGERPRINTS[model] = (key, fingerprint)
    return dict(fingerprint)


def checkpoint_key(kind: str, fingerprint: dict, config: dict) -> str:
    """``<kind>-<target hash[:12]>-<sha256(config)[:10]>``: one cache entry per kind, target and recipe."""
    recipe = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:10]
    return f"{kind.replace(':', '_')}-{fingerprint['hash'][:12]}-{recipe}"


def default_checkpoint_dir(kind: str, fingerprint: dict, config: dict) -> Path:
    return cache_root() / "drafters" / checkpoint_key(kind, fingerprint, config)


def save_checkpoint(directory: str | Path, tensors: dict[str, torch.Tensor], card: dict) -> Path:
    """Write ``weights.safetensors`` then ``card.json`` (with the weights' sha256), each atomically."""
    from safetensors.torch import save

    directory = Path(directory)
    data = save({name: t.detach().to("cpu").contiguous() for name, t in tensors.items()})
    card = {**card, "format": FORMAT, "weights_sha256": hashlib.sha256(data).hexdigest()}
    write_bytes(data, directory / WEIGHTS_NAME)
    write_bytes(json.dumps(card, indent=2, sort_keys=True).encode(), directory / CARD_NAME)
    return directory


def read_card(directory: str | Path) -> dict:
    """The card of a checkpoint directory; ``ValueError`` if missing or unreadable."""
    path = Path(directory) / CARD_NAME
    if not path.is_file():
        raise ValueError(f"checkpoint {str(directory)!r} has no {CARD_NAME}")
    try:
        card = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"checkpoint card {str(path)!r} is corrupt: {error}") from None
    if not isinstance(card, dict) or card.get("format") != FORMAT:
        raise ValueError(f"checkpoint card {str(path)!r} is not a format-{FORMAT} specbound drafter card")
    return card


def load_checkpoint(directory: str | Path, *, target=None, kind: str | None = None):
    """``(tensors, card)`` of a checkpoint, after the integrity and compatibility checks above."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"checkpoint {str(directory)!r} is not a directory")
    card = read_card(directory)
    weights = directory / WEIGHTS_NAME
    if not weights.is_file():
        raise ValueError(f"checkpoint {str(directory)!r} has no {WEIGHTS_NAME}")
    data = weights.read_bytes()
    if hashlib.sha256(data).hexdigest() != card.get("weights_sha256"):
        raise ValueError(
            f"checkpoint weights {str(weights)!r} are truncated or corrupt (sha256 differs from the card's); "
            "delete the directory and train again"
        )
    try:
        tensors = load(data)
    except (SafetensorError, ValueError) as error:
        raise ValueError(f"checkpoint weights {str(weights)!r} cannot be read: {error}") from None
    if kind is not None and card.get("kind") != kind:
        raise ValueError(f"checkpoint {str(directory)!r} is a {card.get('kind')!r} drafter, not {kind!r}")
    if target is not None:
        fingerprint = model_fingerprint(target)
        expected = card.get("target", {})
        if expected.get("vocab_size") != fingerprint["vocab_size"]:
            raise ValueError(
                f"checkpoint {str(directory)!r} was trained for a vocabulary of {expected.get('vocab_size')} "
                f"tokens but the target has {fingerprint['vocab_size']}"
            )
        if expected.get("hash") != fingerprint["hash"]:
            raise ValueError(
                f"checkpoint {str(directory)!r} was trained for another target model (hash "
                f"{str(expected.get('hash'))[:12]}, this target is {fingerprint['hash'][:12]}); "
                "train a drafter for this model with `specbound train-drafter`"
            )
    return tensors, card
