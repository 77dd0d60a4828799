"""Drafters: what proposes the draft tokens, behind one small protocol.

A drafter answers one question: *given the committed context and a partially drafted token tree, what are
the draft logits at these tree nodes* (the distribution of their children)? The decoder turns the logits
into ``q`` with the same temperature/top-k/top-p as the target, draws the children, and grows the tree one
level per call, so the same drafter serves chains (one node per level), multi-draft (the root only) and
trees. Stop rules (how long a chain to draft) are a separate, pluggable policy on the decoder
(:class:`executor.decoders.chain.ConfidenceStop`).

One module per drafter kind:

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
* :class:`FeatureDrafter` -- a trained feature-level head on the target's final hidden states (EAGLE, Li et al.,
  ICML 2024, arXiv 2401.15077), with its own one-layer KV cache; it sets ``needs_target_hidden``, so the
  decoder keeps the target's hidden states of the committed tokens in ``DecodingState.hidden``.
* :class:`FalconDrafter` -- Falcon's semi-autoregressive variant of that head (Gao et al., AAAI 2025,
  arXiv 2412.12639): two tree levels per head pass.
* :class:`LookupFirstDrafter` -- prompt lookup where the context's suffix matches, another drafter elsewhere
  (``ngram+feature``), chosen per step.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from executor.decoders.base import DecodingState, DraftTree

__all__ = [
    "DRAFTER_KINDS",
    "Drafter",
    "default_drafter",
    "EarlyExitDrafter",
    "FalconDrafter",
    "FalconHead",
    "FeatureDrafter",
    "FeatureHead",
    "LookupFirstDrafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "parse_drafter",
]


@runtime_checkable
class Drafter(Protocol):
    """The interface every drafter implements.

    Attributes
    ----------
    name : str
        As written on the command line (``"early-exit:K"``, ``"ngram"``, ``"model:PATH"``).
    deterministic : bool
        ``True`` when the proposals are not samples (one-hot ``q``).

    A drafter with a model of its own may also define ``prefill(state)``: after :meth:`start` and the
    target's prefill (``state.hidden`` holds the prompt's target features when the drafter
    ``needs_target_hidden``), it reads the prompt's committed tokens, so that this work counts as the
    generation's prefill and every step drafts from a caught-up cache. Without it the first step's root
    pass catches up, with the same result.
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


from executor.drafters.early_exit import EarlyExitDrafter  # noqa: E402  (the protocol above comes first)
from executor.drafters.falcon import FalconDrafter, FalconHead  # noqa: E402
from executor.drafters.feature import FeatureDrafter, FeatureHead  # noqa: E402
from executor.drafters.hybrid import LookupFirstDrafter  # noqa: E402
from executor.drafters.ngram import PromptLookupDrafter  # noqa: E402
from executor.drafters.parse import DRAFTER_KINDS, default_drafter, parse_drafter  # noqa: E402
from executor.drafters.separate_model import ModelDrafter  # noqa: E402
