"""Measured cost model of a target and a drafter on this machine: what ``specbound profile`` writes.

The planners need the hardware's costs, not a guess: Sequoia's tree planner (Chen et al., NeurIPS 2024,
arXiv 2402.12374, §4.1) maximises :math:`t(1)\\,G(n, d) / (t(n) + d\\,t_{draft})` with :math:`t(n)` the time
of one target forward over ``n`` new tokens, and the draft-length MDP (SpecDec++, Huang et al., arXiv
2405.19715) charges ``K`` draft forwards plus one verification per step. Both are measured here:

* **target**: one forward over ``n`` new tokens (``n = 1, 2, 4, ..., max_size``), after a realistic context
  (HumanEval prompts) is prefilled: the tokens sit at the next cache slots, exactly where a verification pass
  puts a draft of ``n - 1`` tokens plus the root. The static KV cache makes the rollback between repeats free:
  every repeat writes the same slots ``[L, L + n)`` beyond the committed length ``L``, which stays put.
* **drafter**: one :meth:`~executor.drafters.Drafter.draft_logits` call for a single node (the cost of one
  drafted token of a chain) and for a tree level of ``w`` nodes (``w = 1, 2, 4, ...``), the nodes being the
  drafter's own top-``w`` children of the root.

Every measurement is repeated ``repeats`` times, round-robin over all sizes and widths (one repeat of each,
then the next), so that a change in the machine's load hits every size alike; the summary of each is the
median with its quartiles (IQR = spread), never the mean.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

__all__ = [
    "PROFILE_FORMAT",
    "PROFILE_VERSION",
    "check_profile",
    "context_ids",
    "is_profile",
    "power_of_two_sizes",
    "profile_costs",
    "profile_target_times",
    "summarise_times",
]

# torch is imported inside the measuring function only: the readers below serve ``plan-tree`` and
# ``plan-length``, which must not pay for importing torch.

#: ``format`` and ``version`` of the JSON written by ``specbound profile`` (documented in docs/profile.md).
PROFILE_FORMAT = "specbound-profile"
PROFILE_VERSION = 1


def power_of_two_sizes(max_size: int, name: str = "max_size") -> list[int]:
    """``[1, 2, 4, ..., max_size]``; ``max_size`` must be a power of two >= 1."""
    if (
        isinstance(max_size, bool)
        or not isinstance(max_size, int)
        or max_size < 1
        or max_size & (max_size - 1)
    ):
        raise ValueError(f"{name} must be a power of two >= 1, got {max_size!r}")
    return [1 << k for k in range(max_size.bit_length())]


def summarise_times(times: Sequence[float]) -> dict:
    """Median, quartiles, IQR, min and max of repeated timings (seconds), and the number of repeats."""
    array = np.asarray(times, dtype=np.float64)
    if array.size == 0:
        raise ValueError("times is empty")
    q1, median, q3 = np.percentile(array, [25, 50, 75])
    return {
        "median": float(median),
        "q1": float(q1),
        "q3": float(q3),
        "iqr": float(q3 - q1),
        "min": float(array.min()),
        "max": float(array.max()),
        "repeats": int(array.size),
    }


def context_ids(tokenizer, length: int, texts: Sequence[str] | None = None) -> list[int]:
    """``length`` token ids of realistic text: HumanEval prompts in task order, concatenated, cut at ``length``.

    ``texts`` replaces the HumanEval prompts (tests). Raises ``ValueError`` if they hold fewer tokens.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ValueError(f"context must be an integer >= 2 (tokens), got {length!r}")
    if texts is None:
        from experiments.prompts import humaneval_prompts

        texts = humaneval_prompts()
    ids: list[int] = []
    for text in texts:
        ids += tokenizer.encode(text)
        if len(ids) >= length:
            return ids[:length]
    raise ValueError(f"context: the prompts hold only {len(ids)} tokens, fewer than {length}")


