"""Parallel prompt decoding (PPD; Chen et al., "Hardware-Aware Parallel Prompt Decoding for Memory-Efficient
Acceleration of LLM Inference", arXiv 2405.18628).

``k`` trained *prompt tokens* -- embeddings :math:`e_1, \\dots, e_k` that are not in the vocabulary -- are
appended after a token :math:`x_t` at RoPE positions :math:`t + 1, \\dots, t + k`; each attends to the
context up to :math:`x_t` and to the prompt tokens before it, and the target's own output at :math:`e_j` is a
guess of token :math:`x_{t+1+j}`. Only the embeddings learn (``k * d`` parameters), by distillation on the
target's distributions: the loss at :math:`e_j` is :math:`\\mathrm{KL}(p_{t+j} \\,\\|\\, q_j)`, where
:math:`p_{t+j}` is the target's next-token law at the real position :math:`t + j` (the law of
:math:`x_{t+1+j}`), computed in the same no-grad prefill of a corpus window (the standard library of
:mod:`executor.training.corpus`); :func:`train_prompt_tokens` runs a fixed number of Adam steps (optionally
capped in seconds) and :func:`cached_prompt_tokens` caches the result per (target, recipe).

**Decoding.** One target pass per step scores a tree of drafts (root = the last emitted token; the children of
every node at depth ``d - 1`` are the top tokens of, or draws from, the previous step's guess ``q_d``) *and*
``m`` prompt tokens attached to every node, each at its own KV slot after the tree (tree attention: prefix,
the node's path, its earlier prompt tokens). Every node is verified by the multi-draft verifier of
:class:`executor.decoders.TreeDecoder`; the guesses for the next step are the prompt-token outputs of the last
accepted node, whose successor is the emitted token, so ``e_j`` there guesses the next step's depth-``j``
drafts. The drafts at a node are drawn from :math:`q_d` (temperature-processed like the target) and the
verifier is given that :math:`q_d`: lossless for any guess law (it does not depend on the verification's
randomness).

**The tree** is PPD's hardware-aware sparse tree: the one :func:`theory.plan_tree` chooses for the guesses'
acceptance per depth and sibling rank and the measured cost of a pass over ``n (m + 1)`` positions (``n``
nodes, each with the first ``m`` prompt tokens), over trees and ``m``. Departures: PPD's *ensemble* prompt
tokens (several embeddings averaged per position) are reduced to one embedding per position, and every node of
a step carries the same number ``m`` of prompt tokens (the paper lets it vary from node to node).
"""

from __future__ import annotations

import io
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from executor.decoders import TreeDecoder
from executor.decoders.base import DraftTree, commit_path, tree_step_log
from executor.files import write_bytes
from executor.logs import StepLog
from executor.methods.base import Method, Prediction
from theory.checks import as_choice, as_count
from theory.trees import Tree

__all__ = [
    "PPD",
    "Guesses",
    "PPDDecoder",
    "PromptTokens",
    "evaluate_prompt_tokens",
    "prompt_forward",
    "train_prompt_tokens",
]

KIND = "ppd"


class PromptTokens(nn.Module):
    """``count`` trainable embeddings of the target's width, initialised at the mean token embedding plus
    noise of the embeddings' scale (seeded)."""

    def __init__(self, target, count: int, seed: int = 0) -> None:
        super().__init__()
        count = as_count(count, "prompt_tokens")
        table = target.tok_embeddings.weight.detach().float()
        generator = torch.Generator().manual_seed(seed)
        noise = torch.randn(count, table.shape[1], generator=generator) * table.std(0)
        self.embeddings = nn.Parameter(table.mean(0) + 0.1 * noise)

    @property
    def count(self) -> int:
        return self.embeddings.shape[0]


