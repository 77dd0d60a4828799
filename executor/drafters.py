"""Drafters: what proposes the draft tokens, behind one small protocol.

A drafter answers one question: *given the committed context and a partially drafted token tree, what are
the draft logits at these tree nodes* (the distribution of their children)? The decoder turns the logits
into ``q`` with the same temperature/top-k/top-p as the target, draws the children, and grows the tree one
level per call, so the same drafter serves chains (one node per level), multi-draft (the root only) and
trees. Stop rules (how long a chain to draft) are a separate, pluggable policy on the decoder
(:class:`executor.decoders.chain.ConfidenceStop`).

Drafters here:

* :class:`EarlyExitDrafter` -- the target's own first ``k`` layers through its final norm and LM head
  (self-speculation; LayerSkip, Elhoushi et al., ACL 2024, arXiv 2404.16710). It shares the target's KV cache:
  the K/V it writes for layers ``< k`` at a tree slot are exactly what the full verification pass writes
  there, so it needs no cache of its own.
* :class:`ModelDrafter` -- a separate (smaller) model with the same vocabulary and its own KV cache, caught up
  on the committed tokens it has not seen at the start of each step.
* :class:`PromptLookupDrafter` -- n-gram prompt lookup (PLD, Saxena 2023; Hugging Face
  ``PromptLookupCandidateGenerator``): the longest suffix n-gram (``max_ngram`` down to 1) of the context is
  searched for, first occurrence first, and the tokens that followed it are proposed. Its drafts are
  deterministic: ``q`` is one-hot, and lossless verification treats it so (logs say ``deterministic_drafts``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import torch

from executor.decoders.base import DecodingState, DraftTree, commit_path, run_tree
from theory._validation import as_count

__all__ = [
    "Drafter",
    "EarlyExitDrafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "parse_drafter",
]

#: Drafter names on the command line (before the optional ``:ARGUMENT``).
DRAFTER_KINDS = ("early-exit", "ngram", "model")


@runtime_checkable
class Drafter(Protocol):
    """The interface every drafter implements.

    Attributes
    ----------
    name : str
        As written on the command line (``"early-exit:K"``, ``"ngram"``, ``"model:PATH"``).
    deterministic : bool
        ``True`` when the proposals are not samples (one-hot ``q``).
    """

    name: str
    deterministic: bool

    def check_target(self, target) -> None:
        """Raise ``ValueError`` if this drafter cannot draft for ``target`` (e.g. another vocabulary)."""

    def start(self, prompt: list[int], cache_slots: int) -> None:
        """Begin a generation after ``prompt`` (the target has prefilled ``prompt[:-1]``)."""

    def draft_logits(self, state: DecodingState, tree: DraftTree, nodes: list[int]) -> torch.Tensor | None:
        """Draft logits ``(len(nodes), V)`` for the children of tree ``nodes``, or ``None`` to stop drafting.

        Node ``v`` stands for the context ``state.tokens + tree path to v`` (the root is
        ``state.tokens[-1]``); in the target's cache it occupies slot ``state.committed + v``. Entries
        ``-inf`` mark tokens the drafter never proposes.
        """

    def commit(self, state: DecodingState, tree: DraftTree, accepted_path: list[int]) -> None:
        """The step accepted ``accepted_path`` (root first); called before ``state.tokens`` is extended."""


def _check_same_vocabulary(draft_vocab: int, target, what: str) -> None:
    if draft_vocab != target.config.vocab_size:
        raise ValueError(
            f"{what} has a vocabulary of {draft_vocab} tokens but the target has {target.config.vocab_size}; "
            "draft and target must share one vocabulary"
        )


class EarlyExitDrafter:
    """Draft with the target's first ``exit_layer`` layers, sharing its KV cache (LayerSkip self-speculation).

    Parameters
    ----------
    target : executor.model.Transformer
        The target model (the same object the decoder verifies with).
    exit_layer : int
        ``1 <= exit_layer < target.config.n_layers``.
    """

    deterministic = False

    def __init__(self, target, exit_layer: int) -> None:
        exit_layer = as_count(exit_layer, "exit_layer")
        if exit_layer >= target.config.n_layers:
            raise ValueError(
                f"exit_layer must be below the target's {target.config.n_layers} layers, got {exit_layer}"
            )
        self.model = target
        self.exit_layer = exit_layer
        self.name = f"early-exit:{exit_layer}"

    def check_target(self, target) -> None:
        if target is not self.model:
            raise ValueError("an EarlyExitDrafter must be built on the target model it drafts for")

    def start(self, prompt: list[int], cache_slots: int) -> None:
        pass  # the target's prefill already wrote every layer

    def draft_logits(self, state, tree, nodes):
        return run_tree(self.model, tree, nodes, state.committed, exit_layer=self.exit_layer)

    def commit(self, state, tree, accepted_path) -> None:
        pass  # the verification pass overwrote these slots in every layer; the target's commit compacts them


class ModelDrafter:
    """A separate draft model with its own static KV cache (Leviathan et al. 2023's small model).

    Its cache mirrors the target's slot layout: committed tokens in slots ``[0, length)``, tree node ``v`` in
    slot ``committed + v``. After a step, the accepted nodes it has already run are compacted like the
    target's, and the rest of the committed text is fed at the start of the next step.
    """

    deterministic = False

    def __init__(self, model, name: str = "model") -> None:
        self.model = model
        self.name = name
        self.length = 0  # slots [0, length) of the draft cache hold committed tokens
        self._fed: set[int] = set()

    def check_target(self, target) -> None:
        if target is self.model:
            raise ValueError(
                "a ModelDrafter needs its own model; to draft with the target's layers use early-exit"
            )
        _check_same_vocabulary(self.model.config.vocab_size, target, "the draft model")

    def start(self, prompt: list[int], cache_slots: int) -> None:
        if cache_slots > self.model.config.max_seq_len:
            raise ValueError(
                f"the draft model's context ({self.model.config.max_seq_len}) is shorter than the "
                f"{cache_slots} positions this generation needs"
            )
        self.model.setup_cache(cache_slots)
        self.length = 0
        self._fed = set()

    def draft_logits(self, state, tree, nodes):
        committed = state.committed
        if nodes == [0]:
            # Catch up on committed tokens this model has not run, then the root, in one causal pass.
            device = self.model.tok_embeddings.weight.device
            tokens = state.tokens[self.length : committed + 1]
            logits = self.model(
                torch.tensor([tokens], device=device), torch.arange(self.length, committed + 1, device=device)
            )[0, -1:]
            self.length = committed
            self._fed = {0}
            return logits
        self._fed.update(nodes)
        return run_tree(self.model, tree, nodes, committed)

    def commit(self, state, tree, accepted_path) -> None:
        committed = state.committed
        kept = 0
        for node in accepted_path:
            if node not in self._fed:
                break
            kept += 1
        commit_path(self.model, committed, accepted_path[:kept])
        self.length = committed + kept
        self._fed = set()


class PromptLookupDrafter:
    """n-gram prompt lookup: propose the tokens that followed an earlier occurrence of the context's suffix.

    For the root, the last ``n`` tokens (``n = max_ngram, ..., 1``) are searched for in the context, first
    occurrence first (Hugging Face's rule); the tokens after the match (up to ``max_tokens``) are the
    proposal, served one per tree level along the drafted path. ``q`` is one-hot (logits 0 on the proposed
    token, ``-inf`` elsewhere); ``None`` (no proposal) ends drafting.
    """

    deterministic = True
    name = "ngram"

    def __init__(self, max_ngram: int = 3, max_tokens: int = 64) -> None:
        self.max_ngram = as_count(max_ngram, "max_ngram")
        self.max_tokens = as_count(max_tokens, "max_tokens")
        self.vocab_size = 0
        self.device = torch.device("cpu")
        self._proposal: list[int] = []

    def check_target(self, target) -> None:
        # Prompt lookup drafts from the target's own vocabulary, so it adopts its size and device.
        self.vocab_size = target.config.vocab_size
        self.device = target.tok_embeddings.weight.device

    def start(self, prompt: list[int], cache_slots: int) -> None:
        self._proposal = []

    def propose(self, context: list[int]) -> list[int]:
        """The continuation after the first earlier occurrence of the longest matching suffix n-gram."""
        array = np.asarray(context)
        for n in range(min(self.max_ngram, len(context) - 1), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(array[:-1], n)
            hits = np.flatnonzero((windows == array[-n:]).all(axis=1))
            if hits.size:
                start = int(hits[0]) + n
                return context[start : start + self.max_tokens]
        return []

    def draft_logits(self, state, tree, nodes):
        if nodes == [0]:
            self._proposal = self.propose(state.tokens)
        rows = []
        for node in nodes:
            path = [tree.tokens[v] for v in tree.path(node)[1:]]
            depth = len(path)
            if depth >= len(self._proposal) or path != self._proposal[:depth]:
                return None
            row = torch.full((self.vocab_size,), float("-inf"))
            row[self._proposal[depth]] = 0.0
            rows.append(row)
        return torch.stack(rows).to(self.device)

    def commit(self, state, tree, accepted_path) -> None:
        pass


def parse_drafter(spec: str, target, *, load=None):
    """Build a drafter from its command-line name.

    ``"early-exit:K"`` -> :class:`EarlyExitDrafter` on ``target`` with ``exit_layer = K``; ``"ngram"`` (or
    ``"ngram:N"`` for ``max_ngram = N``) -> :class:`PromptLookupDrafter`; ``"model:PATH"`` ->
    :class:`ModelDrafter` on the model ``load(PATH)`` returns (``load`` defaults to
    :func:`executor.weights.load_model`, returning ``(model, tokenizer)``).
    """
    if not isinstance(spec, str):
        raise ValueError(
            f"drafter must be a string such as 'early-exit:8', 'ngram' or 'model:PATH'; got {spec!r}"
        )
    kind, _, argument = spec.partition(":")
    if kind == "early-exit":
        if not argument.isdigit():
            raise ValueError(f"drafter 'early-exit:K' needs an integer exit layer K; got {spec!r}")
        return EarlyExitDrafter(target, int(argument))
    if kind == "ngram":
        if argument and not argument.isdigit():
            raise ValueError(f"drafter 'ngram:N' needs an integer n-gram size N; got {spec!r}")
        return PromptLookupDrafter(int(argument)) if argument else PromptLookupDrafter()
    if kind == "model":
        if not argument:
            raise ValueError("drafter 'model:PATH' needs a path to the draft model's weights")
        if load is None:
            from executor.weights import load_model as load
        loaded = load(argument)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        weight = target.tok_embeddings.weight
        return ModelDrafter(model.to(weight.device, weight.dtype).requires_grad_(False).eval(), name=spec)
    raise ValueError(f"unknown drafter {spec!r}; use 'early-exit:K', 'ngram' or 'model:PATH'")
