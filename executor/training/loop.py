"""What every drafter kind's training shares: the time-budgeted resumable AdamW loop, the ridge start, the
held-out distribution metrics and the checkpoint card.

* :func:`run_budget` -- AdamW (Loshchilov & Hutter, ICLR 2019) on ``loss_step()`` with a linear warm-up over
  ``config.warmup_steps`` steps and a cosine decay to 0.1x over the *time* budget ``config.minutes``; every
  ``config.save_seconds`` the module, the optimizer, the progress and the random state go atomically to
  ``train_state.pt`` (and on ``KeyboardInterrupt``), so the same call resumes an interrupted run.
* :func:`ridge_solve` -- the closed-form least-squares map with a ridge (the projection start that
  ``docs/drafters.md`` measured as the best single trick).
* :func:`distribution_totals` -- sums over positions of ``top1`` = [argmax q = argmax p], ``sum_min`` =
  :math:`\\sum_v \\min(p_v, q_v)` (single-draft acceptance at T = 1, Leviathan et al., ICML 2023) and ``kl`` =
  KL(p' || q) on the draft vocabulary (``p`` renormalised there).
* :func:`save_card` -- the checkpoint (weights + card) with the fields every kind records.
"""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from executor.training.checkpoint import atomic_write_bytes, model_fingerprint, save_checkpoint

__all__ = ["STATE_NAME", "distribution_totals", "ridge_solve", "run_budget", "save_card"]

STATE_NAME = "train_state.pt"


def ridge_solve(x: torch.Tensor, y: torch.Tensor, ridge: float) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(W, b, R^2)`` minimising :math:`\\|y - x W^T - b\\|^2 + \\lambda \\bar g \\|W\\|^2` in float64, with
    :math:`\\bar g` the mean diagonal of the Gram matrix of ``[x, 1]`` (rows of ``x``, ``y`` are samples)."""
    x = torch.cat([x.double(), torch.ones(x.shape[0], 1, dtype=torch.float64)], 1)
    y = y.double()
    gram = x.T @ x
    scale = float(gram.diagonal().mean())
    solution = torch.linalg.solve(gram + ridge * scale * torch.eye(gram.shape[0], dtype=gram.dtype), x.T @ y)
    residual = y - x @ solution
    r2 = float(1 - residual.pow(2).sum() / (y - y.mean(0)).pow(2).sum())
    return solution[:-1].T.float(), solution[-1].float(), r2


def distribution_totals(p: torch.Tensor, q_logits: torch.Tensor, vocab: torch.Tensor) -> dict[str, float]:
    """Sums over the rows of ``top1``, ``sum_min`` and ``kl`` (see the module docstring).

    ``p`` ``(N, V)`` the target's probabilities; ``q_logits`` ``(N, V)`` the draft's logits, ``-inf`` outside
    the draft vocabulary ``vocab``.
    """
    q = q_logits.softmax(-1)
    p_draft = p[:, vocab] / p[:, vocab].sum(-1, keepdim=True)
    log_q = q_logits[:, vocab].log_softmax(-1)
    return {
        "top1": float((q.argmax(-1) == p.argmax(-1)).sum()),
        "sum_min": float(torch.minimum(p, q).sum()),
        "kl": float((p_draft * (p_draft.clamp_min(1e-30).log() - log_q)).sum()),
    }


def _save_state(path: Path, module, optimizer, progress: dict, generator) -> None:
    buffer = io.BytesIO()
    state = {
        "head": module.state_dict(),
        "optimizer": optimizer.state_dict(),
        "progress": progress,
        "generator": generator.get_state(),
    }
    torch.save(state, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def run_budget(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_step: Callable[[], tuple[torch.Tensor, int, dict]],
    out_dir: Path,
    config,
    generator: torch.Generator,
    *,
    initialise: Callable[[], float | None],
    evaluate: Callable[[], dict],
    desc: str,
    progress: bool = True,
) -> dict:
    """Train ``module`` until ``config.minutes`` of optimisation time are spent; returns the progress record.

    ``loss_step()`` draws a batch (from ``generator``) and returns ``(loss, tokens, status)``. On a fresh start
    ``evaluate()`` records the untrained held-out metrics (``progress["initial"]``) and ``initialise()`` sets
    the closed-form start (its return, e.g. a ridge R^2, goes to ``progress["ridge_r2"]``); with a
    ``train_state.pt`` in ``out_dir`` both are skipped and training resumes. Each param group's learning rate
    is ``group["scale"]`` times the schedule's.
    """
    from tqdm import tqdm

    state_path = out_dir / STATE_NAME
    record = {"steps": 0, "tokens": 0, "seconds": 0.0, "ridge_r2": None, "initial": None}
    if state_path.is_file():
        state = torch.load(state_path, weights_only=False)
        module.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        record = state["progress"]
        generator.set_state(state["generator"])
    else:
        record["initial"] = evaluate()
        record["ridge_r2"] = initialise()
    budget = 60.0 * config.minutes
    module.train()
    last_save = last_eval = time.perf_counter()
    status: dict = {}
    initial = round(min(record["seconds"], budget))
    bar = tqdm(total=round(budget), initial=initial, unit="s", desc=desc, disable=not progress)
    try:
        while record["seconds"] < budget:
            start = time.perf_counter()
            fraction = record["seconds"] / budget
            warm = min(1.0, (record["steps"] + 1) / (config.warmup_steps + 1))
            lr = config.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * fraction)))
            for group in optimizer.param_groups:
                group["lr"] = lr * group["scale"]
            loss, tokens, step_status = loss_step()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
            optimizer.step()
            record["steps"] += 1
            record["tokens"] += tokens
            record["seconds"] += time.perf_counter() - start
            bar.update(min(round(record["seconds"]), bar.total) - bar.n)
            status.update(tokens=record["tokens"], loss=f"{float(loss.detach()):.3f}", **step_status)
            now = time.perf_counter()
            if now - last_eval > config.eval_seconds:
                status["heldout_summin"] = f"{evaluate()['sum_min']:.3f}"
                module.train()
                last_eval = time.perf_counter()
            bar.set_postfix(status)
            if now - last_save > config.save_seconds:
                _save_state(state_path, module, optimizer, record, generator)
                last_save = time.perf_counter()
    except KeyboardInterrupt:
        _save_state(state_path, module, optimizer, record, generator)
        bar.close()
        raise
    bar.close()
    _save_state(state_path, module, optimizer, record, generator)
    module.eval()
    return record


def save_card(
    out_dir: Path, head: torch.nn.Module, target, kind: str, config, record: dict, fields: dict
) -> dict:
    """Save ``head``'s weights with a card naming ``kind``, the target, the recipe and the training record."""
    card = {
        "kind": kind,
        "target": model_fingerprint(target),
        "recipe": config.recipe(),
        "minutes": config.minutes,
        "steps": record["steps"],
        "tokens": record["tokens"],
        "seconds": round(record["seconds"], 1),
        "ridge_r2": record["ridge_r2"],
        "held_out_initial": record["initial"],
        **fields,
    }
    save_checkpoint(out_dir, dict(head.state_dict()), card)
    return json.loads((out_dir / "card.json").read_text())
