"""What every decoder shares: the sampling settings, the decoding state, the draft tree and the step loop.

A decoding step (Leviathan et al., ICML 2023, arXiv 2211.17192; Chen et al., arXiv 2302.01318; tree form from
SpecInfer, Miao et al., ASPLOS 2024, arXiv 2305.09781):

1. **draft** a token tree whose root is the last committed token (not yet in the target's cache);
2. **score** the whole tree with one target forward pass: node ``i`` sits in cache slot ``L + i`` (``L`` =
   committed length), at RoPE position ``L + depth(i)``, and attends to the committed prefix, its ancestors
   and itself (for a chain this is the ordinary causal mask);
3. **verify** from the root down; the accepted path plus one token drawn from the target are emitted;
4. **commit**: copy the accepted path's K/V into the contiguous slots ``L + 1, L + 2, ...``
   (:meth:`executor.model.Transformer.copy_cache_slots`) and move the length pointer. Rejected slots are
   never cleared: they lie beyond the pointer and are overwritten by the next step.

Plain decoding is the degenerate step whose tree is the root alone. The state therefore keeps the invariant
``target cache length == len(tokens) - 1``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from numbers import Integral

import torch

from executor.logs import GenerationResult, StepLog, parse_log_mode, record_distributions
from executor.sampling import first_argmax, logits_to_probs, sample_token
from theory.checks import as_count, as_nonnegative

__all__ = [
    "Decoder",
    "DecodingState",
    "DraftTree",
    "PrefillCache",
    "Sampling",
    "commit_path",
    "run_tree",
    "tree_step_log",
]


@dataclass(frozen=True)
class Sampling:
    """How logits become the distributions that are sampled and verified (target and draft alike).

    ``temperature == 0`` is greedy decoding (one-hot on the argmax); otherwise softmax of
    ``logits / temperature`` after top-k and top-p filtering (:func:`executor.sampling.logits_to_probs`).
    Draft and target get the same processing: speculative sampling is lossless with respect to the
    distributions it is given, so ``q`` must be exactly the law the drafts were drawn from.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        as_nonnegative(self.temperature, "temperature")
        if self.top_k is not None:
            as_count(self.top_k, "top_k")
        if self.top_p is not None and (
            isinstance(self.top_p, bool)
            or not isinstance(self.top_p, (int, float))
            or not 0 < self.top_p <= 1
        ):
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits_to_probs(logits, self.temperature, self.top_k, self.top_p)

    def draw(self, probs: torch.Tensor, generator: torch.Generator) -> int:
        """One token from a single distribution; greedy takes the argmax without consuming randomness."""
        if self.greedy:
            return int(first_argmax(probs))
        return int(sample_token(probs, generator))


@dataclass
class DecodingState:
    """Prompt plus generated tokens; the target's cache holds the K/V of ``tokens[:-1]``.

    ``hidden`` is kept only for drafters that set ``needs_target_hidden`` (feature-level heads such as EAGLE's):
    row ``i < committed`` is the target's final hidden state (before the final norm) after ``tokens[i]``, as the
    prefill or the verification pass that committed ``tokens[i]`` computed it.
    """

    tokens: list[int]
    hidden: torch.Tensor | None = None

    @property
    def committed(self) -> int:
        """The target's cache length pointer ``L``: slots ``[0, L)`` hold the committed prefix."""
        return len(self.tokens) - 1


class DraftTree:
    """A token tree grown during drafting; node 0 is the root (the last committed token).

    ``parents``/``children`` follow :class:`theory.Tree`'s conventions (parent array, ordered children).
    ``draft_probs[v]`` is the draft distribution ``q`` the children of ``v`` were drawn from.
    """

    def __init__(self, root_token: int) -> None:
        self.tokens = [int(root_token)]
        self.parents = [-1]
        self.depths = [0]
        self.children: list[list[int]] = [[]]
        self._paths: list[list[int]] = [[0]]
        self.draft_probs: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def add_child(self, parent: int, token: int) -> int:
        node = len(self.tokens)
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.children.append([])
        self.children[parent].append(node)
        self._paths.append(self._paths[parent] + [node])
        return node

    def path(self, node: int) -> list[int]:
        """Nodes from the root to ``node``, both included."""
        return self._paths[node]

    @property
    def expanded(self) -> list[int]:
        """Nodes whose children were drafted, in node order."""
        return sorted(self.draft_probs)

    def is_chain(self) -> bool:
        return all(parent == node - 1 for node, parent in enumerate(self.parents))

    def attention_mask(self, nodes: list[int], prefix: int) -> torch.Tensor:
        """``(len(nodes), prefix + max(nodes) + 1)`` bool mask: the committed prefix, ancestors and self."""
        mask = torch.zeros(len(nodes), prefix + max(nodes) + 1, dtype=torch.bool)
        mask[:, :prefix] = True
        for row, node in enumerate(nodes):
            mask[row, [prefix + a for a in self._paths[node]]] = True
        return mask


