"""The time-budgeted, resumable optimisation loop and the final checkpoint, shared by every trained head kind.

Each kind (:mod:`executor.training.trainer` for ``feature``, :mod:`executor.training.falcon` for ``falcon``)
supplies its head, its parameter groups, a one-batch ``step`` (returns the loss to minimise and the figures to
show) and its held-out evaluation; this module runs AdamW (Loshchilov & Hutter, ICLR 2019) with a linear warm-up
over ``config.warmup_steps`` steps and a cosine decay to 0.1x over the *time* budget (each group's rate times its
``scale``), clips the gradient norm at 1, shows a progress bar, and every ``config.save_seconds`` saves the head,
the optimizer state, the step and the random state to ``train_state.pt`` (atomically), so an interrupted run --
``KeyboardInterrupt`` saves first -- continues where it stopped until the budget is spent.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from executor.files import write_bytes
from executor.training.checkpoint import model_fingerprint, read_card, save_checkpoint

__all__ = ["STATE_NAME", "agreement_sums", "finish_checkpoint", "ridge_solve", "rms", "run_budgeted"]

STATE_NAME = "train_state.pt"


def rms(x: torch.Tensor) -> torch.Tensor:
    """RMS-normalise the last axis (the scale the feature regression compares at)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def ridge_solve(x: torch.Tensor, y: torch.Tensor, ridge: float) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(W, b, R^2)`` minimising :math:`\\|y - x W^T - b\\|^2 + \\lambda \\bar g \\|W\\|^2` in float64, with
    :math:`\\bar g` the mean diagonal of the Gram matrix of ``[x, 1]`` (rows of ``x``, ``y`` are samples): the
    closed-form projection start that ``docs/drafters.md`` measured as the best single trick."""
    x = torch.cat([x.double(), torch.ones(x.shape[0], 1, dtype=torch.float64)], 1)
    y = y.double()
    gram = x.T @ x
    scale = float(gram.diagonal().mean())
    solution = torch.linalg.solve(gram + ridge * scale * torch.eye(gram.shape[0], dtype=gram.dtype), x.T @ y)
    residual = y - x @ solution
    r2 = float(1 - residual.pow(2).sum() / (y - y.mean(0)).pow(2).sum())
    return solution[:-1].T.float(), solution[-1].float(), r2


def agreement_sums(p: torch.Tensor, q_logits: torch.Tensor, vocab: torch.Tensor) -> dict:
    """Sums over rows of ``top1`` = [argmax q = argmax p], ``sum_min`` = :math:`\\sum_v \\min(p_v, q_v)` and
    ``kl`` = KL(p' || q) on the draft vocabulary (``p'`` = ``p`` renormalised there), plus the row count.

    ``p`` ``(n, V)`` probabilities; ``q_logits`` ``(n, V)`` with ``-inf`` outside ``vocab``.
    """
    q = q_logits.softmax(-1)
    p_draft = p[:, vocab] / p[:, vocab].sum(-1, keepdim=True)
    log_q = q_logits[:, vocab].log_softmax(-1)
    return {
        "top1": float((q.argmax(-1) == p.argmax(-1)).sum()),
        "sum_min": float(torch.minimum(p, q).sum()),
        "kl": float((p_draft * (p_draft.clamp_min(1e-30).log() - log_q)).sum()),
        "tokens": p.shape[0],
    }


def _save_state(path: Path, head, optimizer, progress: dict, generator) -> None:
    buffer = io.BytesIO()
    torch.save(
        {
            "head": head.state_dict(),
            "optimizer": optimizer.state_dict(),
            "progress": progress,
            "generator": generator.get_state(),
        },
        buffer,
    )
    write_bytes(buffer.getvalue(), path)


def run_budgeted(
    head: torch.nn.Module,
    groups: list[dict],
    out_dir: Path,
    config,
    generator: torch.Generator,
    *,
    step: Callable[[float], tuple[torch.Tensor, dict]],
    initialise: Callable[[], dict],
    evaluate: Callable[[], dict],
    desc: str,
    progress: bool = True,
) -> dict:
    """Optimise ``head`` for ``config.minutes`` of step time (resuming ``out_dir/train_state.pt``).

    ``step(fraction)`` (``fraction`` = share of the budget spent) computes one batch's loss and a dict of figures
    for the bar (``"tokens"`` = tokens in the batch); ``initialise()`` runs once on a fresh start (before any
    step; e.g. the initial held-out figures and the ridge start) and returns what to record; ``evaluate()``
    returns quick held-out figures for the bar every ``config.eval_seconds``. Returns the progress record
    (``steps``, ``tokens``, ``seconds`` and whatever ``initialise`` returned).
    """
    from tqdm import tqdm

    optimizer = torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay)
    state_path = out_dir / STATE_NAME
    record = {"steps": 0, "tokens": 0, "seconds": 0.0}
    if state_path.is_file():
        state = torch.load(state_path, weights_only=False)
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        record = state["progress"]
        generator.set_state(state["generator"])
    else:
        record.update(initialise())
    budget = 60.0 * config.minutes
    head.train()
    last_save = last_eval = time.perf_counter()
    status = {}
    bar = tqdm(
        total=round(budget),
        initial=round(min(record["seconds"], budget)),
        unit="s",
        desc=desc,
        disable=not progress,
    )
    try:
        max_steps = getattr(config, "max_steps", 0)
        while record["seconds"] < budget and not (max_steps and record["steps"] >= max_steps):
            start = time.perf_counter()
            fraction = record["steps"] / max_steps if max_steps else record["seconds"] / budget
            warm = min(1.0, (record["steps"] + 1) / (config.warmup_steps + 1))
            lr = config.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * fraction)))
            for group in optimizer.param_groups:
                group["lr"] = lr * group["scale"]
            loss, figures = step(fraction)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            optimizer.step()
            record["steps"] += 1
            record["tokens"] += int(figures.pop("tokens"))
            record["seconds"] += time.perf_counter() - start
            bar.update(min(round(record["seconds"]), bar.total) - bar.n)
            status.update(tokens=record["tokens"], loss=f"{float(loss.detach()):.3f}", **figures)
            now = time.perf_counter()
            if now - last_eval > config.eval_seconds:
                status.update(evaluate())
                last_eval = time.perf_counter()
            bar.set_postfix(status)
            if now - last_save > config.save_seconds:
                _save_state(state_path, head, optimizer, record, generator)
                last_save = time.perf_counter()
    except KeyboardInterrupt:
        _save_state(state_path, head, optimizer, record, generator)
        bar.close()
        raise
    bar.close()
    _save_state(state_path, head, optimizer, record, generator)
    head.eval()
    return record


def finish_checkpoint(head, target, out_dir: Path, kind: str, config, record: dict, fields: dict) -> dict:
    """Save ``head`` with its card (kind, target, recipe, budget, steps, ``fields``); returns the card."""
    card = {
        "kind": kind,
        "target": model_fingerprint(target),
        "recipe": config.recipe(),
        "minutes": config.minutes,
        "steps": record["steps"],
        "tokens": record["tokens"],
        "seconds": round(record["seconds"], 1),
        **fields,
    }
    save_checkpoint(out_dir, dict(head.state_dict()), card)
    return read_card(out_dir)
