"""Time-budgeted, resumable training of draft heads on the cached target features.

The objective distils the target's distribution, since single-draft acceptance is
:math:`\\sum_v \\min(p_v, q_v) = 1 - \\mathrm{TV}(p, q)` (Leviathan et al., ICML 2023, arXiv 2211.17192): the
loss is :math:`\\mathrm{KL}(p \\,\\|\\, q)` at temperature 1 (on the draft vocabulary, with ``p`` renormalised
there) plus ``feature_weight`` times a SmoothL1 regression of the head's feature onto the target's next feature,
both RMS-normalised (EAGLE's two losses, Li et al., ICML 2024, arXiv 2401.15077).

Before any gradient step, the head's input projection is set in closed form by ridge regression of the
target's next normalised feature on ``[norm(h_t), E x_{t+1}, 1]`` (the decoder layer starts as the identity,
so this is the best linear head; in drafters.md it was the single best trick measured). AdamW (Loshchilov &
Hutter, ICLR 2019) then runs with a linear warm-up over ``warmup_steps`` steps and a cosine decay to 0.1x over
the *time* budget, the projection at ``fc_lr_scale`` times the rate (full-rate Adam steps, being sign-like at
first, would undo the ridge solution before the new layer learns anything); every
``save_seconds`` the head, the optimizer state, the step and the random state go to ``train_state.pt``
(atomically), so an interrupted run continues where it stopped until the budget is spent.

With ``unroll`` = ``U`` > 1 the head is also trained on its own features, as it drafts (EAGLE-3's "training-time
test", Li et al., arXiv 2503.01840): pass ``j`` feeds entry ``s`` the head's pass-``j-1`` feature with token
:math:`x_{s+j}` and distils :math:`p(\\cdot \\mid h_{s+j})`; its query sees the teacher-forced entries up to ``s``
(the verified context) and its own earlier entries of the same draft, the cache the drafter holds at draft step
``j``. The passes' losses are averaged. A head trained teacher-forced only sees its own features first at
run time: at the second drafted position its acceptance fell to 0.09-0.11 (docs/drafters.md).

Held-out figures (on the card and in the progress bar) are at the first drafted position, teacher-forced on the
target's exact features, with the full-vocabulary ``p``: ``top1`` = P(argmax q = argmax p), ``sum_min`` =
mean :math:`\\sum_v \\min(p_v, q_v)`, ``kl`` = mean KL(p' || q) on the draft vocabulary; ``top1_2`` and
``sum_min_2`` are the same at the second drafted position, from the head's own first feature.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from executor.drafters.feature import FeatureHead
from executor.training.checkpoint import model_fingerprint
from executor.training.features import FeatureSet, target_logits
from executor.training.loop import agreement_sums, finish_checkpoint, ridge_solve, rms, run_budgeted
from executor.training.teacher import coarse_kl

__all__ = [
    "TrainConfig",
    "cached_checkpoints",
    "choose_vocab",
    "chunk_agreement",
    "chunk_agreements",
    "evaluate_head",
    "feature_loss",
    "ridge_init",
    "train_drafter",
    "train_feature_head",
]

#: Trained kinds and the module whose ``train_<kind>_head`` trains them.
TRAINED_KINDS = ("feature", "falcon")


@dataclass(frozen=True)
class TrainConfig:
    """The recipe (it keys the checkpoint cache, with the target and the corpus)."""

    minutes: float = 6.0
    lr: float = 1e-3
    batch_size: int = 2
    feature_weight: float = 0.5
    weight_decay: float = 0.0
    warmup_steps: int = 10
    fc_lr_scale: float = 0.1  # the ridge-initialised projection moves 10x slower than the new layer
    ridge: float = 1e-3
    ridge_rows: int = 32_768
    vocab: str = "auto"  # "full" | "reduced" | "auto" (reduced when its measured LM-head cost is < 0.8x)
    seed: int = 0
    save_seconds: float = 60.0
    eval_seconds: float = 240.0  # the bar's held-out figure (2 chunks); the card's uses every held-out chunk
    teacher_topk: int = (
        32  # 0: recompute the full p' every step; k: cached top-k + tail (executor.training.teacher)
    )
    max_steps: int = (
        0  # 0: the time budget alone; n: also stop after n steps (the schedule then runs on steps)
    )
    unroll: int = (
        1  # drafted positions trained per entry: 1 teacher-forced, 2+ also on the head's own features
    )

    def __post_init__(self) -> None:
        if not self.minutes > 0:
            raise ValueError(f"minutes must be positive, got {self.minutes!r}")
        if self.vocab not in ("full", "reduced", "auto"):
            raise ValueError(f"vocab must be 'full', 'reduced' or 'auto', got {self.vocab!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size!r}")
        if not 1 <= self.unroll <= 8:
            raise ValueError(f"unroll must be 1 to 8 drafted positions, got {self.unroll!r}")
        if self.teacher_topk < 0 or self.max_steps < 0:
            raise ValueError(
                f"teacher_topk and max_steps must be non-negative, got {self.teacher_topk!r}, {self.max_steps!r}"
            )

    def recipe(self) -> dict:
        """What changes the trained weights (the budget, save and eval cadence do not key the cache)."""
        data = asdict(self)
        for name in ("minutes", "save_seconds", "eval_seconds", "max_steps"):
            data.pop(name)
        if data["unroll"] == 1:  # the recipe before unrolling existed: cached heads keep their keys
            data.pop("unroll")
        return data


def _head_inputs(features: FeatureSet, index: torch.Tensor, ahead: int = 1):
    """Entries ``(h_{s-1}, x_s)`` and the feature ``ahead`` positions on, ``h_{s-1+ahead}``."""
    hidden = features.hidden[index].float()
    tokens = features.tokens[index]
    end = hidden.shape[1] - ahead
    return hidden[:, :end], tokens[:, 1 : end + 1], hidden[:, ahead:]


def _run_head(head: FeatureHead, target, inputs, next_tokens, passes: int = 1) -> list[torch.Tensor]:
    """The head's features ``g`` of each drafted position ``j = 1..passes`` (list of ``(B, L - j + 1, d)``).

    Pass 1 is teacher-forced: entry ``s`` = (``h_s``, ``x_{s+1}``), RoPE position ``s + 1``, cache slot ``s``.
    Pass ``j`` feeds entry ``s`` the pass ``j - 1`` feature with ``x_{s+j}``, at RoPE position ``s + j`` and slot
    ``(j - 1) L + s``; it sees the slots ``0..s`` of pass 1 and slot ``s`` of each pass ``2..j`` (module docstring).
    """
    batch, length = next_tokens.shape
    head.setup_cache(passes * length, batch)
    slots = torch.arange(length)
    causal = slots <= slots[:, None]
    features = [head(target, inputs, next_tokens, slots, slots + 1, causal)]
    cache = head.layer.attention.kv_cache
    for j in range(2, passes + 1):
        # The earlier passes' attention saved views of the cache for backward: this pass writes into a copy.
        cache.k, cache.v = cache.k.clone(), cache.v.clone()
        rows = length - j + 1
        mask = torch.zeros(rows, j * length, dtype=torch.bool)
        mask[:, :length] = causal[:rows, :]
        for earlier in range(2, j + 1):
            mask[torch.arange(rows), (earlier - 1) * length + torch.arange(rows)] = True
        own = features[-1][:, :rows]
        features.append(
            head(
                target, own, next_tokens[:, j - 1 :], (j - 1) * length + slots[:rows], slots[:rows] + j, mask
            )
        )
    return features


def feature_loss(
    head: FeatureHead,
    target,
    inputs,
    next_tokens,
    targets,
    feature_weight: float,
    teacher=None,
    unroll: int = 1,
):
    """The training objective on aligned windows: ``(loss, kl)``, ``kl`` at the first drafted position (see the
    module docstring).

    ``inputs`` = the target's pre-norm features ``h_t`` ``(B, T, d)``, ``next_tokens`` = ``x_{t+1}`` ``(B, T)``
    and ``targets`` = ``h_{t+1}`` ``(B, T, d)``, whose distribution ``p`` is recomputed through the frozen head,
    unless ``teacher`` = ``(log_p, index)`` ``(B, T, k)`` gives its cached top-k (then the KL is
    :func:`executor.training.teacher.coarse_kl`). ``unroll`` passes (:func:`_run_head`) are averaged; pass ``j``
    is scored against ``targets[:, j - 1:]``. Shared by offline training and online distillation
    (:mod:`executor.methods.online`).
    """
    losses, kls = [], []
    for j, g in enumerate(_run_head(head, target, inputs, next_tokens, unroll)):
        aligned = targets[:, j:]
        q_logits = head.logits(target, g, full=False)
        if teacher is not None:
            kl = coarse_kl(teacher[0][:, j:], teacher[1][:, j:], q_logits).mean()
        else:
            with torch.no_grad():
                log_p = target_logits(target, aligned, head.vocab if head.reduced else None).log_softmax(-1)
            log_q = q_logits.log_softmax(-1)
            kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
        regression = F.smooth_l1_loss(rms(g.float()), rms(aligned.float()))
        losses.append(kl + feature_weight * regression)
        kls.append(kl)
    return torch.stack(losses).mean(), kls[0]


def choose_vocab(target, train: FeatureSet, mode: str) -> tuple[torch.Tensor | None, dict]:
    """The draft vocabulary: ``None`` (full) or the reduced set ``V'`` and what was measured to choose it.

    ``V'`` = every token among the target's top-8 at some training position, plus every training token.
    ``"auto"`` times one drafted token's LM head (full against ``V'``, interleaved, medians of 15) and keeps
    ``V'`` when it costs less than 0.8x.
    """
    vocab_size = target.config.vocab_size
    mask = train.topk_counts > 0
    mask[train.tokens.unique()] = True
    vocab = torch.nonzero(mask).reshape(-1)
    info = {"mode": mode, "reduced_size": int(vocab.numel()), "vocab_size": vocab_size}
    if mode == "full" or vocab.numel() == vocab_size:
        return None, {**info, "chosen": "full"}
    if mode == "reduced":
        return vocab, {**info, "chosen": "reduced"}
    weight = target.tok_embeddings.weight if target.output is None else target.output.weight
    reduced_weight = weight[vocab].contiguous()
    x = torch.randn(1, weight.shape[1], dtype=weight.dtype)
    times = {"full": [], "reduced": []}
    with torch.no_grad():
        for _ in range(15):
            for name, w in (("full", weight), ("reduced", reduced_weight)):
                start = time.perf_counter()
                F.linear(x, w)
                times[name].append(time.perf_counter() - start)
    full, reduced = statistics.median(times["full"]), statistics.median(times["reduced"])
    info.update(lm_head_seconds_full=full, lm_head_seconds_reduced=reduced)
    chosen = "reduced" if reduced < 0.8 * full else "full"
    return (vocab if chosen == "reduced" else None), {**info, "chosen": chosen}


def ridge_init(
    head: FeatureHead, target, train: FeatureSet, rows: int, ridge: float, generator, ahead: int = 1
) -> float:
    """Set ``head.fc`` to the ridge solution (target: the feature ``ahead`` positions on, the one the head
    predicts); returns the fit's R^2 on the rows used."""
    count = min(len(train), max(1, rows // max(train.tokens.shape[1] - ahead, 1)))
    index = torch.randperm(len(train), generator=generator)[:count]
    inputs, next_tokens, targets = _head_inputs(train, index, ahead)
    with torch.no_grad():
        x = torch.cat([target.norm(inputs).float(), target.tok_embeddings(next_tokens).float()], -1)
        y = rms(targets.float()).reshape(-1, targets.shape[-1])
        weight, bias, r2 = ridge_solve(x.reshape(-1, x.shape[-1]), y, ridge)
        head.fc.weight.copy_(weight)
        head.fc.bias.copy_(bias)
        return r2


def chunk_agreements(head: FeatureHead, target, held_out: FeatureSet, index: int, positions: int = 1) -> list:
    """:func:`~executor.training.loop.agreement_sums` (``top1``, ``sum_min``, ``kl`` summed, and ``tokens``)
    of the head's drafted positions ``1..positions`` (1: teacher-forced; 2: from its own first feature, ...) on
    chunk ``index`` of ``held_out``, from one run of the head and one of the target's LM head; call under
    ``torch.no_grad()``."""
    inputs, next_tokens, targets = _head_inputs(held_out, torch.tensor([index]))
    p = target_logits(target, targets[0]).softmax(-1)
    return [
        agreement_sums(p[j:], head.logits(target, g[0]), head.vocab)
        for j, g in enumerate(_run_head(head, target, inputs, next_tokens, positions))
    ]


def chunk_agreement(head: FeatureHead, target, held_out: FeatureSet, index: int, position: int = 1) -> dict:
    """:func:`chunk_agreements` of the drafted ``position`` alone."""
    return chunk_agreements(head, target, held_out, index, position)[-1]


def evaluate_head(head: FeatureHead, target, held_out: FeatureSet, max_chunks: int | None = None) -> dict:
    """Held-out ``top1``, ``sum_min``, ``kl``, ``top1_2``, ``sum_min_2`` (see the module docstring) and the
    number of ``tokens``."""
    chunks = len(held_out) if max_chunks is None else min(max_chunks, len(held_out))
    was_training = head.training
    head.eval()
    totals = [{"top1": 0.0, "sum_min": 0.0, "kl": 0.0, "tokens": 0} for _ in range(2)]
    with torch.no_grad():
        for i in range(chunks):
            for total, sums in zip(totals, chunk_agreements(head, target, held_out, i, 2), strict=True):
                for name, value in sums.items():
                    total[name] += value
    head.train(was_training)
    first, second = totals
    tokens = first.pop("tokens")
    return (
        {name: value / tokens for name, value in first.items()}
        | {"tokens": tokens}
        | {f"{name}_2": second[name] / second["tokens"] for name in ("top1", "sum_min")}
    )


def start_head(head_class, target, train: FeatureSet, out_dir, config: TrainConfig):
    """The seeded start the feature and falcon kinds share: ``(out_dir, generator, head, groups, vocab_info)``.

    Creates ``out_dir``, seeds the batch generator and torch's own (the head's initial weights) with
    ``config.seed``, chooses the draft vocabulary (:func:`choose_vocab`), builds ``head_class(target.config,
    vocab)`` and its AdamW groups: the projection ``fc`` at ``config.fc_lr_scale`` times the rate, the layer at 1.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    vocab, vocab_info = choose_vocab(target, train, config.vocab)
    head = head_class(target.config, vocab)
    groups = [
        {"params": list(head.fc.parameters()), "scale": config.fc_lr_scale},
        {"params": list(head.layer.parameters()), "scale": 1.0},
    ]
    return out_dir, generator, head, groups, vocab_info


def train_feature_head(
    target,
    train: FeatureSet,
    held_out: FeatureSet,
    out_dir: str | Path,
    config: TrainConfig = TrainConfig(),
    *,
    card_extra: dict | None = None,
    progress: bool = True,
) -> dict:
    """Train (or resume training) a :class:`FeatureHead` for ``config.minutes``; save it; return its card.

    ``out_dir`` receives ``train_state.pt`` during training and the checkpoint (weights + card) at the end.
    ``KeyboardInterrupt`` saves the state first, so the next call resumes.
    """
    out_dir, generator, head, groups, vocab_info = start_head(FeatureHead, target, train, out_dir, config)
    teacher, teacher_info = cached_teacher(target, train, head, out_dir, config.teacher_topk, progress)

    def initialise() -> dict:
        initial = evaluate_head(head, target, held_out, max_chunks=4)
        return {
            "initial": initial,
            "ridge_r2": ridge_init(head, target, train, config.ridge_rows, config.ridge, generator),
        }

    def step(fraction: float):
        index = torch.randint(len(train), (config.batch_size,), generator=generator)
        inputs, next_tokens, targets = _head_inputs(train, index)
        rows = None if teacher is None else (teacher.log_p[index, 1:], teacher.index[index, 1:])
        loss, kl = feature_loss(
            head, target, inputs, next_tokens, targets, config.feature_weight, rows, config.unroll
        )
        return loss, {"tokens": next_tokens.numel(), "kl": f"{float(kl.detach()):.3f}"}

    def evaluate() -> dict:
        figures = evaluate_head(head, target, held_out, max_chunks=2)
        return {"heldout_summin": f"{figures['sum_min']:.3f}/{figures['sum_min_2']:.3f}"}

    record = run_budgeted(
        head,
        groups,
        out_dir,
        config,
        generator,
        step=step,
        initialise=initialise,
        evaluate=evaluate,
        desc="train feature head",
        progress=progress,
    )
    fields = {
        "ridge_r2": record["ridge_r2"],
        "held_out_initial": record["initial"],
        "held_out": evaluate_head(head, target, held_out),
        "draft_vocab": vocab_info,
        **teacher_info,
        **(card_extra or {}),
    }
    return finish_checkpoint(head, target, out_dir, "feature", config, record, fields)


def cached_teacher(target, train: FeatureSet, head, out_dir: Path, k: int, progress: bool = True):
    """``(Teacher or None, card fields)``: the top-``k`` teacher on ``head``'s draft vocabulary, computed once
    (:func:`executor.training.teacher.teacher_topk`) and kept in ``out_dir/teacher.safetensors`` for resumes."""
    from safetensors.torch import load_file, save

    from executor.files import write_bytes
    from executor.training.teacher import Teacher, teacher_topk

    if k == 0:
        return None, {}
    vocab = head.vocab if head.reduced else None
    k = min(k, target.config.vocab_size if vocab is None else vocab.numel())
    path = out_dir / "teacher.safetensors"
    shape = (*train.tokens.shape, k)
    start = time.perf_counter()
    if path.is_file():
        teacher = Teacher(**load_file(str(path)))
        if tuple(teacher.log_p.shape) != shape:
            raise ValueError(
                f"{str(path)!r} holds a teacher of shape {tuple(teacher.log_p.shape)}, not {shape}"
            )
    else:
        teacher = teacher_topk(target, train, vocab, k, progress=progress)
        write_bytes(save(teacher.tensors()), path)
    tail = float((1 - teacher.log_p.exp().sum(-1)).clamp_min(0).mean())
    return teacher, {"teacher": {"topk": k, "mean_tail_mass": tail, "seconds": time.perf_counter() - start}}


def _float32_target(target):
    """Training runs batched matrix products, which are fastest in float32 on CPUs without AMX."""
    if target.tok_embeddings.weight.dtype == torch.float32:
        return target
    import copy

    return copy.deepcopy(target).float()


def _held_out_sum_min(card_path: Path) -> float:
    try:
        return float(json.loads(card_path.read_text())["held_out"]["sum_min"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1.0  # an unreadable card ranks last (loading it reports the problem)


def cached_checkpoints(target, kind: str = "feature") -> list[Path]:
    """Finished checkpoints of ``kind`` for ``target`` in the cache, best first. The first is what
    ``--drafter KIND`` uses.

    Feature and falcon heads scored on the common ranking set come first, best Σmin on the ranking files none
    of them read first (:func:`executor.training.ranking.rank_checkpoints`); heads not scored yet (older cards:
    ``specbound train-drafter --rank`` scores them) and the other kinds follow by the held-out ``sum_min`` on
    their card, then the most recently written.
    """
    from executor.training.checkpoint import CARD_NAME, cache_root
    from executor.training.ranking import RANKED_KINDS, rank_checkpoints

    prefix = f"{kind.replace(':', '_')}-{model_fingerprint(target)['hash'][:12]}-"
    root = cache_root() / "drafters"
    found = [p for p in root.glob(prefix + "*") if (p / CARD_NAME).is_file()] if root.is_dir() else []
    by_card = sorted(
        found,
        key=lambda p: (_held_out_sum_min(p / CARD_NAME), (p / CARD_NAME).stat().st_mtime),
        reverse=True,
    )
    return rank_checkpoints(by_card)[0] if kind in RANKED_KINDS and len(by_card) > 1 else by_card


def train_drafter(
    target,
    tokenizer,
    *,
    kind: str = "feature",
    corpus=None,
    minutes: float = 6.0,
    out: str | Path | None = None,
    train_tokens: int = 65_536,
    held_out_tokens: int = 8_192,
    chunk_length: int = 512,
    config: TrainConfig | None = None,
    progress: bool = True,
) -> Path:
    """Cache the target's features on ``corpus`` (default: the standard library), train a ``kind`` head within
    ``minutes`` (resuming an interrupted run), save it; returns the checkpoint directory.

    The default directory is ``$XDG_CACHE_HOME/specbound/drafters/<kind>-<target hash>-<recipe hash>/``.
    ``kind`` is ``"feature"``, ``"falcon"`` (:mod:`executor.training.falcon`), ``"kangaroo:K"`` or
    ``"exit:K1,K2,..."`` (:mod:`executor.training.exit_heads`; several exit layers train in one job and the path
    of the first layer's checkpoint is returned, the others sit next to it under their own ``exit:K`` keys; with
    ``out``, in ``out/exit-K``).
    """
    from executor.training.checkpoint import default_checkpoint_dir
    from executor.training.corpus import load_corpus
    from executor.training.features import load_features, prepare_features

    layer_kind = kind not in TRAINED_KINDS
    if layer_kind and not kind.startswith(("exit:", "kangaroo:")):
        raise ValueError(
            f"kind must be one of {', '.join(TRAINED_KINDS)}, exit:K[,K...] or kangaroo:K (the trained drafter "
            f"kinds), got {kind!r}"
        )
    if layer_kind:
        from executor.training.exit_heads import ExitTrainConfig, parse_kind

        parse_kind(kind, target.config.n_layers)  # 'exit:K[,K...]' or 'kangaroo:K', else ValueError
        if config is None:
            config = ExitTrainConfig(minutes=minutes)
        elif not isinstance(config, ExitTrainConfig):
            config = ExitTrainConfig(**asdict(config))
    from executor.training.selfdistill import merge_features, parse_self_corpus, self_distilled_features

    config = TrainConfig(minutes=minutes) if config is None else config
    if config.unroll != 1 and kind != "feature":
        raise ValueError(f"unroll trains feature heads only, not {kind!r} (got unroll={config.unroll})")
    target = _float32_target(target)
    self_tokens = parse_self_corpus(corpus)  # "self:N": N generated tokens, then the standard library
    if self_tokens and layer_kind:
        raise ValueError(f"corpus 'self:N' trains feature and falcon heads only, not {kind!r}")
    corpus = load_corpus(None if self_tokens else corpus)
    directory = prepare_features(
        target,
        tokenizer,
        corpus,
        chunk_length=chunk_length,
        train_tokens=train_tokens,
        held_out_tokens=held_out_tokens,
        progress=progress,
    )
    recipe = {
        **config.recipe(),
        "corpus": corpus.fingerprint(),
        "train_tokens": train_tokens,
        "chunk_length": chunk_length,
    }
    train, held_out = load_features(directory, "train"), load_features(directory, "held_out")
    self_info = None
    if self_tokens:
        generated, self_info = self_distilled_features(
            target, tokenizer, self_tokens, chunk_length=chunk_length, progress=progress
        )
        train = merge_features(generated, train)
        # The generation key is part of the head's key: other prompts or settings make another corpus.
        recipe["self_distill"] = {
            k: self_info[k] for k in ("self_distill_tokens", "oversample", "generation_key")
        }
    given_out = out
    out = default_checkpoint_dir(kind, model_fingerprint(target), recipe) if out is None else Path(out)
    corpus_info = {
        "name": corpus.name,
        "fingerprint": corpus.fingerprint(),
        "train_tokens": int(train.tokens.numel()),
        "held_out_tokens": int(held_out.tokens.numel()),
        "split_rule": "held out iff int.from_bytes(sha256(relative path)[:8], 'big') % 20 == 0",
    }
    if self_info:
        corpus_info["self_distill"] = self_info
    card_extra = {"corpus": corpus_info}
    backend = getattr(tokenizer, "backend", None)
    if backend is not None:  # the token strings, so a re-tokenised vocabulary is told apart
        import hashlib

        vocabulary = sorted(backend.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
        card_extra["vocab_hash"] = hashlib.sha256(json.dumps(vocabulary).encode()).hexdigest()
    if layer_kind:
        from executor.training.exit_heads import train_layer_kind

        features = {"train": train, "held_out": held_out}
        return train_layer_kind(
            target, kind, directory, given_out, recipe, config, card_extra, features, progress
        )
    if kind == "falcon":
        from executor.training.falcon import train_falcon_head as train_head
    else:
        train_head = train_feature_head
    train_head(target, train, held_out, out, config, card_extra=card_extra, progress=progress)
    from executor.training.ranking import score_checkpoint

    score_checkpoint(out, target, tokenizer, progress=progress)  # the common yardstick (once per head)
    return out