def run_tree(
    model,
    tree: DraftTree,
    nodes: list[int],
    committed: int,
    *,
    exit_layer: int | None = None,
    return_hidden: bool = False,
):
    """Logits ``(len(nodes), V)`` of ``model`` on tree ``nodes`` (slot ``committed + node``); writes K/V.

    With ``return_hidden``, ``(logits, hidden)`` with the hidden states ``(len(nodes), dim)`` before the final
    norm. For a chain fed in order the default causal mask is exactly the tree mask, so none is built.
    """
    device = model.tok_embeddings.weight.device
    tokens = torch.tensor([[tree.tokens[v] for v in nodes]], device=device)
    slots = torch.tensor(nodes, device=device) + committed
    contiguous = nodes == list(range(nodes[0], nodes[0] + len(nodes)))
    if tree.is_chain() and contiguous:
        out = model(tokens, slots, exit_layer=exit_layer, return_hidden=return_hidden)
    else:
        positions = torch.tensor([tree.depths[v] for v in nodes], device=device) + committed
        mask = tree.attention_mask(nodes, committed).to(device)
        out = model(
            tokens,
            slots,
            positions=positions,
            attention_mask=mask,
            exit_layer=exit_layer,
            return_hidden=return_hidden,
        )
    return (out[0][0], out[1][0]) if return_hidden else out[0]


def commit_path(model, committed: int, path: list[int]) -> None:
    """Move the K/V of tree ``path`` (root first, root at slot ``committed``) into slots ``committed + i``.

    Afterwards slots ``[0, committed + len(path))`` hold the prefix and the path as a fresh prefill would
    (Medusa/EAGLE's gather-and-compact); nothing to do when the path already is contiguous (chains).
    """
    accepted = path[1:]
    if accepted != list(range(1, len(accepted) + 1)):
        device = model.tok_embeddings.weight.device
        model.copy_cache_slots(
            torch.tensor(accepted, device=device) + committed,
            torch.arange(1, len(accepted) + 1, device=device) + committed,
        )


def tree_step_log(
    tree: DraftTree, path: list[int], emitted: list[int], target_probs, log_distributions, deterministic: bool
) -> StepLog:
    """The :class:`~executor.logs.StepLog` of one verified tree step: the tree, the accepted ``path`` (root
    first), the ``emitted`` tokens and the (p, q) pairs of the expanded nodes for the theory's replay."""
    expanded = tree.expanded
    distributions = None
    if expanded:
        distributions = record_distributions(
            target_probs[expanded], torch.stack([tree.draft_probs[v] for v in expanded]), log_distributions
        )
    return StepLog(
        tokens=list(tree.tokens),
        parents=list(tree.parents),
        accepted_path=list(path),
        emitted=emitted,
        expanded=expanded,
        accepted=[len(path) - 1 > d for d in range(max(tree.depths))],
        distributions=distributions,
        deterministic_drafts=deterministic,
    )


def check_token_ids(ids, name: str, vocab_size: int) -> list[int]:
    """A list of ints in ``[0, vocab_size)``; ``ValueError`` naming ``name`` otherwise."""
    if isinstance(ids, torch.Tensor):
        ids = ids.reshape(-1).tolist()
    ids = list(ids)
    if not ids:
        raise ValueError(f"{name} is empty: give at least one token")
    for token in ids:
        if isinstance(token, bool) or not isinstance(token, Integral) or not 0 <= token < vocab_size:
            raise ValueError(f"{name} must hold token ids in [0, {vocab_size}); found {token!r}")
    return [int(t) for t in ids]


@dataclass
class StepOutcome:
    """What a decoder's verification returns: the accepted path (root first) and the final emitted token."""

    path: list[int]
    token: int


@dataclass(frozen=True)
class _Prefill:
    """One prompt's prefill: each layer's keys and values in the prompt's slots, and the final hidden states."""

    keys_values: list[tuple[torch.Tensor, torch.Tensor]]
    hidden: torch.Tensor