def prompt_forward(target, prompts: PromptTokens, tokens, prompt_rows, slots, positions, mask):
    """Logits ``(len(tokens) + len(prompt_rows), V)`` of one target pass over real ``tokens`` followed by the
    prompt embeddings ``prompt_rows`` (indices into ``prompts``), writing K/V at ``slots``.

    ``positions`` are the RoPE positions of all rows, ``mask`` the boolean ``(rows, S)`` attention mask.
    """
    weight = target.tok_embeddings.weight
    device = weight.device
    x = prompts.embeddings[torch.as_tensor(prompt_rows, device=device)].to(weight.dtype)[None]
    if len(tokens):
        real = target.tok_embeddings(torch.as_tensor(tokens, dtype=torch.long, device=device).reshape(1, -1))
        x = torch.cat([real, x], 1)
    slots = torch.as_tensor(slots, device=device)
    cos, sin = target._rope(torch.as_tensor(positions, device=device))
    width, additive = target._additive_mask(slots, mask.to(device), x.dtype)
    logits, _ = target.layers_and_head(x, cos, sin, slots, additive, width, target.config.n_layers)
    return logits[0]


def _tree_layout(committed: int, tree: DraftTree, count: int):
    """Slots, positions and mask of the ``len(tree)`` nodes (root first, slot ``committed + v``) with
    ``count`` prompt tokens per node after them: prompt ``j`` of node ``v`` sits at RoPE position
    ``committed + depth(v) + 1 + j`` and sees the prefix, ``v``'s path and ``v``'s earlier prompt tokens."""
    nodes = len(tree)
    width = committed + nodes * (1 + count)
    slots = list(range(committed, width))
    positions = [committed + tree.depths[v] for v in range(nodes)]
    mask = torch.zeros(nodes * (1 + count), width, dtype=torch.bool)
    mask[:nodes, : committed + nodes] = tree.attention_mask(list(range(nodes)), committed)
    for v in range(nodes):
        first = committed + nodes + v * count
        for j in range(count):
            row = nodes + v * count + j
            positions.append(committed + tree.depths[v] + 1 + j)
            mask[row, : committed + nodes] = mask[v, : committed + nodes]
            mask[row, first : first + j + 1] = True
    return slots, positions, mask


class Guesses:
    """PPD's drafter: the prompt-token outputs of the last step's last accepted node, one law per depth.

    Every node at depth ``d - 1`` draws its children from the same guess ``q_d``: the guesses come out of the
    previous verification pass and do not condition on the tokens drafted above them. Before the first step
    (and beyond the last guess) there is nothing to draft.
    """

    deterministic = False
    name = "ppd-guesses"

    def __init__(self) -> None:
        self.logits: torch.Tensor | None = None

    def check_target(self, target) -> None:
        pass

    def start(self, prompt, cache_slots) -> None:
        self.logits = None

    def draft_logits(self, state, tree, nodes):
        depths = [tree.depths[v] for v in nodes]
        if self.logits is None or max(depths) >= len(self.logits):
            return None
        return self.logits[depths]

    def commit(self, state, tree, accepted_path) -> None:
        pass  # the decoder sets the next guesses from its verification pass


def chain_parents(length: int) -> list[int]:
    """Parent array of a chain of ``length`` drafts under the root."""
    return [-1, *range(length)]


