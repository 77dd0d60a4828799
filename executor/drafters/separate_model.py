"""A separate, smaller draft model with its own KV cache (Leviathan et al., ICML 2023, arXiv 2211.17192)."""

from __future__ import annotations

import torch

from executor.decoders.base import commit_path, run_tree

__all__ = ["ModelDrafter", "check_same_vocabulary"]


def check_same_vocabulary(draft_vocab: int, target, what: str) -> None:
    if draft_vocab != target.config.vocab_size:
        raise ValueError(
            f"{what} has a vocabulary of {draft_vocab} tokens but the target has {target.config.vocab_size}; "
            "draft and target must share one vocabulary"
        )


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
        check_same_vocabulary(self.model.config.vocab_size, target, "the draft model")

    def start(self, prompt: list[int], cache_slots: int) -> None:
        if cache_slots > self.model.config.max_seq_len:
            raise ValueError(
                f"the draft model's context ({self.model.config.max_seq_len}) is shorter than the "
                f"{cache_slots} positions this generation needs"
            )
        self.model.setup_cache(cache_slots)
        self.length = 0
        self._fed = set()

    def prefill(self, state) -> None:
        """Run the prompt's committed tokens now, as part of the generation's prefill, so that the first step's
        root pass runs the root alone, as a steady step's does."""
        committed = state.committed
        if committed > self.length:
            device = self.model.tok_embeddings.weight.device
            self.model(
                torch.tensor([state.tokens[self.length : committed]], device=device),
                torch.arange(self.length, committed, device=device),
            )
            self.length = committed

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
        if not self._fed:
            return  # it drafted nothing this step (a composite drafter served it): its cache is unchanged
        committed = state.committed
        kept = 0
        for node in accepted_path:
            if node not in self._fed:
                break
            kept += 1
        commit_path(self.model, committed, accepted_path[:kept])
        self.length = committed + kept
        self._fed = set()
