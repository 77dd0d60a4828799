"""What every seed method shares: the :class:`Method` interface, its result, and the layer-work counter.

A method is a paper's decoding algorithm built on a target model (and its tokenizer): :meth:`Method.predict`
measures what the theory needs on *calibration* prompts (other prompts than the ones it is evaluated on) and
returns the theory's prediction of tokens per step; :meth:`Method.build` returns the decoder for a
temperature; :meth:`Method.run` generates and returns a :class:`MethodResult` with the emitted tokens, the
number of target verification steps, the per-position acceptance and the transformer layers used.

Layers used are counted, not estimated: :class:`LayerCounter` hooks every decoder layer of the target and adds
the number of token positions each layer processes, so a draft pass through ``k`` layers over ``m`` tree
nodes counts ``k * m`` and plain decoding counts ``n_layers`` per token.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from executor.decoders.base import Decoder, Sampling
from theory.checks import as_nonnegative

__all__ = ["LayerCounter", "Method", "MethodResult", "Prediction", "check_temperature"]


def check_temperature(temperature) -> float:
    """A temperature ``>= 0`` as a float, else ``ValueError`` naming ``temperature``."""
    if isinstance(temperature, bool):
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    return as_nonnegative(temperature, "temperature")


class LayerCounter:
    """Counts the work of ``model``'s decoder layers and LM head while active (a context manager).

    ``total`` is the sum over layers of the token positions they processed (layer-token evaluations, the
    compute); ``passes`` the number of layer calls and ``heads`` the number of final-norm (LM head) calls,
    whatever their width (the weight loads, what a memory-bound device pays).
    """

    def __init__(self, model) -> None:
        self.model = model
        self.total = 0
        self.passes = 0
        self.heads = 0
        self._handles: list = []

    def _hook(self, module, args) -> None:
        self.total += int(args[0].shape[1])
        self.passes += 1

    def _head(self, module, args) -> None:
        self.heads += 1

    def exclude_prefill(self, prompt_length: int) -> None:
        """Remove the prefill forward (``prompt_length - 1`` tokens through every layer, one head call)."""
        if prompt_length > 1:
            self.total -= len(self.model.layers) * (prompt_length - 1)
            self.passes -= len(self.model.layers)
            self.heads -= 1

    def __enter__(self) -> LayerCounter:
        self._handles = [layer.register_forward_pre_hook(self._hook) for layer in self.model.layers]
        self._handles.append(self.model.norm.register_forward_pre_hook(self._head))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


@dataclass
class MethodResult:
    """One generation by a method.

    Attributes
    ----------
    token_ids : list of int
        The generated tokens (prompt excluded).
    steps : int
        Target verification passes (for non-speculative methods: forward passes).
    acceptance_by_position : list of float
        Fraction of drafting steps whose accepted path reached depth ``i + 1``.
    layer_evaluations : int
        Decoder-layer evaluations (layers times token positions) after the prefill, drafts included.
    wall_time : float
        Seconds, prefill included.
    extra : dict
        Method-specific measurements (exit layers chosen, passes saved, ...).
    """

    token_ids: list[int]
    steps: int
    acceptance_by_position: list[float]
    layer_evaluations: int
    wall_time: float
    extra: dict = field(default_factory=dict)

    @property
    def tau(self) -> float:
        """Tokens per target step (bonus token included)."""
        return len(self.token_ids) / self.steps if self.steps else float("nan")


@dataclass
class Prediction:
    """The theory's forecast for a method, computed from calibration prompts before the evaluation run."""

    predicted_tau: float | None
    details: dict = field(default_factory=dict)
    train_seconds: float | None = None


def head_layer_equivalents(config) -> float:
    """The LM head's multiply-accumulates in units of one decoder layer's (about 8 for SmolLM2-135M)."""
    layer = (
        config.dim * (2 * config.dim + 2 * config.n_kv_heads * config.head_dim)
        + 3 * config.dim * config.hidden_dim
    )
    return config.vocab_size * config.dim / layer


def acceptance_by_position(steps) -> list[float]:
    """vLLM's per-position acceptance over step logs: accepted at depth ``i + 1`` / steps that drafted."""
    drafted = [s for s in steps if s.accepted]
    if not drafted:
        return []
    depth = max(len(s.accepted) for s in drafted)
    return [sum(len(s.accepted) > i and s.accepted[i] for s in drafted) / len(drafted) for i in range(depth)]


class Method(ABC):
    """A seed paper's decoding method on ``target`` (a :class:`executor.model.Transformer`).

    Subclasses set ``name``, ``lossless`` and ``paper`` and implement :meth:`build` (and usually
    :meth:`predict`). Options are keyword arguments of the constructor; bad options raise ``ValueError``
    naming the option.
    """

    name: str = "method"
    lossless: bool = True
    paper: str = ""

    def __init__(self, target, tokenizer=None) -> None:
        self.target = target
        self.tokenizer = tokenizer

    @abstractmethod
    def build(self, temperature: float = 0.0) -> Decoder:
        """The decoder that runs this method at ``temperature``."""

    def predict(self, calibration_prompts: list[list[int]], temperature: float, max_new_tokens: int):
        """Measure on ``calibration_prompts`` what the theory needs and return its :class:`Prediction`."""
        return Prediction(None)

    def sampling(self, temperature: float) -> Sampling:
        return Sampling(temperature=check_temperature(temperature))

    def run(
        self,
        prompt_ids,
        *,
        temperature: float = 0.0,
        max_new_tokens: int = 64,
        generator: torch.Generator | None = None,
        eos_id: int | None = None,
    ) -> MethodResult:
        """Generate after ``prompt_ids`` with this method and measure it."""
        decoder = self.build(temperature)
        with LayerCounter(self.target) as counter:
            start = time.perf_counter()
            result = decoder.generate(prompt_ids, max_new_tokens, generator=generator, eos_id=eos_id)
            wall = time.perf_counter() - start
        counter.exclude_prefill(len(result.prompt_ids))
        return MethodResult(
            token_ids=list(result.token_ids),
            steps=len(result.steps),
            acceptance_by_position=acceptance_by_position(result.steps),
            layer_evaluations=counter.total,
            wall_time=wall,
            extra={
                "layer_passes": counter.passes,
                "head_passes": counter.heads,
                "verified_positions": sum(len(s.tokens) for s in result.steps),
                # Drafted depths summed over steps: the sequential draft passes of a chain or of a tree
                # drafted one level per pass (methods that save passes report ``draft_passes`` in extra()).
                "draft_levels": sum(len(s.accepted) for s in result.steps),
                "step_tokens": [len(s.emitted) for s in result.steps],
                **self.extra(decoder),
            },
        )

    def warm_up(self, prompt_ids, temperature: float, max_new_tokens: int) -> None:
        """One untimed generation, so that timed runs do not pay first-use costs (oneDNN builds its kernels
        at the first pass over each new number of positions)."""
        self.run(
            prompt_ids,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            generator=torch.Generator().manual_seed(0),
        )

    def extra(self, decoder) -> dict:
        """Method-specific measurements after a run (override)."""
        return {}

    def drafter_cards(self) -> list[dict]:
        """Cards of the cached trained checkpoints the method drafts with (feature head, exit heads, adapter;
        trained once by ``specbound train-drafter`` and shared): their ``seconds`` are the drafter's training
        time. None by default; the method's own training is :attr:`Prediction.train_seconds`."""
        return []

    def options(self) -> dict:
        return {}