class PrefillCache:
    """Prompt prefills of one target model, kept for later generations of the same prompt.

    A generation's prefill runs the target over the prompt's first ``L - 1`` tokens, writing their keys and
    values into cache slots ``0 .. L - 2`` and yielding their final hidden states (which feature drafters
    read). Those depend on the tokens alone, so a later generation of the same prompt copies them into its
    fresh cache instead of running the target again: bitwise the values a new prefill writes. ``specbound
    validate`` generates each prompt dozens of times (every configuration, with plain decoding around each
    one), and a prefill in float32 on a 2-core AVX2 CPU takes about 0.4 s. Memory per prompt: keys, values and
    hidden states of ``L - 1`` tokens (about 5.6 MB for SmolLM2 at 120 tokens on the CPU, whose KV cache is
    float32 in either dtype: :func:`executor.model.attention_dtype`). The prefill time a generation reports
    (:attr:`executor.logs.GenerationResult.prefill_time`) is then the copy's.
    """

    def __init__(self, target) -> None:
        self.target = target
        self._entries: dict[tuple[int, ...], _Prefill] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def restore(self, prefix: list[int]) -> torch.Tensor | None:
        """Copy ``prefix``'s keys and values into the target's cache; its hidden states, or ``None`` (not kept)."""
        entry = self._entries.get(tuple(prefix))
        if entry is None:
            return None
        for layer, (keys, values) in zip(self.target.layers, entry.keys_values, strict=True):
            cache = layer.attention.kv_cache
            cache.k[:, :, : len(prefix)].copy_(keys)
            cache.v[:, :, : len(prefix)].copy_(values)
        return entry.hidden

    def keep(self, prefix: list[int], hidden: torch.Tensor) -> None:
        """Keep the keys and values the target's cache holds for ``prefix`` (just prefilled) and its hidden states."""
        length = len(prefix)
        keys_values = [
            (
                layer.attention.kv_cache.k[:, :, :length].clone(),
                layer.attention.kv_cache.v[:, :, :length].clone(),
            )
            for layer in self.target.layers
        ]
        self._entries[tuple(prefix)] = _Prefill(keys_values, hidden.clone())


