"""EasySpec: layer-parallel ("fuzzy") drafting with bonus calibration (Wu et al., NeurIPS 2025,
arXiv 2502.02493).

The drafter (here the target's first ``exit_layer`` layers with their own KV cache, a truncated SmolLM2, and
its exit: the trained ``exit:K`` head cached for the target, by default the deepest, else the untrained final
norm and LM head) is cut into groups of consecutive layers; the first and last ``exact_layers`` stay
sequential, the others form groups of ``group_size``. Within a group every member computes its attention from
the *group's input* ``h`` (what lets the members run on different devices at once) and writes its K/V from
that input (the fuzzy KV); the MLPs then run in order on the exact residual, the authors' ``ATTN_ONLY``
policy:

.. math:: a_i = \\mathrm{Attn}_i(\\mathrm{RMS}_i(h)),\\quad x \\leftarrow x + a_i,\\quad
          x \\leftarrow x + \\mathrm{MLP}_i(\\mathrm{RMS}'_i(x)) \\quad (i = 1..N,\\ x_0 = h).

After each verification the draft cache is *calibrated*: the first draft pass of the next round runs all
layers exactly and sequentially over every token whose draft K/V was written in fuzzy mode (the accepted drafts)
plus the new root, overwriting them; its last logits give the first draft token (``EVERY_ROUND`` policy).
The chain is verified by the target as usual, so the method is lossless.

On one CPU the groups run one after the other, so nothing is faster; what is measured is the acceptance drop
of fuzzy drafting (against the same drafter run exactly) and the calibration cost (the multi-token exact pass
against a one-token pass), which :func:`theory.layer_parallel_speedup` turns into the speedup on several
devices. Acceptance is measured per depth (:func:`~executor.methods.calibration.depth_acceptance` on the
calibration chains): the fuzzy drafter's gives the predicted tokens per step, the exact drafter's and the
per-depth drop the multi-device model.
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch
from torch import nn

from executor.decoders import ChainDecoder
from executor.methods._common import check_exit_layer, checkpoint_cards, deepest_exit_head
from executor.methods.base import Method, Prediction
from executor.methods.calibration import depth_acceptance, forward_time_ratio
from theory.checks import as_count

__all__ = ["EasySpec", "LayerParallelDrafter", "layer_groups"]


def layer_groups(n_layers: int, group_size: int, exact_layers: int) -> list[list[int]]:
    """Consecutive groups: the first and last ``exact_layers`` alone, the middle in groups of ``group_size``."""
    head = list(range(min(exact_layers, n_layers)))
    tail = list(range(max(n_layers - exact_layers, len(head)), n_layers))
    middle = list(range(len(head), n_layers - len(tail)))
    groups = [[i] for i in head]
    groups += [middle[i : i + group_size] for i in range(0, len(middle), group_size)]
    return groups + [[i] for i in tail]


class LayerParallelDrafter:
    """The target's first ``exit_layer`` layers (shared weights, own KV cache) drafting in fuzzy groups."""

    deterministic = False

    def __init__(
        self, target, exit_layer: int, *, group_size: int = 2, exact_layers: int = 2, fuzzy=True, head=None
    ):
        self.target = target
        self.exit_layer = exit_layer
        self.head = head  # hidden (T, d) -> logits (T, V); None: the target's final norm and LM head
        memo = {id(p): p for p in target.parameters()}
        for layer in target.layers[:exit_layer]:
            memo[id(layer.attention.kv_cache)] = None
        self.layers = copy.deepcopy(nn.ModuleList(target.layers[:exit_layer]), memo)
        self.groups = (
            layer_groups(exit_layer, group_size, exact_layers) if fuzzy else [[i] for i in range(exit_layer)]
        )
        self.name = f"layer-parallel:{exit_layer}" if fuzzy else f"early-exit-own-cache:{exit_layer}"
        self.length = 0
        self.calibration_passes: list[tuple[int, float]] = []
        self.draft_passes: list[float] = []

    def check_target(self, target) -> None:
        if target is not self.target:
            raise ValueError("a LayerParallelDrafter must be built on the target it drafts for")

    def start(self, prompt, cache_slots) -> None:
        for layer in self.layers:
            layer.attention.allocate_cache(1, cache_slots, like=self.target.tok_embeddings.weight)
        self.length = 0

    def prefill(self, state) -> None:
        """The exact pass over the prompt's committed tokens now, as part of the generation's prefill, so that
        the first step's calibration pass runs the root alone, as a steady step's does."""
        committed = state.committed
        if committed > self.length:
            slots = torch.arange(self.length, committed, device=self.target.tok_embeddings.weight.device)
            self._forward(state.tokens[self.length : committed], slots, slots, fuzzy=False, logits=False)
            self.length = committed

    def _forward(
        self,
        tokens: list[int],
        slots: torch.Tensor,
        positions: torch.Tensor,
        fuzzy: bool,
        logits: bool = True,
    ):
        device = self.target.tok_embeddings.weight.device
        mask = torch.arange(int(slots.max()) + 1, device=device) <= slots[:, None]
        cos, sin = self.target._rope(positions)
        x = self.target.tok_embeddings(torch.tensor([tokens], device=device))
        for group in self.groups if fuzzy else [[i] for i in range(self.exit_layer)]:
            if len(group) == 1:
                x = self.layers[group[0]](x, cos, sin, slots, mask)
                continue
            h = x
            attended = [
                self.layers[i].attention(self.layers[i].attention_norm(h), cos, sin, slots, mask)
                for i in group
            ]
            for i, a in zip(group, attended, strict=True):
                x = x + a
                x = x + self.layers[i].feed_forward(self.layers[i].ffn_norm(x))
        if not logits:
            return None
        if self.head is not None:
            return self.head(x[0]).float()
        return self.target.lm_head(self.target.norm(x)).float()[0]

    def draft_logits(self, state, tree, nodes):
        committed = state.committed
        device = self.target.tok_embeddings.weight.device
        start = time.perf_counter()
        if nodes == [0]:
            # Bonus calibration: exact pass over the tokens with fuzzy (or no) draft K/V, plus the root.
            tokens = state.tokens[self.length : committed + 1]
            slots = torch.arange(self.length, committed + 1, device=device)
            logits = self._forward(tokens, slots, slots, fuzzy=False)[-1:]
            self.calibration_passes.append((len(tokens), time.perf_counter() - start))
            self.length = committed + 1
            return logits
        if len(nodes) != 1 or tree.parents[nodes[0]] != nodes[0] - 1:
            raise ValueError("the layer-parallel drafter drafts chains only")
        node = nodes[0]
        slots = torch.tensor([committed + node], device=device)
        logits = self._forward([tree.tokens[node]], slots, slots, fuzzy=True)
        self.draft_passes.append(time.perf_counter() - start)
        return logits

    def commit(self, state, tree, accepted_path) -> None:
        pass  # accepted drafts keep fuzzy K/V until the next round's calibration pass rewrites them


