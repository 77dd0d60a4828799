"""Prompt lookup first, a model drafter where the lookup finds nothing (``ngram+D`` on the command line).

Code repeats itself: where the context's suffix n-gram occurred before, what followed it is a long, free and
often right draft (prompt lookup, Saxena 2023); elsewhere a trained head drafts better than nothing. Serving
stacks pair them the same way (e.g. an n-gram proposer with a model fallback). The choice is made once per step,
at the root, from the committed context alone, and each drafted token is drawn from the ``q`` reported for it
(one-hot for the lookup's tokens), so every decoder's verification stays exactly lossless.
"""

from __future__ import annotations

import torch

from executor.drafters.ngram import PromptLookupDrafter
from theory.checks import as_count

__all__ = ["LookupFirstDrafter"]


class LookupFirstDrafter:
    """Draft the prompt-lookup proposal when the context's suffix matches, else defer to ``model``.

    Parameters
    ----------
    lookup : PromptLookupDrafter
        Its ``min_ngram`` is the shortest suffix match that is trusted (a one-token match is nearly always
        found in a long context and is right less often than a trained head).
    model : Drafter
        Any non-deterministic drafter (feature head, early exit, a separate model, ...).
    model_tokens : int, optional
        Longest chain ``model`` drafts in a step (the lookup's proposal may be longer: its tokens cost no draft
        pass). Default: no limit beyond the decoder's own.
    name : str, optional
        Default ``"<lookup name>+<model name>"``.

    Notes
    -----
    ``deterministic`` says whether the current step's drafts came from the lookup (the step logs record it);
    ``model.commit`` is called after every step, drafted by it or not, so drafters that keep state from the
    target's verification pass (Kangaroo's adapter) stay in step.
    """

    def __init__(
        self, lookup: PromptLookupDrafter, model, *, model_tokens: int | None = None, name: str | None = None
    ):
        if not isinstance(lookup, PromptLookupDrafter):
            raise ValueError(f"lookup must be a PromptLookupDrafter; got {type(lookup).__name__}")
        if getattr(model, "deterministic", False):
            raise ValueError(
                f"model must be a model drafter, not another deterministic proposer ({model.name!r})"
            )
        self.lookup = lookup
        self.model = model
        self.model_tokens = None if model_tokens is None else as_count(model_tokens, "model_tokens")
        self.name = name or f"{lookup.name}+{model.name}"
        self.deterministic = False
        self.lookup_steps = 0  # steps drafted by the lookup since start()
        self.model_steps = 0

    @property
    def needs_target_hidden(self) -> bool:
        return bool(getattr(self.model, "needs_target_hidden", False))

    def check_target(self, target) -> None:
        self.lookup.check_target(target)
        self.model.check_target(target)

    def start(self, prompt: list[int], cache_slots: int) -> None:
        self.lookup.start(prompt, cache_slots)
        self.model.start(prompt, cache_slots)
        self.deterministic = False
        self.lookup_steps = self.model_steps = 0

    def prefill(self, state) -> None:
        """The model drafter's prompt reading (:meth:`executor.decoders.base.Decoder.generate` calls it)."""
        prefill = getattr(self.model, "prefill", None)
        if prefill is not None:
            prefill(state)

    def draft_logits(self, state, tree, nodes) -> torch.Tensor | None:
        if nodes == [0]:
            self.lookup.proposal = self.lookup.propose(state.tokens)
            self.deterministic = bool(self.lookup.proposal)
            if self.deterministic:
                self.lookup_steps += 1
            else:
                self.model_steps += 1
        if self.deterministic:
            return self.lookup.proposal_logits(tree, nodes)
        if self.model_tokens is not None and max(tree.depths[v] for v in nodes) >= self.model_tokens:
            return None
        return self.model.draft_logits(state, tree, nodes)

    def commit(self, state, tree, accepted_path) -> None:
        self.model.commit(state, tree, accepted_path)