class PPDDecoder(TreeDecoder):
    """Tree speculative decoding whose drafts are the target's own prompt-token guesses from the last step.

    ``guesses`` (default ``prompts.count``): the first ``guesses`` prompt tokens are attached to every node
    (prompt token ``j`` sees only the ones before it, so fewer give the same guesses for depths up to
    ``guesses``). ``tree`` (parent array, depth at most ``guesses``; default: the chain of ``guesses``
    drafts) is the static shape; children are drawn as :class:`executor.decoders.TreeDecoder` draws them (the
    top tokens at temperature 0, else without replacement for ``verifier="rrs_wor"``) and verified by its
    multi-draft verifier at every node.
    """

    name = "ppd"

    def __init__(
        self,
        target,
        prompts: PromptTokens,
        *,
        tree=None,
        guesses: int | None = None,
        verifier: str = "rrs_wor",
        sampling=None,
        log_distributions="none",
    ):
        guesses = prompts.count if guesses is None else as_count(guesses, "guesses")
        if guesses > prompts.count:
            raise ValueError(f"guesses must be at most the {prompts.count} prompt tokens, got {guesses}")
        tree = chain_parents(guesses) if tree is None else list(tree)
        super().__init__(
            target,
            Guesses(),
            tree=tree,
            verifier=verifier,
            sampling=sampling,
            log_distributions=log_distributions,
        )
        depth = Tree(self.shape).depth
        if depth > guesses:
            raise ValueError(f"tree has depth {depth}, deeper than the {guesses} guesses per step")
        self.prompts = prompts
        self.guesses = guesses
        self.verified_widths: list[int] = []

    @property
    def max_tree_size(self) -> int:
        return len(self.shape) * (self.guesses + 1)

    def step(self, state, generator) -> StepLog:
        committed = state.committed
        tree = self.draft(state, generator)
        n, k = len(tree), self.guesses
        slots, positions, mask = _tree_layout(committed, tree, k)
        rows = [j for _ in range(n) for j in range(k)]
        logits = prompt_forward(self.target, self.prompts, tree.tokens, rows, slots, positions, mask)
        self.verified_widths.append(len(slots))
        target_probs = self.sampling.probs(logits[:n])
        outcome = self.verify(tree, target_probs, generator)
        commit_path(self.target, committed, outcome.path)
        last = outcome.path[-1]
        self.drafter.logits = logits[n + last * k : n + (last + 1) * k]
        emitted = [tree.tokens[v] for v in outcome.path[1:]] + [outcome.token]
        state.tokens.extend(emitted)
        return tree_step_log(tree, outcome.path, emitted, target_probs, self.log_distributions, False)


def _training_windows(target, tokenizer, window: int, max_tokens: int):
    """Train and held-out windows of the standard-library corpus (:mod:`executor.training.corpus`)."""
    from executor.training.corpus import load_corpus, tokenize_chunks

    corpus = load_corpus(None)
    eos = getattr(tokenizer, "eos_id", None)
    train = tokenize_chunks(corpus.train, tokenizer.encode, eos, window, max_tokens)
    return train, tokenize_chunks(corpus.held_out, tokenizer.encode, eos, window, 16 * window)


def _anchor_layout(length: int, points: list[int], count: int):
    """Slots, positions, prompt rows, mask and teacher rows of ``count`` prompt tokens after each anchor ``t``
    of a prefilled window of ``length`` tokens: slots after the window, positions ``t + 1 + j``, attending to
    tokens ``<= t`` and the anchor's earlier prompt tokens; prompt ``j`` is taught by the row ``t + 1 + j``."""
    rows = len(points) * count
    slots = list(range(length, length + rows))
    positions, prompt_rows, wanted = [], [], []
    mask = torch.zeros(rows, length + rows, dtype=torch.bool)
    for a, t in enumerate(points):
        for j in range(count):
            row = a * count + j
            positions.append(t + 1 + j)
            prompt_rows.append(j)
            wanted.append(t + 1 + j)
            mask[row, : t + 1] = True
            mask[row, length + a * count : length + row + 1] = True
    return slots, positions, prompt_rows, mask, wanted


def _window_loss(target, prompts: PromptTokens, window: list[int], points: list[int]):
    """Mean KL(p_{t+1+j} || q_j) over the anchors ``points`` of one window, and top-1 agreement per depth."""
    length, count = len(window), prompts.count
    target.setup_cache(length + len(points) * count)
    with torch.no_grad():
        teacher = target(torch.tensor([window]), torch.arange(length))[0].log_softmax(-1)
    slots, positions, rows, mask, wanted = _anchor_layout(length, points, count)
    logits = prompt_forward(target, prompts, [], rows, slots, positions, mask)
    log_p, log_q = teacher[wanted], logits.log_softmax(-1)
    loss = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    agree = (logits.detach().argmax(-1) == log_p.argmax(-1)).float().reshape(len(points), count).mean(0)
    return loss, agree


