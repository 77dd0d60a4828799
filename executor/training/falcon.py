"""Training Falcon's semi-autoregressive head with Coupled Sequential Glancing Distillation (CSGD).

The head (:class:`executor.drafters.FalconHead`) reads entries :math:`e_s = (h_{s-1}, x_s)` under the block mask
(:func:`executor.drafters.falcon.block_mask`) and its output at :math:`e_s` predicts :math:`h_{s+1}`, so in a
block the first entry drafts token 1 of a pass and the second drafts token 2 (Gao et al., AAAI 2025,
arXiv 2412.12639). One training step on a batch of cached chunks (block alignment drawn at random):

1. **First pass** (no gradient), teacher-forced on the target's exact features: the head's predicted features
   :math:`\\hat g_s` (on random :data:`WINDOW`-entry windows of the cached chunks).
2. **Coupled sequential inputs.** At drafting time every pass after the first is fed the previous pass's
   outputs: entry :math:`e_s` gets :math:`\\hat g_{s-2}` (the prediction of :math:`h_{s-1}` two entries back)
   instead of :math:`h_{s-1}`, a whole block at once. The second pass feeds each block its own predicted
   features, except for *glanced* blocks, which keep the exact ones.
3. **Glancing** (GLAT, Qian et al., ACL 2021, as Falcon uses it): a block is glanced with probability
   ``0.5 + lambda * err`` (at most 1; ``err`` measured on the previous step's second pass, which saves an LM
   head product per step) -- more ground truth while the head is poor -- with ``lambda`` decaying
   linearly from 0.6 to 0.25 over the budget (the paper's schedule); half the blocks at least stay exact because
   the first pass of every step is fed exact features.
4. **Loss** on the second pass, at both positions of every block: :math:`\\mathrm{KL}(p \\,\\|\\, q)` at
   temperature 1 to the target's distribution of the token the entry predicts (acceptance is
   :math:`1 - \\mathrm{TV}`) plus ``feature_weight`` times SmoothL1 between RMS-normalised :math:`g_s` and
   :math:`h_{s+1}`.

The projection starts at the ridge solution for :math:`h_{s+1}` (:func:`executor.training.trainer.ridge_init`
with ``ahead = 2``: the best linear head, the feature kind's best trick) and the layer as the identity; the loop,
budget, resume and checkpoint are :mod:`executor.training.loop`'s.

Held-out figures (teacher-forced on exact features, full-vocabulary ``p``, T = 1): ``held_out`` = token 1 of the
first pass (``top1``, ``sum_min``, ``kl`` as in :func:`executor.training.trainer.evaluate_head`),
``held_out_token2`` = token 2; ``held_out_pass2`` = tokens 3 and 4 of the second pass, fed the head's own
features from the first pass (the drafted tokens teacher-forced).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from executor.drafters.falcon import BLOCK, FalconHead, block_mask
from executor.training.features import FeatureSet, target_logits
from executor.training.loop import agreement_sums, finish_checkpoint, rms, run_budgeted
from executor.training.trainer import TrainConfig, _head_inputs, ridge_init, start_head

__all__ = ["coupled_inputs", "evaluate_falcon_head", "first_in_block", "train_falcon_head"]

GLANCE_START, GLANCE_END, GLANCE_FLOOR = 0.6, 0.25, 0.5
#: Each step trains on ``WINDOW_ROWS * batch_size`` random windows of ``WINDOW`` entries (cut from the cached
#: chunks): on a shared 2-core CPU a 4-minute budget gives only a few dozen steps, and more, smaller steps
#: learn more than fewer, larger ones at the same tokens per second.
WINDOW, WINDOW_ROWS = 128, 2


def _windows(inputs, tokens, targets, generator):
    """A random ``WINDOW``-entry window of every row (the whole row when it is shorter)."""
    length = tokens.shape[1]
    if length <= WINDOW:
        return inputs, tokens, targets
    starts = torch.randint(length - WINDOW + 1, (tokens.shape[0],), generator=generator)
    columns = starts[:, None] + torch.arange(WINDOW)
    rows = torch.arange(tokens.shape[0])[:, None]
    return inputs[rows, columns], tokens[rows, columns], targets[rows, columns]


def first_in_block(length: int, offset: int) -> torch.Tensor:
    """``(length,)`` bool: the entry sees the next one (it drafts token 1 of its pass; else token 2)."""
    mask = block_mask(length, offset)
    sees = torch.zeros(length, dtype=torch.bool)
    sees[:-1] = mask[torch.arange(length - 1), torch.arange(1, length)]
    return sees


def _forward(head: FalconHead, target, inputs, tokens, offset: int) -> torch.Tensor:
    batch, length = tokens.shape
    head.setup_cache(length, batch)
    slots = torch.arange(length)
    return head(target, inputs, tokens, slots, slots + 1, block_mask(length, offset))


def coupled_inputs(inputs: torch.Tensor, predicted: torch.Tensor, replace: torch.Tensor, offset: int):
    """``inputs`` with entry ``j`` of every replaced block fed ``predicted[:, j - 2]`` (what the next pass sees).

    ``replace`` ``(B, blocks)`` bool per block ``[offset + 2m, offset + 2m + 1]``; blocks that start before entry
    2 have no prediction to take and stay exact.
    """
    length = inputs.shape[1]
    column = torch.arange(length)
    block = torch.div(column - offset, BLOCK, rounding_mode="floor")
    start = block * BLOCK + offset
    eligible = (column >= offset) & (start >= BLOCK)
    chosen = torch.zeros(inputs.shape[:2], dtype=torch.bool)
    chosen[:, eligible] = replace[:, block[eligible]]
    shifted = torch.zeros_like(inputs)
    shifted[:, BLOCK:] = predicted[:, :-BLOCK]
    return torch.where(chosen[..., None], shifted, inputs)


def evaluate_falcon_head(
    head: FalconHead, target, held_out: FeatureSet, max_chunks: int | None = None
) -> dict:
    """Held-out figures by drafted position: ``token1``, ``token2`` (first pass), ``token3``, ``token4``."""
    sums = {name: {"top1": 0.0, "sum_min": 0.0, "kl": 0.0, "tokens": 0} for name in ("1", "2", "3", "4")}
    chunks = len(held_out) if max_chunks is None else min(max_chunks, len(held_out))
    was_training = head.training
    head.eval()
    with torch.no_grad():
        for i in range(chunks):
            inputs, tokens, targets = _head_inputs(held_out, torch.tensor([i]), ahead=BLOCK)
            p = target_logits(target, targets[0]).softmax(-1)
            first = first_in_block(tokens.shape[1], 0)
            g = _forward(head, target, inputs, tokens, 0)
            everything = torch.ones(1, tokens.shape[1], dtype=torch.bool)
            g2 = _forward(head, target, coupled_inputs(inputs, g, everything, 0), tokens, 0)
            later = torch.arange(tokens.shape[1]) >= BLOCK
            for name, rows, out in (
                ("1", first, g),
                ("2", ~first, g),
                ("3", first & later, g2),
                ("4", ~first & later, g2),
            ):
                q_logits = head.logits(target, out[0][rows])
                for key, value in agreement_sums(p[rows], q_logits, head.vocab).items():
                    sums[name][key] += value
    head.train(was_training)
    return {
        f"token{name}": {key: value / max(s["tokens"], 1) for key, value in s.items() if key != "tokens"}
        | {"tokens": s["tokens"]}
        for name, s in sums.items()
    }


def train_falcon_head(
    target,
    train: FeatureSet,
    held_out: FeatureSet,
    out_dir: str | Path,
    config: TrainConfig | None = None,
    *,
    card_extra: dict | None = None,
    progress: bool = True,
) -> dict:
    """Train (or resume training) a :class:`FalconHead` with CSGD for ``config.minutes``; save; return the card."""
    config = TrainConfig() if config is None else config
    out_dir, generator, head, groups, vocab_info = start_head(FalconHead, target, train, out_dir, config)

    def initialise() -> dict:
        initial = evaluate_falcon_head(head, target, held_out, max_chunks=4)
        ridge = ridge_init(head, target, train, config.ridge_rows, config.ridge, generator, ahead=BLOCK)
        return {"initial": initial, "ridge_r2": ridge}

    error = {"rate": 1.0}  # share of wrong argmaxes in the previous step's second pass (1 before any step)

    def step(fraction: float):
        rows = WINDOW_ROWS * config.batch_size
        index = torch.randint(len(train), (rows,), generator=generator)
        offset = int(torch.randint(BLOCK, (1,), generator=generator))
        inputs, tokens, targets = _windows(*_head_inputs(train, index, ahead=BLOCK), generator)
        length = tokens.shape[1]
        with torch.no_grad():
            log_p = target_logits(target, targets, head.vocab if head.reduced else None).log_softmax(-1)
            predicted = _forward(head, target, inputs, tokens, offset)
            glance = GLANCE_START + (GLANCE_END - GLANCE_START) * fraction
            keep = min(1.0, GLANCE_FLOOR + glance * error["rate"])
            replace = torch.rand(rows, length // BLOCK + 1, generator=generator) >= keep
            mixed = coupled_inputs(inputs, predicted, replace, offset)
        g = _forward(head, target, mixed, tokens, offset)
        log_q = head.logits(target, g, full=False).log_softmax(-1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)
        first = first_in_block(length, offset)
        regression = F.smooth_l1_loss(rms(g.float()), rms(targets))
        loss = kl.mean() + config.feature_weight * regression
        error["rate"] = float((log_q.detach().argmax(-1) != log_p.argmax(-1)).float().mean())
        figures = {
            "tokens": tokens.numel(),
            "kl1": f"{float(kl.detach()[:, first].mean()):.3f}",
            "kl2": f"{float(kl.detach()[:, ~first].mean()):.3f}",
            "glanced": f"{keep:.2f}",
        }
        return loss, figures

    def evaluate() -> dict:
        metrics = evaluate_falcon_head(head, target, held_out, max_chunks=2)
        return {f"heldout_summin{k}": f"{metrics[f'token{k}']['sum_min']:.3f}" for k in ("1", "2")}

    record = run_budgeted(
        head,
        groups,
        out_dir,
        config,
        generator,
        step=step,
        initialise=initialise,
        evaluate=evaluate,
        desc="train falcon head",
        progress=progress,
    )
    held = evaluate_falcon_head(head, target, held_out)
    fields = {
        "block": BLOCK,
        "ridge_r2": record["ridge_r2"],
        "held_out_initial": record["initial"]["token1"],
        "held_out_initial_token2": record["initial"]["token2"],
        "held_out": held["token1"],
        "held_out_token2": held["token2"],
        "held_out_pass2": {"token3": held["token3"], "token4": held["token4"]},
        "draft_vocab": vocab_info,
        **(card_extra or {}),
    }
    return finish_checkpoint(head, target, out_dir, "falcon", config, record, fields)
