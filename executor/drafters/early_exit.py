"""The target's own first layers as the drafter (LayerSkip self-speculation, Elhoushi et al., ACL 2024, arXiv 2404.16710)."""

from __future__ import annotations

from executor.decoders.base import run_tree
from theory.checks import as_count

__all__ = ["EarlyExitDrafter"]


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