class EasySpec(Method):
    """EasySpec on the target's first ``exit_layer`` layers; ``trained`` and the default layer as in
    :class:`executor.methods.staged.Staged` (the deepest cached trained ``exit:K`` head, else the untrained
    exit at 13/15 of the depth)."""

    name = "easyspec"
    paper = "EasySpec, Wu et al., NeurIPS 2025, arXiv 2502.02493"

    def __init__(
        self,
        target,
        tokenizer=None,
        *,
        exit_layer=None,
        gamma: int = 3,
        group_size: int = 2,
        exact_layers=2,
        trained=None,
    ):
        super().__init__(target, tokenizer)
        exit_layer, self.head_path = deepest_exit_head(target, exit_layer, trained)
        self.exit_layer = check_exit_layer(target, exit_layer)
        self.head = None
        if self.head_path is not None:
            from executor.drafters.exit_head import ExitDrafter

            self.head = ExitDrafter.from_checkpoint(target, self.head_path, self.exit_layer).head_logits
        self.gamma = as_count(gamma, "gamma")
        self.group_size = as_count(group_size, "group_size")
        self.exact_layers = as_count(exact_layers, "exact_layers", minimum=0)

    def drafter_cards(self) -> list[dict]:
        return checkpoint_cards(self.head_path)

    def options(self) -> dict:
        return {
            "exit_layer": self.exit_layer,
            "gamma": self.gamma,
            "group_size": self.group_size,
            "exact_layers": self.exact_layers,
            "head": None if self.head_path is None else str(self.head_path),
        }

    def make_drafter(self, fuzzy: bool = True):
        return LayerParallelDrafter(
            self.target,
            self.exit_layer,
            group_size=self.group_size,
            exact_layers=self.exact_layers,
            fuzzy=fuzzy,
            head=self.head,
        )

    def build(self, temperature: float = 0.0):
        return ChainDecoder(
            self.target, self.make_drafter(), gamma=self.gamma, sampling=self.sampling(temperature)
        )

    def predict(self, calibration_prompts, temperature, max_new_tokens):
        import theory

        measured = {}
        for fuzzy in (False, True):
            drafter = self.make_drafter(fuzzy)
            decoder = ChainDecoder(
                self.target, drafter, gamma=self.gamma, sampling=self.sampling(temperature)
            )
            steps = []
            for index, prompt in enumerate(calibration_prompts):
                generator = torch.Generator().manual_seed(3000 + index)
                steps += decoder.generate(prompt, max_new_tokens, generator=generator).steps
            measured[fuzzy] = (depth_acceptance(steps, self.gamma, 1), drafter)
        exact, exact_drafter = measured[False]
        fuzzy, fuzzy_drafter = measured[True]
        # Per-depth conditional acceptance of the chain (depth d given d - 1), deep depths pooled when thin.
        alpha = exact.table[:, 0].tolist()
        alpha_fuzzy = fuzzy.table[:, 0].tolist()
        first = alpha[0]
        # Drop of fuzzy drafting per depth (positions 2..gamma; fuzzy drafting is taken never to help).
        drops = np.clip(np.subtract(alpha, alpha_fuzzy), 0.0, alpha)
        drops[0] = 0.0
        one_token = np.median(exact_drafter.draft_passes) if exact_drafter.draft_passes else np.nan
        calibration = [t for n, t in fuzzy_drafter.calibration_passes if n > 1]
        overhead = max(0.0, float(np.median(calibration) / one_token - 1)) if calibration else 0.0
        # The fuzzy drafter is what runs: its measured acceptance per depth gives tau (Leviathan et al.'s
        # chain with per-position rates); the exact drafter's and the drops feed the multi-device model.
        predicted_tau = float(theory.expected_tokens(alpha_fuzzy, self.gamma))
        head = forward_time_ratio(self.target, 0)
        full = 1.0
        layer_time = max((full - head) / self.target.config.n_layers, 1e-6)
        config = self.target.config
        attention = (2 * config.dim * config.dim + 2 * config.dim * config.n_kv_heads * config.head_dim) / (
            2 * config.dim * config.dim
            + 2 * config.dim * config.n_kv_heads * config.head_dim
            + 3 * config.dim * config.hidden_dim
        )
        devices = {}
        for count in (1, 2, 4, 8):
            result = theory.layer_parallel_speedup(
                alpha,
                drops,
                self.gamma,
                self.exit_layer,
                count,
                layer_time=layer_time,
                target_time=full,
                parallel_group=self.group_size,
                parallel_fraction=attention,
                sequential_layers=min(2 * self.exact_layers, self.exit_layer),
                head_time=head,
                calibration_overhead=overhead,
            )
            devices[count] = {"speedup": result.speedup, "sequential_speedup": result.sequential_speedup}
        return Prediction(
            predicted_tau,
            {
                **fuzzy.details(),
                "model": "expected_tokens(per-depth alpha of the fuzzy drafter)",
                "depth_aware": True,
                "alpha_exact": first,
                "alpha_exact_by_position": alpha,
                "alpha_fuzzy_by_position": alpha_fuzzy,
                "alpha_drop_by_position": drops.tolist(),
                "calibration_overhead": overhead,
                "attention_fraction": attention,
                "predicted_by_devices": devices,
            },
        )

    def extra(self, decoder) -> dict:
        drafter = decoder.drafter
        return {
            "calibration_tokens": float(np.mean([n for n, _ in drafter.calibration_passes]))
            if drafter.calibration_passes
            else 0.0
        }