def _synchronise(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _timed(call: Callable[[], object], device) -> float:
    _synchronise(device)
    start = time.perf_counter()
    call()
    _synchronise(device)
    return time.perf_counter() - start


def check_timing_arguments(sizes, repeats, warmup, context) -> tuple[list[int], list[int]]:
    """Validate the arguments every latency profile shares; returns the sorted distinct ``sizes`` and the
    ``context`` as ints. ``sizes`` must contain 1 (plain decoding, the baseline), ``repeats >= 1``,
    ``warmup >= 0`` and ``context`` at least 2 tokens (a prefill and a root)."""
    sizes = sorted({int(n) for n in sizes})
    if not sizes or sizes[0] != 1:
        raise ValueError(f"sizes must contain 1 (the plain-decoding baseline) and be >= 1, got {sizes}")
    for value, name, minimum in ((repeats, "repeats", 1), (warmup, "warmup", 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    context = [int(t) for t in context]
    if len(context) < 2:
        raise ValueError(f"context must hold at least 2 tokens, got {len(context)}")
    return sizes, context


def profile_costs(
    model,
    context: Sequence[int],
    *,
    drafter=None,
    sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    widths: Sequence[int] = (1, 2, 4, 8),
    repeats: int = 15,
    warmup: int = 2,
    progress: bool = False,
) -> dict:
    """Measure the target's forward time per number of new tokens and the drafter's cost per token and level.

    Parameters
    ----------
    model : executor.model.Transformer
        The target, in the dtype and on the device to profile.
    context : sequence of int
        The committed context (``>= 2`` tokens); ``context[:-1]`` is prefilled, ``context[-1]`` is the root.
    drafter : executor.drafters.Drafter, optional
        Built on ``model`` (e.g. by :func:`executor.drafters.parse_drafter`); ``None`` profiles the target only.
    sizes : sequence of int
        Numbers of new tokens per target forward; must contain 1 (plain decoding, the baseline).
    widths : sequence of int
        Tree-level widths for the drafter; 1 is one drafted token of a chain.
    repeats, warmup : int
        Timed rounds (``>= 1``) and untimed rounds first (``>= 0``). Each round measures every size and width
        once, in turn.
    progress : bool
        Show a tqdm progress bar over the rounds.

    Returns
    -------
    dict
        ``{"context_tokens", "repeats", "warmup", "target": {...}, "drafter": {...} or None}``, the
        measurement part of the JSON documented in docs/profile.md.
    """
    import torch

    from executor.decoders.base import DecodingState, DraftTree

    sizes, context = check_timing_arguments(sizes, repeats, warmup, context)
    widths = sorted({int(w) for w in widths})
    if not widths or widths[0] < 1:
        raise ValueError(f"widths must be integers >= 1, got {widths}")
    if drafter is not None and widths[-1] > model.config.vocab_size:
        raise ValueError(
            f"widths must be at most the vocabulary ({model.config.vocab_size}), got {widths[-1]}"
        )
    committed = len(context) - 1
    slots = committed + max(sizes[-1], widths[-1] + 1)
    if slots > model.config.max_seq_len:
        raise ValueError(
            f"context ({len(context)} tokens) + {max(sizes[-1], widths[-1] + 1)} new tokens need {slots} "
            f"positions; the model's context is {model.config.max_seq_len}"
        )
    device = model.tok_embeddings.weight.device
    filler = torch.tensor([context[i % len(context)] for i in range(sizes[-1])], device=device)

    hidden = drafter is not None and getattr(drafter, "needs_target_hidden", False)
    with torch.no_grad():
        # One spare slot: no timed call fills the whole cache, which a compiled model (executor.compiled)
        # would compile as a graph of its own inside the timing.
        model.setup_cache(slots + 1)
        out = model(
            torch.tensor([context[:-1]], device=device),
            torch.arange(committed, device=device),
            return_hidden=hidden,
        )

        def target_call(n: int) -> Callable[[], object]:
            tokens = filler[:n].clone()
            tokens[0] = context[-1]  # the root, then n - 1 "drafted" tokens
            positions = torch.arange(committed, committed + n, device=device)
            return lambda: model(tokens[None], positions)

        calls = {("target", n): target_call(n) for n in sizes}
        if drafter is not None:
            drafter.check_target(model)
            drafter.start(context, slots)
            state = DecodingState(tokens=list(context))
            if hidden:  # feature-level heads read the target's final hidden states of the committed prefix
                state.hidden = out[1][0]
            root_tree = DraftTree(context[-1])
            logits = drafter.draft_logits(state, root_tree, [0])
            if logits is None:
                raise ValueError(f"drafter {drafter.name!r} proposes nothing after this context")
            calls[("drafter", 0)] = lambda: drafter.draft_logits(state, root_tree, [0])
            if hidden:
                # Such a head keeps its own cache of committed entries; before each timed call it is rolled
                # back by one token (untimed), so the root call feeds one entry as in decoding, not none.
                shorter = DecodingState(tokens=list(context[:-1]))
                rollback = lambda: drafter.commit(shorter, root_tree, [0])  # noqa: E731
            top = torch.topk(logits[0].float(), widths[-1]).indices.tolist()
            for width in widths:
                tree = DraftTree(context[-1])
                nodes = [tree.add_child(0, token) for token in top[:width]]
                calls[("drafter", width)] = lambda tree=tree, nodes=nodes: drafter.draft_logits(
                    state, tree, nodes
                )
        samples: dict[tuple[str, int], list[float]] = {key: [] for key in calls}
        rounds = range(warmup + repeats)
        if progress:
            from tqdm import tqdm

            rounds = tqdm(rounds, desc="profile", unit="round")
        for round_index in rounds:
            for key, call in calls.items():  # round-robin: one repeat of everything per round
                if hidden and key[0] == "drafter":
                    rollback()
                if drafter is not None and key[0] == "drafter" and key[1] > 0:
                    calls[("drafter", 0)]()  # the root's K/V, which a level's nodes attend to
                elapsed = _timed(call, device)
                if round_index >= warmup:
                    samples[key].append(elapsed)

    target_stats = [{"n": n, **summarise_times(samples[("target", n)])} for n in sizes]
    base = target_stats[0]["median"]
    result = {
        "context_tokens": len(context),
        "repeats": repeats,
        "warmup": warmup,
        "target": {
            "sizes": sizes,
            "times": [row["median"] for row in target_stats],
            "relative": [row["median"] / base for row in target_stats],
            "stats": target_stats,
        },
        "drafter": None,
    }
    if drafter is not None:
        per_token = summarise_times(samples[("drafter", 0)])
        level_stats = [{"width": w, **summarise_times(samples[("drafter", w)])} for w in widths]
        result["drafter"] = {
            "name": drafter.name,
            "per_token": per_token,
            "per_level": {
                "widths": widths,
                "times": [row["median"] for row in level_stats],
                "stats": level_stats,
            },
            # What the planners charge: one drafted token of a chain, and the widest level measured (an
            # upper bound for any level of a tree of at most that width).
            "draft_time": per_token["median"],
            "level_time": level_stats[-1]["median"],
            "cost_ratio": per_token["median"] / base if base > 0 else math.inf,
        }
    return result


# --- reading a profile (plan-tree, plan-length) --------------------------------------------------------------


def is_profile(data) -> bool:
    """Whether parsed JSON is a ``specbound profile`` file (rather than an older plain latency table)."""
    return isinstance(data, dict) and data.get("format") == PROFILE_FORMAT


def _positive_times(values, name: str) -> list[float]:
    out = []
    for value in values:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ValueError(f"{name} must hold positive finite seconds, got {value!r}")
        out.append(float(value))
    return out


def check_profile(data, name: str = "--latency") -> dict:
    """Check the parts of a profile the planners use; ``ValueError`` naming ``name`` otherwise.

    The target's ``sizes`` must be strictly increasing integers starting at 1, with one positive time each;
    a drafter, if present, needs positive ``draft_time`` and ``level_time``.
    """
    if not is_profile(data):
        raise ValueError(f"{name}: not a specbound profile (no 'format': {PROFILE_FORMAT!r})")
    version = data.get("version")
    if version != PROFILE_VERSION:
        raise ValueError(
            f"{name}: profile version {version!r} is not supported (this is version {PROFILE_VERSION})"
        )
    target = data.get("target")
    if not isinstance(target, dict) or not isinstance(target.get("sizes"), list):
        raise ValueError(f"{name}: the profile lacks target.sizes and target.times")
    sizes, times = target["sizes"], target.get("times")
    if not isinstance(times, list) or len(times) != len(sizes) or not sizes:
        raise ValueError(f"{name}: target.sizes and target.times must be non-empty lists of the same length")
    if any(isinstance(n, bool) or not isinstance(n, int) for n in sizes) or sizes[0] != 1:
        raise ValueError(f"{name}: target.sizes must be integers starting at 1, got {sizes}")
    if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
        raise ValueError(f"{name}: target.sizes must be strictly increasing, got {sizes}")
    _positive_times(times, f"{name}: target.times")
    drafter = data.get("drafter")
    if drafter is not None:
        if not isinstance(drafter, dict):
            raise ValueError(f"{name}: drafter must be an object or null")
        _positive_times([drafter.get("draft_time"), drafter.get("level_time")], f"{name}: drafter times")
    return data


def profile_target_times(data, name: str = "--latency") -> dict[int, float]:
    """Seconds per target forward for every size ``1 .. max(sizes)``, from a profile's median times.

    Sizes between two measured ones are interpolated linearly (the measured sizes are powers of two); sizes
    beyond the largest measured one are left out, so a planner never extrapolates.
    """
    check_profile(data, name)
    sizes = data["target"]["sizes"]
    times = data["target"]["times"]
    every = np.arange(1, sizes[-1] + 1)
    return {int(n): float(t) for n, t in zip(every, np.interp(every, sizes, times), strict=True)}