class Decoder(ABC):
    """Base class: the generation loop, the target forward over the draft tree, the commit and the logs.

    Subclasses implement :meth:`draft` (build the tree) and :meth:`verify` (walk it).

    Parameters
    ----------
    target : executor.model.Transformer
        The target model.
    drafter : executor.drafters.Drafter, optional
        Proposes draft tokens; ``None`` for plain decoding.
    sampling : Sampling
        Temperature, top-k and top-p, applied to target and draft alike.
    log_distributions : str
        ``"none"``, ``"full"`` or ``"topk:K"``: what to keep of ``p`` and ``q`` at each drafted position.
    """

    name = "decoder"

    def __init__(self, target, drafter=None, *, sampling: Sampling | None = None, log_distributions="none"):
        self.target = target
        self.drafter = drafter
        self.sampling = Sampling() if sampling is None else sampling
        parse_log_mode(log_distributions)
        self.log_distributions = log_distributions
        if drafter is not None:
            drafter.check_target(target)

    @property
    @abstractmethod
    def max_tree_size(self) -> int:
        """Largest number of tree nodes (root included) one step can verify: the cache slots it needs."""

    @abstractmethod
    def draft(self, state: DecodingState, generator: torch.Generator) -> DraftTree:
        """Build this step's draft tree rooted at ``state.tokens[-1]``."""

    @abstractmethod
    def verify(self, tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator) -> StepOutcome:
        """Walk the tree given the target's distributions at every node (row ``i`` = after node ``i``)."""

    def settings(self) -> dict:
        """The decoder's options, for logs and JSON."""
        return {
            "temperature": self.sampling.temperature,
            "top_k": self.sampling.top_k,
            "top_p": self.sampling.top_p,
            "drafter": None if self.drafter is None else self.drafter.name,
        }

    def generate(
        self,
        prompt_ids,
        max_new_tokens: int,
        *,
        generator: torch.Generator | None = None,
        eos_id: int | None = None,
        prefill_cache: PrefillCache | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after ``prompt_ids``, stopping after ``eos_id``.

        ``prefill_cache`` (a :class:`PrefillCache` of this decoder's target) reuses the prompt's prefill from an
        earlier generation of the same prompt, or keeps this one's for later ones.

        Raises ``ValueError`` for an empty prompt, token ids outside the vocabulary, a negative
        ``max_new_tokens``, a prompt that with the new tokens and one draft tree does not fit the model's
        context (``config.max_seq_len``), or a ``prefill_cache`` of another model.
        """
        config = self.target.config
        prompt = check_token_ids(prompt_ids, "prompt_ids", config.vocab_size)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, Integral) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        if len(prompt) > config.max_seq_len:
            raise ValueError(
                f"prompt_ids has {len(prompt)} tokens, longer than the model's context of "
                f"{config.max_seq_len}"
            )
        slots = len(prompt) + max_new_tokens + self.max_tree_size
        if slots > config.max_seq_len:
            raise ValueError(
                f"prompt_ids ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) + one draft tree "
                f"({self.max_tree_size}) need {slots} positions; the model's context is {config.max_seq_len}"
            )
        if prefill_cache is not None and prefill_cache.target is not self.target:
            raise ValueError("prefill_cache holds the prefills of another model than this decoder's target")
        if generator is None:
            generator = torch.Generator(device=self.target.tok_embeddings.weight.device).manual_seed(0)
        start = time.perf_counter()
        steps: list[StepLog] = []
        generated: list[int] = []
        with torch.no_grad():
            self.target.setup_cache(slots)
            state = DecodingState(tokens=list(prompt))
            device = self.target.tok_embeddings.weight.device
            if getattr(self.drafter, "needs_target_hidden", False):
                weight = self.target.tok_embeddings.weight
                state.hidden = torch.zeros(slots, config.dim, dtype=weight.dtype, device=device)
            if len(prompt) > 1:
                hidden = None if prefill_cache is None else prefill_cache.restore(prompt[:-1])
                if hidden is None:
                    out = self.target(
                        torch.tensor([prompt[:-1]], device=device),
                        torch.arange(len(prompt) - 1, device=device),
                        return_hidden=state.hidden is not None or prefill_cache is not None,
                    )
                    hidden = out[1][0] if isinstance(out, tuple) else None
                    if prefill_cache is not None:
                        prefill_cache.keep(prompt[:-1], hidden)
                if state.hidden is not None:
                    state.hidden[: len(prompt) - 1] = hidden
            if self.drafter is not None:
                self.drafter.start(prompt, slots)
                # A drafter that reads the prompt does it here, in the prefill, not in the first step.
                prefill = getattr(self.drafter, "prefill", None)
                if prefill is not None:
                    prefill(state)
            prefill_time = time.perf_counter() - start
            while len(generated) < max_new_tokens:
                step = self.step(state, generator)
                steps.append(step)
                emitted = step.emitted[: max_new_tokens - len(generated)]
                if eos_id is not None and eos_id in emitted:
                    emitted = emitted[: emitted.index(eos_id) + 1]
                generated.extend(emitted)
                if eos_id is not None and generated and generated[-1] == eos_id:
                    break
        return GenerationResult(
            prompt_ids=prompt,
            token_ids=generated,
            steps=steps,
            wall_time=time.perf_counter() - start,
            prefill_time=prefill_time,
            decoder=self.name,
            settings=self.settings(),
        )

    def step(self, state: DecodingState, generator: torch.Generator) -> StepLog:
        """One draft -> score -> verify -> commit cycle; returns its log and extends ``state.tokens``."""
        committed = state.committed
        tree = self.draft(state, generator)
        nodes = list(range(len(tree)))
        if state.hidden is None:
            logits = run_tree(self.target, tree, nodes, committed)
        else:
            logits, hidden = run_tree(self.target, tree, nodes, committed, return_hidden=True)
        target_probs = self.sampling.probs(logits)
        outcome = self.verify(tree, target_probs, generator)
        accepted = outcome.path[1:]
        commit_path(self.target, committed, outcome.path)
        if state.hidden is not None:  # the accepted path's features, in its committed slots
            state.hidden[committed : committed + len(outcome.path)] = hidden[outcome.path]
        if self.drafter is not None:
            self.drafter.commit(state, tree, outcome.path)
        emitted = [tree.tokens[v] for v in accepted] + [outcome.token]
        state.tokens.extend(emitted)
        deterministic = bool(self.drafter is not None and self.drafter.deterministic)
        return tree_step_log(tree, outcome.path, emitted, target_probs, self.log_distributions, deterministic)