def evaluate_prompt_tokens(target, prompts: PromptTokens, windows: list[list[int]], stride: int = 2) -> dict:
    """Held-out ``kl`` and ``top1_by_depth`` over every ``stride``-th anchor of ``windows`` (deterministic)."""
    kls, agrees = [], []
    with torch.no_grad():
        for window in windows:
            points = list(range(0, len(window) - prompts.count - 1, stride))
            loss, agree = _window_loss(target, prompts, window, points)
            kls.append(float(loss))
            agrees.append(agree)
    return {"kl": float(np.mean(kls)), "top1_by_depth": torch.stack(agrees).mean(0).tolist()}


def train_prompt_tokens(
    target,
    windows: list[list[int]],
    count: int,
    *,
    seconds: float | None = None,
    held_out: list[list[int]] | None = None,
    anchors: int = 8,
    lr: float = 1e-2,
    seed: int = 0,
    max_steps: int | None = None,
    progress: bool = False,
    schedule: str = "constant",
    resume=None,
    save_every: int = 20,
) -> tuple[PromptTokens, dict]:
    """Distil ``count`` prompt tokens for ``max_steps`` steps (stopping early after ``seconds``, if given) on
    corpus ``windows``; at least one of the two must be given.

    Each step: a no-grad prefill of one window gives the teacher laws; ``anchors`` random positions get the
    prompt tokens (:func:`_anchor_layout`); loss = mean KL(p || q_j); Adam on the embeddings only, at
    ``lr`` times the standard deviation of the target's token embeddings, constant or (``schedule="cosine"``,
    needs ``max_steps``) decayed as :math:`\\tfrac12(1 + \\cos(\\pi s / S))`. With ``resume`` (a file path) the
    embeddings, Adam's moments, the step and the sampler's state are written there atomically every
    ``save_every`` steps and read back on the next call, so an interrupted job continues where it stopped.
    Returns the prompt tokens and a card (steps, seconds, CPU seconds, and :func:`evaluate_prompt_tokens` on
    ``held_out`` before and after training).
    """
    from tqdm import tqdm

    if getattr(target, "quantization", None) is not None:
        raise ValueError(
            f"target is quantised ({target.quantization}): PPD trains its prompt tokens by backpropagating through "
            "the target, and the int8 kernel has no derivative; train them on the float target (same cache key: "
            "the int8 model then reuses them)"
        )
    if seconds is None and max_steps is None:
        raise ValueError("seconds and max_steps are both None: give a step count or a time budget")
    if not windows:
        raise ValueError("windows is empty: give at least one training window")
    length = len(windows[0])
    if length < count + 3:
        raise ValueError(f"windows must hold at least {count + 3} tokens, got {length}")
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"schedule must be 'constant' or 'cosine', got {schedule!r}")
    if schedule == "cosine" and max_steps is None:
        raise ValueError("schedule 'cosine' needs max_steps (the length of the decay)")
    save_every = as_count(save_every, "save_every")
    prompts = PromptTokens(target, count, seed)
    held_out = held_out or windows[:2]
    # The rate is relative to the embeddings' scale (unit-scale tiny models, ~0.05 for SmolLM2).
    base_lr = lr * float(target.tok_embeddings.weight.float().std())
    optimizer = torch.optim.Adam(prompts.parameters(), lr=base_lr)
    generator = torch.Generator().manual_seed(seed)
    steps, spent, cpu_spent, initial = 0, 0.0, 0.0, None
    if resume is not None and Path(resume).is_file():
        saved = torch.load(resume, weights_only=False)
        with torch.no_grad():
            prompts.embeddings.copy_(saved["embeddings"])
        optimizer.load_state_dict(saved["optimizer"])
        generator.set_state(saved["generator"])
        steps, spent, cpu_spent, initial = (
            saved["steps"],
            saved["seconds"],
            saved["cpu_seconds"],
            saved["initial"],
        )
    if initial is None:
        initial = evaluate_prompt_tokens(target, prompts, held_out)

    def save_state() -> None:
        if resume is not None:
            buffer = io.BytesIO()
            state = {
                "embeddings": prompts.embeddings.detach().clone(),
                "optimizer": optimizer.state_dict(),
                "generator": generator.get_state(),
                "steps": steps,
                "seconds": spent + time.perf_counter() - start,
                "cpu_seconds": cpu_spent + time.process_time() - cpu_start,
                "initial": initial,
            }
            torch.save(state, buffer)
            write_bytes(buffer.getvalue(), Path(resume))

    start, cpu_start = time.perf_counter(), time.process_time()
    bar = tqdm(
        total=max_steps, initial=steps, desc="train PPD prompt tokens", unit="step", disable=not progress
    )
    while (max_steps is None or steps < max_steps) and (
        seconds is None or spent + time.perf_counter() - start < seconds
    ):
        if schedule == "cosine":
            for group in optimizer.param_groups:
                group["lr"] = base_lr * 0.5 * (1.0 + math.cos(math.pi * steps / max_steps))
        window = windows[int(torch.randint(len(windows), (1,), generator=generator))]
        points = torch.randint(0, length - count - 1, (anchors,), generator=generator).tolist()
        with torch.enable_grad():
            loss, _ = _window_loss(target, prompts, window, points)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        steps += 1
        bar.update(1)
        bar.set_postfix(kl=f"{float(loss.detach()):.3f}")
        if steps % save_every == 0:
            save_state()
    bar.close()
    card = {
        "kind": KIND,
        "prompt_tokens": count,
        "steps": steps,
        "seconds": round(spent + time.perf_counter() - start, 1),
        "cpu_seconds": round(cpu_spent + time.process_time() - cpu_start, 1),
        "anchors_per_step": anchors,
        "window": length,
        "lr": lr,
        "schedule": schedule,
        "held_out_initial": initial,
        "held_out": evaluate_prompt_tokens(target, prompts, held_out),
    }
    return prompts, card


