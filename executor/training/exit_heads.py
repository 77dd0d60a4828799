"""Training exit heads (``exit:K``, several layers in one job) and Kangaroo's adapter (``kangaroo:K``).

Both learn from the cached target features (:mod:`executor.training.features`) plus the layer-``K`` hidden
states added for the requested layers only (:mod:`executor.training.layer_features`). The target's
distribution at position ``t`` is recomputed from its cached final hidden state, and the head at layer ``K``
reads :math:`h_{K,t}` (for Kangaroo, :math:`h_{K,\\le t}`) to predict it, so no shifting is involved.

Recipe (the feature kind's, :mod:`executor.training.trainer`): the projection ``fc`` starts at the ridge
solution of the target's RMS-normalised final feature on ``[RMSNorm(h_K), 1]`` (Kangaroo's attention branch
starts at zero, so the adapter starts as the ridge-fitted exit head), then AdamW minimises KL(p' || q) at
T = 1 on the draft vocabulary (:func:`executor.training.loop.run_budgeted`). Kangaroo's paper trains its adapter
by the same soft cross-entropy (Liu et al., NeurIPS 2024, arXiv 2404.18911, ``train.py``).

* ``exit:K1,K2,...`` trains one head per layer **in one job**: every step draws one batch of positions and sums
  the heads' losses (the target's ``p`` is computed once per batch), within one time budget. Exit heads are
  position-wise, so a batch is ``exit_rows`` positions drawn uniformly from all training positions. Each head
  is saved as its own ``exit:K`` checkpoint (so ``--drafter exit:K`` and DEL find each one by kind).
* ``kangaroo:K`` trains on ``batch_size`` random windows of ``window`` consecutive positions (attention needs
  the context; the adapter's cache is set up per window).

Held-out figures: every position of the held-out chunks, teacher-forced on the target's exact layer-``K``
states, with the full-vocabulary ``p`` (as the feature kind).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from executor.drafters.exit_head import ExitHead
from executor.training.features import FeatureSet, target_logits
from executor.training.layer_features import add_layer_features, load_layer_features
from executor.training.loop import agreement_sums, finish_checkpoint, ridge_solve, run_budgeted
from executor.training.trainer import TrainConfig, choose_vocab

__all__ = [
    "ExitTrainConfig",
    "LayerData",
    "evaluate_exit_head",
    "parse_kind",
    "train_exit_heads",
    "train_layer_kind",
]


@dataclass(frozen=True)
class ExitTrainConfig(TrainConfig):
    """:class:`executor.training.trainer.TrainConfig` plus the batch shapes of these kinds: ``exit_rows``
    positions per step for exit heads, ``batch_size`` windows of ``window`` positions for Kangaroo."""

    exit_rows: int = 1024
    window: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("exit_rows", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"{name} must be an integer >= 2, got {value!r}")


def parse_kind(kind: str, n_layers: int) -> tuple[str, list[int]]:
    """``"exit:6,12"`` -> ``("exit", [6, 12])``; ``"kangaroo:2"`` -> ``("kangaroo", [2])``.

    Layers are integers in ``[1, n_layers)``; Kangaroo takes exactly one.
    """
    family, _, argument = kind.partition(":")
    if family not in ("exit", "kangaroo"):
        raise ValueError(f"kind must be 'exit:K[,K...]' or 'kangaroo:K', got {kind!r}")
    parts = argument.split(",") if argument else []
    if not parts or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"kind {kind!r} needs integer layers K, e.g. '{family}:6'")
    layers = sorted({int(p) for p in parts})
    if not all(1 <= k < n_layers for k in layers):
        raise ValueError(f"kind {kind!r}: layers must lie in [1, {n_layers}) (layers run before the head)")
    if family == "kangaroo" and len(layers) != 1:
        raise ValueError(f"kind {kind!r}: Kangaroo's adapter sits at one layer; train one kind per layer")
    return family, layers


@dataclass
class LayerData:
    """One split: the :class:`FeatureSet` (tokens, final hidden states) and ``layers[K]`` ``(n, T, d)``."""

    features: FeatureSet
    layers: dict[int, torch.Tensor]


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)


def ridge_init_exit(head: ExitHead, data: LayerData, rows: int, ridge: float, generator) -> float:
    """Set ``head.fc`` to the ridge map from ``RMSNorm(h_K)`` to the RMS-normalised final hidden state."""
    hidden = data.layers[head.layer]
    flat = hidden.reshape(-1, hidden.shape[-1])
    index = torch.randperm(flat.shape[0], generator=generator)[:rows]
    with torch.no_grad():
        x = head.norm(flat[index].float())
        y = _rms(data.features.hidden.reshape(-1, hidden.shape[-1])[index].float())
        weight, bias, r2 = ridge_solve(x, y, ridge)
        head.fc.weight.copy_(weight)
        head.fc.bias.copy_(bias)
    return r2


def _run(head: ExitHead, target, hidden: torch.Tensor) -> torch.Tensor:
    """Features ``z`` for a batch of full sequences ``(B, T, d)`` (causal attention for Kangaroo)."""
    if not head.has_attention:
        return head(target, hidden)
    batch, length, _ = hidden.shape
    head.setup_cache(length, batch)
    slots = torch.arange(length)
    return head(target, hidden, slots, slots, slots <= slots[:, None])


def evaluate_exit_head(head: ExitHead, target, held_out: LayerData, max_chunks: int | None = None) -> dict:
    """Held-out ``top1``, ``sum_min``, ``kl`` per position and the number of ``tokens``."""
    totals = {"top1": 0.0, "sum_min": 0.0, "kl": 0.0}
    chunks = len(held_out.features) if max_chunks is None else min(max_chunks, len(held_out.features))
    was_training = head.training
    head.eval()
    tokens = 0
    with torch.no_grad():
        for i in range(chunks):
            z = _run(head, target, held_out.layers[head.layer][i : i + 1].float())[0]
            p = target_logits(target, held_out.features.hidden[i].float()).softmax(-1)
            for name in totals:
                totals[name] += agreement_sums(p, head.logits(target, z), head.vocab)[name]
            tokens += p.shape[0]
    head.train(was_training)
    return {name: value / tokens for name, value in totals.items()} | {"tokens": tokens}


def _sample(family: str, data: LayerData, config, generator):
    """A batch: ``(index into flattened positions or chunks, window start)``."""
    n, length = data.features.tokens.shape
    if family == "exit":
        return torch.randint(n * length, (config.exit_rows,), generator=generator), None
    window = min(config.window, length)
    chunks = torch.randint(n, (config.batch_size,), generator=generator)
    starts = torch.randint(length - window + 1, (config.batch_size,), generator=generator)
    return chunks, (starts, window)


def _gather(tensor: torch.Tensor, family: str, index, windows) -> torch.Tensor:
    if family == "exit":
        return tensor.reshape(-1, tensor.shape[-1])[index].float()[None]
    starts, window = windows
    return torch.stack(
        [tensor[c, s : s + window] for c, s in zip(index.tolist(), starts.tolist(), strict=True)]
    ).float()


def train_exit_heads(
    target,
    kind: str,
    feature_dir: str | Path,
    out_dirs: dict[int, Path],
    state_dir: Path,
    config,
    *,
    card_extra: dict | None = None,
    features: dict[str, FeatureSet] | None = None,
    progress: bool = True,
) -> dict[int, dict]:
    """Train the heads of ``kind`` (see :func:`parse_kind`) on the cache ``feature_dir`` for ``config.minutes``
    (resuming from ``state_dir/train_state.pt``); save each layer's checkpoint in ``out_dirs[K]``; returns
    the cards by layer. ``features`` passes the already loaded splits of ``feature_dir``."""
    from executor.training.features import load_features

    family, layers = parse_kind(kind, target.config.n_layers)
    if sorted(out_dirs) != layers:
        raise ValueError(f"out_dirs must name one directory per layer {layers}, got {sorted(out_dirs)}")
    add_layer_features(target, feature_dir, layers, progress=progress)
    splits = {
        split: LayerData(
            (features or {}).get(split) or load_features(feature_dir, split),
            {k: load_layer_features(feature_dir, split, k) for k in layers},
        )
        for split in ("train", "held_out")
    }
    train, held_out = splits["train"], splits["held_out"]
    state_dir.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    vocab, vocab_info = choose_vocab(target, train.features, config.vocab)
    heads = torch.nn.ModuleDict(
        {str(k): ExitHead(target.config, k, vocab, attention=family == "kangaroo") for k in layers}
    )
    groups = []
    for head in heads.values():
        groups.append(
            {"params": [*head.norm.parameters(), *head.fc.parameters()], "scale": config.fc_lr_scale}
        )
        if head.has_attention:
            rest = [*head.attention_norm.parameters(), *head.attention.parameters()]
            groups.append({"params": rest, "scale": 1.0})
    reduced = heads[str(layers[0])].reduced

    def step(fraction: float):
        index, windows = _sample(family, train, config, generator)
        with torch.no_grad():
            final = _gather(train.features.hidden, family, index, windows)
            log_p = target_logits(target, final, vocab if reduced else None).log_softmax(-1)
        losses = {}
        for k, head in heads.items():
            z = _run(head, target, _gather(train.layers[int(k)], family, index, windows))
            log_q = head.logits(target, z, full=False).log_softmax(-1)
            losses[k] = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
        figures = {f"kl{k}": f"{float(v.detach()):.3f}" for k, v in losses.items()}
        return sum(losses.values()), {"tokens": log_p.shape[0] * log_p.shape[1], **figures}

    def initialise() -> dict:
        initial = {k: evaluate_exit_head(head, target, held_out, 2) for k, head in heads.items()}
        r2 = {
            k: ridge_init_exit(head, train, config.ridge_rows, config.ridge, generator)
            for k, head in heads.items()
        }
        return {"initial": initial, "ridge_r2": r2}

    def evaluate() -> dict:
        # The progress bar shows the deepest head's held-out sum-min; the card records each head's.
        deepest = evaluate_exit_head(heads[str(layers[-1])], target, held_out, 2)
        return {"heldout_summin": f"{deepest['sum_min']:.3f}"}

    record = run_budgeted(
        heads,
        groups,
        state_dir,
        config,
        generator,
        step=step,
        initialise=initialise,
        evaluate=evaluate,
        desc=f"train {kind}",
        progress=progress,
    )
    cards = {}
    for k in layers:
        head = heads[str(k)]
        fields = {
            "ridge_r2": record["ridge_r2"][str(k)],
            "held_out_initial": record["initial"][str(k)],
            "held_out": evaluate_exit_head(head, target, held_out),
            "draft_vocab": vocab_info,
            "layer": k,
            "trained_with": kind,
            **(card_extra or {}),
        }
        cards[k] = finish_checkpoint(head, target, out_dirs[k], head.kind, config, record, fields)
    return cards


def train_layer_kind(
    target, kind, feature_dir, out, recipe: dict, config, card_extra, features=None, progress=True
) -> Path:
    """:func:`train_exit_heads` with the checkpoint directories of :func:`executor.training.train_drafter`.

    Default (``out`` is ``None``): each layer's checkpoint under its own ``<family>:K`` cache key and the
    training state under the ``kind`` key; with ``out``: the checkpoint in ``out`` for one layer, in
    ``out/<family>-K`` for several (the state in ``out``). Returns the first layer's checkpoint directory.
    """
    from executor.training.checkpoint import default_checkpoint_dir, model_fingerprint

    family, layers = parse_kind(kind, target.config.n_layers)
    fingerprint = model_fingerprint(target)
    if out is None:
        out_dirs = {k: default_checkpoint_dir(f"{family}:{k}", fingerprint, recipe) for k in layers}
        state_dir = (
            default_checkpoint_dir(kind, fingerprint, recipe) if len(layers) > 1 else out_dirs[layers[0]]
        )
    else:
        state_dir = Path(out)
        out_dirs = (
            {k: state_dir / f"{family}-{k}" for k in layers} if len(layers) > 1 else {layers[0]: state_dir}
        )
    train_exit_heads(
        target,
        kind,
        feature_dir,
        out_dirs,
        state_dir,
        config,
        card_extra=card_extra,
        features=features,
        progress=progress,
    )
    return out_dirs[layers[0]]