def cached_prompt_tokens(
    target,
    tokenizer,
    count: int,
    steps: int,
    *,
    window: int = 128,
    anchors: int = 24,
    lr: float = 1e-1,
    seed: int = 0,
    schedule: str = "cosine",
):
    """Train ``steps`` Adam steps once per (target, recipe) and cache under
    ``$XDG_CACHE_HOME/specbound/drafters/ppd-*`` (a step count, not a time budget, so that the cached tokens
    do not depend on the machine's load). The job is resumable: its state is saved in that directory's
    ``partial.pt`` every 20 steps and picked up by the next call with the same recipe."""
    from executor.training.checkpoint import (
        CARD_NAME,
        default_checkpoint_dir,
        load_checkpoint,
        model_fingerprint,
        read_card,
        save_checkpoint,
    )

    recipe = {
        "prompt_tokens": count,
        "steps": steps,
        "window": window,
        "anchors": anchors,
        "lr": lr,
        "seed": seed,
        "corpus": "stdlib",
    }
    if schedule != "constant":  # entries trained before the schedule existed keep their key
        recipe["schedule"] = schedule
    directory = default_checkpoint_dir(KIND, model_fingerprint(target), recipe)
    prompts = PromptTokens(target, count, seed)
    if (directory / CARD_NAME).is_file():
        tensors, card = load_checkpoint(directory, target=target, kind=KIND)
        with torch.no_grad():
            prompts.embeddings.copy_(tensors["embeddings"])
        return prompts, {**card, "cached": True}
    windows, held_out = _training_windows(target, tokenizer, window, max_tokens=max(256 * window, 8192))
    prompts, card = train_prompt_tokens(
        target,
        windows,
        count,
        max_steps=steps,
        held_out=held_out,
        anchors=anchors,
        lr=lr,
        seed=seed,
        progress=True,
        schedule=schedule,
        resume=directory / "partial.pt",
    )
    save_checkpoint(
        directory, {"embeddings": prompts.embeddings.detach()}, {**card, "target": model_fingerprint(target)}
    )
    (directory / "partial.pt").unlink(missing_ok=True)
    return prompts, {**read_card(directory), "cached": False}


class PPD(Method):
    """PPD with ``prompt_tokens`` (3) trained for ``train_steps`` Adam steps (200 on a cosine schedule, about
    6 CPU-minutes; cached, resumable); ``prompts`` passes trained :class:`PromptTokens` directly (tests).

    ``tree="planned"`` (default): PPD's hardware-aware tree. :meth:`predict` measures the guesses' acceptance
    per depth and sibling rank on the calibration prompts (:func:`~executor.methods.dyspec.calibration_tree`
    with ``width`` children per level) and the cost of a pass over ``n (m + 1)`` positions (``n`` tree nodes,
    each with the first ``m`` of the ``k`` prompt tokens) for ``n = 1 .. budget`` and ``m = 1 .. k``;
    :func:`theory.plan_tree` picks, for each ``m``, the tree of depth at most ``m`` with the most tokens per
    unit of that cost (no draft passes: the guesses come out of the verification pass), and the best ``m``
    wins. ``guesses`` fixes ``m``. Until then, and for ``tree="chain"``, the tree is the chain of ``m``
    guesses (default ``k``); a parent array (depth at most ``m``) fixes the tree.
    """

    name = "ppd"
    paper = "Parallel prompt decoding (PPD), Chen et al., arXiv 2405.18628"

    def __init__(
        self,
        target,
        tokenizer=None,
        *,
        prompt_tokens: int = 3,
        train_steps: int = 200,
        prompts=None,
        tree: str = "planned",
        width: int = 3,
        budget: int = 8,
        guesses: int | None = None,
    ):
        super().__init__(target, tokenizer)
        self.count = as_count(prompt_tokens, "prompt_tokens")
        self.train_steps = as_count(train_steps, "train_steps")
        if prompts is not None:
            if not isinstance(prompts, PromptTokens):
                raise ValueError(f"prompts must be PromptTokens, got {type(prompts).__name__}")
            self.count = prompts.count
        self.prompts = prompts
        self.width = as_count(width, "width")
        self.budget = as_count(budget, "budget", minimum=2)
        self.fixed_guesses = None if guesses is None else as_count(guesses, "guesses")
        if self.fixed_guesses is not None and self.fixed_guesses > self.count:
            raise ValueError(f"guesses must be at most the {self.count} prompt tokens, got {guesses}")
        self.guesses = self.fixed_guesses or self.count
        self.parents = chain_parents(self.guesses)
        if isinstance(tree, str):
            self.tree_kind = as_choice(tree, "tree", ("planned", "chain"))
        else:
            given = Tree(tree)
            if given.depth > self.guesses:
                raise ValueError(
                    f"tree has depth {given.depth}, deeper than the {self.guesses} guesses per step"
                )
            self.tree_kind, self.parents = "given", given.parents.tolist()
        self.card: dict = {}

    def options(self) -> dict:
        return {
            "prompt_tokens": self.count,
            "train_steps": self.train_steps,
            "tree": self.tree_kind,
            "width": self.width,
            "budget": self.budget,
            "guesses": self.guesses,
            "parents": self.parents,
        }

    def ensure_trained(self) -> float:
        """Train (or load) the prompt tokens if none were given; returns the seconds their training took
        (when it ran, or when the cached tokens were trained; 0 for prompt tokens passed in)."""
        if self.prompts is None:
            if self.tokenizer is None:
                raise ValueError(
                    "ppd needs a tokenizer (to tokenize its training corpus) or trained prompts="
                )
            self.prompts, self.card = cached_prompt_tokens(
                self.target, self.tokenizer, self.count, self.train_steps
            )
        return float(self.card.get("seconds", 0.0))

    def build(self, temperature: float = 0.0):
        self.ensure_trained()
        return PPDDecoder(
            self.target,
            self.prompts,
            tree=self.parents,
            guesses=self.guesses,
            sampling=self.sampling(temperature),
        )

    def extra(self, decoder) -> dict:
        widths = decoder.verified_widths
        # The guesses come out of the verification pass itself: no sequential draft pass.
        return {"mean_verified_width": float(np.mean(widths)) if widths else 0.0, "draft_passes": 0}

    def predict(self, calibration_prompts, temperature, max_new_tokens):
        """Per-depth, per-rank acceptance of the guesses on the calibration prompts and the measured cost of a
        step per tree size -> the tree (planned or the chain) and :func:`theory.tree_expected_tokens`; the
        predicted speedup is that over the step's cost against a one-token pass."""
        import theory
        from executor.methods.calibration import depth_acceptance, forward_time_ratio
        from executor.methods.dyspec import calibration_tree

        train = self.ensure_trained()
        steps = []
        for index, prompt in enumerate(calibration_prompts):
            decoder = PPDDecoder(
                self.target,
                self.prompts,
                tree=calibration_tree(self.count, self.width),
                sampling=self.sampling(temperature),
            )
            generator = torch.Generator().manual_seed(1000 + index)
            steps += decoder.generate(prompt, max_new_tokens, generator=generator).steps
        acceptance = depth_acceptance(steps, self.count, self.width)
        # Prompt token j sees only the ones before it, so the guesses of depths 1..m are the same with m
        # attached: n nodes with m prompt tokens each cost a pass over n (m + 1) positions.
        widths: dict[int, float] = {}

        def cost(nodes: int, guesses: int) -> float:
            width = nodes * (guesses + 1)
            if width not in widths:
                widths[width] = forward_time_ratio(self.target, None, tokens=width)
            return widths[width]

        plans = {}
        for guesses in [self.fixed_guesses] if self.fixed_guesses else range(1, self.count + 1):
            table = {nodes: cost(nodes, guesses) for nodes in range(1, self.budget + 1)}
            plans[guesses] = theory.plan_tree(
                acceptance.table[:guesses],
                table,
                0.0,
                max_budget=self.budget,
                max_depth=guesses,
                max_width=self.width,
            )
        # No draft passes: step_time is the pass's cost in one-token passes, so G / step_time is the speedup.
        best = max(plans, key=lambda m: (plans[m].expected_tokens / plans[m].step_time, -m))
        if self.tree_kind == "planned":
            self.guesses, self.parents = best, plans[best].tree.parents.tolist()
        tau = float(theory.tree_expected_tokens(Tree(self.parents), acceptance.table))
        step_cost = cost(len(self.parents), self.guesses)
        details = {
            **acceptance.details(),
            "model": f"tree_expected_tokens(per-depth acc) on the {self.tree_kind} tree",
            "depth_aware": True,
            "guesses": self.guesses,
            "parents": self.parents,
            "planned": {
                str(m): {
                    "parents": plan.tree.parents.tolist(),
                    "expected_tokens": plan.expected_tokens,
                    "step_cost": plan.step_time,
                    "speedup": plan.expected_tokens / plan.step_time,
                }
                for m, plan in plans.items()
            },
            "step_width": len(self.parents) * (self.guesses + 1),
            "step_cost_by_width": {str(w): c for w, c in sorted(widths.items())},
            "step_cost_vs_one_token": step_cost,
            "predicted_speedup": tau / step_cost if step_cost else math.nan,
            "training": self.card,
        }
        return Prediction(tau, details, train_seconds=train)
