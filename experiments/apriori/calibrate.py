"""Calibration: the acceptance and latency profiles the theory needs, from the calibration half of the prompts.

The a-priori loop predicts every decoder's tokens per step :math:`\\tau` and speedup *before* it runs, from a
profile measured once per drafter and temperature on prompts the evaluation never sees (the split is fixed by
the seed, :func:`split_prompts`). The profile is built from the executor's step logs of a calibration chain:
each *verification event* (a node on the accepted path whose children were drafted) contributes one record,
:func:`event_record`, holding the theory's exact acceptance for every question the predictors ask at that
node:

* ``chain`` -- :math:`\\sum_x \\min(p, q)`, the acceptance of one speculative-sampling draft (Leviathan et
  al., ICML 2023, arXiv 2211.17192); its mean over the events at depth ``d`` is the conditional acceptance of
  position ``d + 1`` (the positional acceptance of a chain);
* ``ranks`` -- the probability that the ``k``-th child (drawn with the tree verifier's draft law) is the
  accepted one, :math:`\\alpha_k - \\alpha_{k-1}` with :math:`\\alpha_k` the verifier's exact acceptance with
  ``k`` drafts: Sequoia's positional acceptance vector, per depth (Chen et al., NeurIPS 2024,
  arXiv 2402.12374, §3.1);
* ``grid`` -- at the root, the acceptance of each multi-draft verifier with ``n`` drafts, and ``bound`` its
  optimum :func:`theory.optimal_acceptance` for the same draft law (Hu et al., ICLR 2025, arXiv 2502.18779);
* ``confidence`` -- the draft's top-1 probability (temperature 1), for the confidence-bucket model of the
  length rules (Kangaroo, arXiv 2404.18911; SpecDec++, arXiv 2405.19715).

At temperature 0 the logged distributions are one-hot; the rank of the target's argmax among the draft
logits (kept by :class:`RecordingDrafter`) then decides every acceptance exactly: ``k`` top drafts are
accepted iff that rank is at most ``k``.

Using the exact per-event acceptance instead of the 0/1 outcome (Rao-Blackwellisation) keeps the expectation
and lowers the variance of the profile. :func:`calibrate` turns event records and a latency profile into a
:class:`Calibration`; it is pure numpy so that it can be tested on synthetic logs.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np

__all__ = [
    "Calibration",
    "LatencyProfile",
    "RecordingDrafter",
    "TimedDrafter",
    "calibrate",
    "depth_buckets",
    "event_record",
    "measure_latency",
    "read_latency",
    "shallow_profile",
    "split_prompts",
    "tree_width",
    "verification_events",
]

#: A depth needs this many calibration events of its own; shallower estimates are carried down otherwise.
MIN_EVENTS = 5


def tree_width(temperature: float) -> int:
    """Children per node the tree predictors consider: the exact RRS-without-replacement acceptance with
    three or more drafts needs a small vocabulary, so sampled trees have at most 2 children per node; at
    temperature 0 the children are the draft's top tokens and any rank is exact."""
    return 4 if temperature == 0 else 2


def split_prompts(count: int, seed: int) -> tuple[list[int], list[int]]:
    """Split prompt indices ``0 .. count-1`` into a calibration half and an evaluation half, fixed by ``seed``.

    The calibration half gets ``count // 2`` prompts (at least one), the evaluation half the rest; both are
    sorted. ``count >= 2``.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 2:
        raise ValueError(
            f"prompts must be an integer >= 2 (one to calibrate, one to evaluate), got {count!r}"
        )
    order = np.random.default_rng(seed).permutation(count)
    half = max(count // 2, 1)
    return sorted(int(i) for i in order[:half]), sorted(int(i) for i in order[half:])


def verification_events(step):
    """Yield ``(row, node, n_children, accepted, depth)`` for each verified node of one step log.

    ``row`` indexes the step's logged distributions. Expanded nodes off the accepted path were never verified
    (the walk did not reach them) and yield nothing.
    """
    on_path = {node: depth for depth, node in enumerate(step.accepted_path)}
    for row, node in enumerate(step.expanded):
        if node in on_path:
            depth = on_path[node]
            n_children = sum(1 for parent in step.parents if parent == node)
            yield row, node, n_children, depth + 1 < len(step.accepted_path), depth


def event_record(
    p: np.ndarray,
    q: np.ndarray,
    draft_logits: np.ndarray,
    *,
    temperature: float,
    depth: int,
    n_children: int,
    accepted: bool,
    verifier: str,
    tree_verifier: str = "rrs_wor",
    grid: tuple[tuple[str, int], ...] = (),
) -> dict:
    """Everything the predictors need from one verification event (see the module docstring).

    ``verifier`` is the run's own verifier (``"rrs"`` for a chain); ``replay`` is its exact acceptance with
    the event's ``n_children`` drafts, the replay check of the executor against the theory. ``grid`` lists
    the ``(verifier, n)`` pairs whose root acceptance and optimum are recorded (only at depth 0).
    """
    import theory

    logits = np.asarray(draft_logits, dtype=np.float64)
    finite = logits[np.isfinite(logits)]
    shifted = np.exp(finite - finite.max())
    record = {
        "depth": int(depth),
        "children": int(n_children),
        "accepted": int(bool(accepted)),
        "confidence": float(1.0 / shifted.sum()),
    }
    width = tree_width(temperature)
    if temperature == 0:
        target = int(np.argmax(p))
        rank = 1 + int(np.sum(logits > logits[target]) + np.sum(logits[:target] == logits[target]))
        record["chain"] = float(rank == 1)
        record["ranks"] = [float(rank == k) for k in range(1, width + 1)]
        record["replay"] = float(rank <= n_children)
        if depth == 0:
            record["grid"] = {f"{name}-n{n}": float(rank <= n) for name, n in grid}
            record["bound"] = dict(record["grid"])
        return record
    # Each exact value at V = 49,152 costs milliseconds and validate computes them at every event: none twice.
    record["chain"] = float(theory.acceptance_rate(p, q))
    tree_check = theory.verifier(tree_verifier)
    # With one draft every verifier is speculative sampling: the first rank's cumulative acceptance is the chain's.
    cumulative = [0.0, record["chain"]] + [float(tree_check.acceptance(p, q, k)) for k in range(2, width + 1)]
    record["ranks"] = [max(cumulative[k] - cumulative[k - 1], 0.0) for k in range(1, width + 1)]
    if n_children <= 1 or (verifier == "spechub" and n_children != 2):
        record["replay"] = record["chain"] if n_children == 1 else 0.0
    else:
        record["replay"] = float(theory.verifier(verifier).acceptance(p, q, n_children))
    if depth == 0:
        record["grid"], record["bound"] = {}, {}
        optima = {}  # (n, draft law) -> alpha*: RRS, K-SEQ and the optimal verifier share the i.i.d. one
        for name, n in grid:
            check = theory.verifier(name)
            own = n_children > 1 and (name, n) == (verifier, n_children)  # the replay is this very value
            record["grid"][f"{name}-n{n}"] = record["replay"] if own else float(check.acceptance(p, q, n))
            if (n, check.draft) not in optima:
                optima[n, check.draft] = float(theory.optimal_acceptance(p, q, n, draft=check.draft))
            record["bound"][f"{name}-n{n}"] = optima[n, check.draft]
    return record


class TimedDrafter:
    """Wraps a drafter, forwarding everything to ``inner``, and keeps the wall time of each draft call:
    ``call_times`` holds ``(level, nodes, seconds)``, ``level`` being the call's index within its step (0: the
    root's pass, which also catches up on the tokens the last step committed; counted per step once
    :meth:`attach` has wrapped the decoder's steps). ``drafting`` is true during a call (a
    :class:`~experiments.apriori.run.StepClock` then leaves the target passes it makes, as an early exit's, to
    the drafter)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.call_times: list[tuple[int, int, float]] = []
        self.drafting = False
        self.level = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def draft_logits(self, state, tree, nodes):
        start = time.perf_counter()
        self.drafting = True
        try:
            logits = self.inner.draft_logits(state, tree, nodes)
        finally:
            self.drafting = False
        self.call_times.append((self.level, len(nodes), time.perf_counter() - start))
        self.level += 1
        self._keep(nodes, logits)
        return logits

    def _keep(self, nodes, logits) -> None:
        """What a subclass keeps of a call's logits (nothing here)."""

    def _begin_step(self) -> None:
        self.level = 0

    def _end_step(self, log) -> None:
        """What a subclass keeps when a step ends (nothing here)."""

    def attach(self, decoder) -> None:
        """Route ``decoder``'s drafting through this wrapper, counting levels per step."""
        decoder.drafter = self
        original = decoder.step

        def step(state, generator):
            self._begin_step()
            log = original(state, generator)
            self._end_step(log)
            return log

        decoder.step = step


class RecordingDrafter(TimedDrafter):
    """A :class:`TimedDrafter` that also keeps, for every step, the raw draft logits of every node it was asked
    about: once attached (:meth:`attach`), ``logits_per_step[i]`` maps node -> logits (numpy float32) for step
    ``i`` of the generation."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.current: dict[int, np.ndarray] = {}
        self.logits_per_step: list[dict[int, np.ndarray]] = []

    def _keep(self, nodes, logits) -> None:
        if logits is not None:
            rows = logits.detach().float().cpu().numpy()
            for node, row in zip(nodes, rows, strict=True):
                self.current[node] = row

    def _begin_step(self) -> None:
        super()._begin_step()
        self.current = {}

    def _end_step(self, log) -> None:
        self.logits_per_step.append({node: self.current[node] for node in log.expanded})


@dataclass
class LatencyProfile:
    """Seconds to verify ``n`` tokens (``target_time[n]``) and per draft forward pass (``draft_time``).

    ``pass_times[k]``, when known, is the seconds of the ``k``-th draft pass of a decoding step (the first,
    the root's, also feeds the drafter the tokens the last step committed; on SmolLM2's feature head here the
    later ones cost 0.7-0.9 of it); :meth:`drafting` charges them, and ``draft_time`` where they are unknown.
    """

    target_time: dict[int, float]
    draft_time: float
    source: str = "measured in the run"
    pass_times: list[float] | None = None

    def __post_init__(self) -> None:
        self.target_time = {int(n): float(t) for n, t in self.target_time.items()}
        if 1 not in self.target_time or not self.target_time[1] > 0:
            raise ValueError("latency: target_time must give a positive time for 1 token")
        if not np.isfinite(self.draft_time) or self.draft_time < 0:
            raise ValueError(f"latency: draft_time must be a non-negative number, got {self.draft_time!r}")
        if self.pass_times is not None:
            self.pass_times = [float(t) for t in self.pass_times]
            if not self.pass_times or not all(np.isfinite(t) and t >= 0 for t in self.pass_times):
                raise ValueError(f"latency: pass_times must be non-negative numbers, got {self.pass_times!r}")

    def drafting(self, passes: int) -> float:
        """Seconds of a step's first ``passes`` draft passes (``pass_times``, its last entry repeated beyond
        its length; ``passes * draft_time`` without them), as :func:`theory.plan_tree` charges them."""
        from theory import drafting_seconds

        return drafting_seconds(self.draft_time if self.pass_times is None else self.pass_times, passes)

    def t(self, n: float) -> float:
        """``target_time`` at ``n`` tokens, linear between measured sizes and beyond the largest one."""
        sizes = np.array(sorted(self.target_time), dtype=np.float64)
        times = np.array([self.target_time[int(s)] for s in sizes])
        if n <= sizes[-1] or sizes.size == 1:
            return float(np.interp(n, sizes, times))
        slope = (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
        return float(times[-1] + slope * (n - sizes[-1]))

    def to_json(self) -> dict:
        return {
            "target_time": {str(n): t for n, t in self.target_time.items()},
            **{"draft_time": self.draft_time, "source": self.source, "pass_times": self.pass_times},
        }

    @classmethod
    def from_json(cls, data: dict) -> LatencyProfile:
        return cls(
            {int(n): t for n, t in data["target_time"].items()},
            data["draft_time"],
            data["source"],
            data.get("pass_times"),
        )

    def with_pass_times(self, paths: list[dict]) -> LatencyProfile:
        """This profile with ``pass_times`` measured in the calibration chains' unit records ``paths``
        (``draft_calls``, ``step_sizes`` and ``target_seconds`` of :func:`~experiments.apriori.run.run_generation`);
        unchanged when no path has them (units logged before they were kept).

        The pass at level ``k`` costs the median over the chains' level-``k`` calls of seconds times
        ``sum(t(size)) / target_seconds``, its path's profile time of the target's passes over their measured
        time: the machine's speed drifts by 10-30% over seconds (docs/validate.md), and the ratio to the
        target's own passes in the same path puts the calls on the profile's scale. The profile's own draft
        pass, a root and a child on a synthetic context, read 5.4 ms where the chains' roots took 4.3 ms (in
        profile time) and their later passes 3.3 ms, which predicted a 4-draft chain's speedup at 0.79x
        against 0.90x measured.
        """
        by_level: dict[int, list[float]] = {}
        for path in paths:
            if not path.get("draft_calls") or not path.get("target_seconds"):
                continue
            scale = sum(self.t(size) for size in path["step_sizes"]) / path["target_seconds"]
            for level, seconds in path["draft_calls"]:
                by_level.setdefault(int(level), []).append(seconds * scale)
        if 0 not in by_level:
            return self
        times = [
            float(np.median(by_level[level])) for level in range(max(by_level) + 1)
        ]  # levels 0..L all occur
        return replace(
            self, pass_times=times, source=f"{self.source}; draft passes from the calibration chains"
        )


def read_latency(path: str) -> LatencyProfile:
    """A latency profile from ``specbound profile``'s JSON (``"format": "specbound-profile"``: the target's
    ``target.sizes`` / ``target.times`` and ``drafter.draft_time``, docs/profile.md), or the simple form
    ``{"target_time": {n: seconds}, "draft_time": seconds}``; ``ValueError`` naming ``--latency`` otherwise.
    """
    try:
        with open(path) as stream:
            data = json.load(stream)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"--latency: cannot read {path}: {error}") from None
    table, draft = None, None
    if isinstance(data, dict) and data.get("format") == "specbound-profile":
        target, drafter = data.get("target") or {}, data.get("drafter") or {}
        sizes, times = target.get("sizes"), target.get("times")
        if isinstance(sizes, list) and isinstance(times, list) and len(sizes) == len(times):
            table = dict(zip(sizes, times, strict=True))
        draft = drafter.get("draft_time")
    elif isinstance(data, dict):
        table, draft = data.get("target_time"), data.get("draft_time")
    if not isinstance(table, dict) or not isinstance(draft, (int, float)):
        raise ValueError(
            f"--latency: {path} needs the target's times per size and the drafter's draft_time "
            "(a `specbound profile` file measured with a drafter)"
        )
    try:
        return LatencyProfile({int(n): float(t) for n, t in table.items()}, float(draft), f"read from {path}")
    except (TypeError, ValueError) as error:
        raise ValueError(f"--latency: {path}: {error}") from None


#: Timed rounds of :func:`measure_latency` by default (its docstring says why 15).
LATENCY_REPEATS = 15


def measure_latency(
    model, drafter, sizes, *, temperature: float, context: int = 160, repeats: int = LATENCY_REPEATS
) -> LatencyProfile:
    """Measure the latency profile in the run: median seconds of one verification pass over ``n`` tree nodes
    (a star: the root and ``n - 1`` children, scored with the tree mask, plus the target's probabilities) for
    each ``n`` in ``sizes``, and of one steady-state draft pass.

    ``drafter`` is a drafter name (:func:`executor.drafters.parse_drafter`) or a drafter object. The drafter
    sees the state the decoders give it (:meth:`executor.decoders.base.Decoder.generate`): the target
    prefills the context, keeping its hidden states when the drafter ``needs_target_hidden`` (a feature head
    drafts nothing without them), and the drafter's first call, which feeds it the whole context, is not
    timed. Each round then plays one decoding step: a token is committed (the root and the bonus token, as
    after a rejected draft), and the draft pass is the mean of the two calls a chain step makes, the root's
    (which catches up on the committed token) and one child's.

    Every size and the drafter are timed once per round, in turn (round-robin), each right after a pass over
    one token: ``t(n)`` is the median of ``t(1)`` times the median ratio of each pair. The machine's speed
    drifts by 10-30% over seconds (docs/validate.md), which the ratio of two passes milliseconds apart
    cancels: with one median per size, a profile measured in a slow spell had t(3) = 30.8 ms > t(5) = 26.7 ms.
    The first round warms up and is dropped. ``repeats`` rounds: on SmolLM2 here the ratios t(n) / t(1) of
    three profiles moved by up to 0.28 between runs with 5 rounds, and by at most 0.07 between two with 15
    (about 18 s for n = 1..12).

    ``t(n)`` is the target's forward pass alone and the draft pass the drafter's ``draft_logits`` call alone,
    exactly what the run's clocks time (:class:`~experiments.apriori.run.StepClock`, :class:`RecordingDrafter`):
    the rest of a step (the attention mask, the probabilities, verification) is the configuration's measured
    overhead, which the prediction adds on top. Timing them here as well counted them twice.
    """
    import torch

    from executor.decoders.base import DecodingState, DraftTree, Sampling, run_tree
    from executor.drafters import parse_drafter

    sizes = sorted({int(n) for n in sizes})
    sampling = Sampling(temperature=temperature)
    rounds = repeats + 1
    context = max(2, min(context, model.config.max_seq_len - max(sizes) - rounds - 2))
    slots = context + rounds + max(sizes) + 2
    device = model.tok_embeddings.weight.device
    model.setup_cache(slots)
    prompt = [1 + i % max(model.config.vocab_size - 1, 1) for i in range(context + 1)]
    draft = parse_drafter(drafter, model) if isinstance(drafter, str) else drafter
    draft.check_target(model)
    state = DecodingState(tokens=list(prompt))
    samples: dict = {n: [] for n in [*sizes, "draft"]}
    with torch.no_grad():
        if getattr(draft, "needs_target_hidden", False):
            weight = model.tok_embeddings.weight
            state.hidden = torch.zeros(slots, model.config.dim, dtype=weight.dtype, device=device)
        out = model(
            torch.tensor([prompt[:-1]], device=device),
            torch.arange(context, device=device),
            return_hidden=state.hidden is not None,
        )
        if state.hidden is not None:
            state.hidden[:context] = out[1][0]
        draft.start(prompt, slots)
        draft.draft_logits(state, DraftTree(prompt[-1]), [0])  # feeds the whole context: not a steady step

        def target_pass(n: int) -> float:
            tree = DraftTree(1)
            for child in range(n - 1):
                tree.add_child(0, child + 2)
            with _ForwardClock(model) as clock:
                sampling.probs(run_tree(model, tree, list(range(n)), state.committed))
            return clock.seconds

        one: list[float] = []  # every pass over one token, and each timed item's ratio to the one before it
        for _ in range(rounds):
            for n in [*sizes, "draft"]:
                one.append(target_pass(1))
                seconds = _draft_step(draft, state, sampling) if n == "draft" else target_pass(n)
                samples[n].append(seconds / one[-1])
    scale = float(np.median(one[len(one) // rounds :]))  # the first round warms up
    table = {n: scale * float(np.median(samples[n][1:])) for n in sizes}
    draft_time = scale * float(np.median(samples["draft"][1:]))
    return LatencyProfile(table, draft_time, "measured in the run (interleaved)")


def _draft_step(draft, state, sampling) -> float:
    """Commit one token (root and bonus, with its target feature when kept), then time the root's and one
    child's draft pass; returns their mean, the seconds of one draft pass in a steady decoding step."""
    from executor.decoders.base import DraftTree

    previous = DraftTree(state.tokens[-1])
    draft.commit(state, previous, [0])
    if state.hidden is not None:  # the committed token's feature: any row of the right scale will do
        state.hidden[state.committed] = state.hidden[state.committed - 1]
    state.tokens.append(state.tokens[-2])
    tree = DraftTree(state.tokens[-1])
    start = time.perf_counter()
    logits = draft.draft_logits(state, tree, [0])
    seconds = time.perf_counter() - start
    if logits is None:
        return seconds
    child = tree.add_child(0, int(sampling.probs(logits)[0].argmax()))
    start = time.perf_counter()
    draft.draft_logits(state, tree, [child])
    return (seconds + time.perf_counter() - start) / 2


class _ForwardClock:
    """Seconds spent in ``model.forward`` within a ``with`` block (the target's passes only, as
    :class:`~experiments.apriori.run.StepClock` counts them); the model's own ``forward`` is restored after."""

    def __init__(self, model) -> None:
        self.model, self.seconds = model, 0.0

    def __enter__(self):
        self._own = self.model.__dict__.get("forward")
        forward = self.model.forward

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        self.model.forward = timed
        return self

    def __exit__(self, *exc) -> None:
        if self._own is None:
            self.model.__dict__.pop("forward", None)
        else:
            self.model.forward = self._own


@dataclass
class Calibration:
    """The acceptance profile of one drafter at one temperature, and the latency profile.

    ``positional[d]`` is the conditional acceptance of chain position ``d + 1``; ``rank_matrix[d][k]`` the
    probability that the ``(k+1)``-th child of a depth-``d`` node is the accepted one (a per-depth Sequoia
    matrix); ``multidraft[key]`` and ``bound[key]`` the root acceptance and its optimum for ``key`` =
    ``"verifier-nN"``; ``buckets`` the confidence-bucket model (confidence, acceptance and frequency per
    bucket); ``events[d]`` how many calibration events depth ``d`` had.
    ``depth_buckets[d]`` is the bucket model of chain position ``d + 1`` alone (same edges, :func:`depth_buckets`);
    ``overhead[label]`` the measured seconds per step a decoder configuration spends beyond its target and draft
    passes (verification, sampling, bookkeeping; ``"ar"`` for plain decoding), filled in by the run from its
    overhead units on the calibration half.
    ``shallow`` is the root profile of one-draft calibration chains (:func:`shallow_profile`; empty when none
    ran): where a deep chain's roots fall (after a rejection, in clusters of hard positions) its root
    acceptance is lower than where a depth-1 decoder's roots fall, so depth-1 configurations are predicted from
    it (:func:`experiments.apriori.predict.predict`).
    """

    temperature: float
    positional: list[float]
    rank_matrix: list[list[float]]
    multidraft: dict[str, float]
    bound: dict[str, float]
    buckets: dict[str, list[float]]
    events: list[int]
    latency: LatencyProfile
    prompts: list[int] = field(default_factory=list)
    depth_buckets: list[dict[str, list[float]]] = field(default_factory=list)
    overhead: dict[str, float] = field(default_factory=dict)
    shallow: dict = field(default_factory=dict)

    @property
    def depth(self) -> int:
        return len(self.positional)

    @property
    def cost_ratio(self) -> float:
        """Leviathan et al.'s ``c``: one draft pass over one target pass of one token."""
        return self.latency.draft_time / self.latency.target_time[1]

    def to_json(self) -> dict:
        data = asdict(self)
        data["latency"] = self.latency.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict) -> Calibration:
        return cls(**{**data, "latency": LatencyProfile.from_json(data["latency"])})


def shallow_profile(records: list[dict], temperature: float) -> dict:
    """The root profile of one-draft calibration chains (their event records): ``positional`` (the root's
    chain acceptance), ``rank_matrix`` (its per-rank row), ``multidraft`` and ``bound`` (the grid), and
    ``events``. What :class:`Calibration` keeps as ``shallow``."""
    roots = [r for r in records if r["depth"] == 0]
    if not roots:
        raise ValueError("records: the one-draft calibration chains have no verification event at the root")
    multidraft, bound = _root_grids(roots)
    return {
        "positional": float(np.mean([r["chain"] for r in roots])),
        "rank_matrix": np.mean([r["ranks"][: tree_width(temperature)] for r in roots], axis=0).tolist(),
        "multidraft": multidraft,
        "bound": bound,
        "events": len(roots),
    }


def _root_grids(roots: list[dict]) -> tuple[dict[str, float], dict[str, float]]:
    """Mean multi-draft acceptance and bound per grid key (verifier, n) over root event records."""
    keys = sorted(roots[0].get("grid", {}))
    multidraft = {k: float(np.mean([r["grid"][k] for r in roots])) for k in keys}
    return multidraft, {k: float(np.mean([r["bound"][k] for r in roots])) for k in keys}


def _per_depth(values: list[list], depth: int, fallback) -> tuple[np.ndarray, list[int]]:
    """Mean of each depth's values; a depth with fewer than MIN_EVENTS events takes the previous estimate."""
    means, counts, previous = [], [], np.asarray(fallback, dtype=np.float64)
    for d in range(depth):
        rows = values[d]
        counts.append(len(rows))
        if len(rows) >= MIN_EVENTS or (d == 0 and rows):
            previous = np.mean(np.asarray(rows, dtype=np.float64), axis=0)
        means.append(previous)
    return np.array(means), counts


def confidence_buckets(confidence, acceptance, n_buckets: int, edges=None) -> dict[str, list[float]]:
    """Group events into at most ``n_buckets`` confidence quantile buckets: the i.i.d. bucket model of
    :class:`theory.ConfidenceBuckets`.

    Returns the bucket ``edges`` (a confidence ``c`` is in bucket ``searchsorted(edges, c, "right")``) and,
    per bucket, its mean confidence, mean acceptance and frequency (an empty bucket gets probability 0).
    ``edges`` fixes the bucket edges instead of the quantiles (a bootstrap resample keeps the rule's buckets).
    """
    confidence = np.asarray(confidence, dtype=np.float64)
    acceptance = np.asarray(acceptance, dtype=np.float64)
    if edges is None:
        edges = np.unique(np.quantile(confidence, np.linspace(0, 1, n_buckets + 1)[1:-1]))
    edges = np.asarray(edges, dtype=np.float64)
    labels = np.searchsorted(edges, confidence, side="right")
    bounds = np.concatenate([[0.0], edges, [1.0]])
    buckets = {"edges": [float(e) for e in edges], "confidence": [], "acceptance": [], "probability": []}
    for label in range(edges.size + 1):
        mask = labels == label
        middle = 0.5 * (bounds[label] + bounds[label + 1])
        buckets["confidence"].append(float(confidence[mask].mean()) if mask.any() else float(middle))
        buckets["acceptance"].append(float(acceptance[mask].mean()) if mask.any() else 0.0)
        buckets["probability"].append(float(mask.mean()))
    return buckets


def depth_buckets(records: list[dict], pooled: dict, depth: int) -> list[dict[str, list[float]]]:
    """The confidence-bucket model per chain position, on the pooled model's edges.

    At position ``d + 1`` the bucket frequencies are those of the depth-``d`` events (a depth with fewer than
    :data:`MIN_EVENTS` events takes the depth above it), and a bucket's acceptance is its depth-``d`` mean
    shrunk towards the pooled bucket acceptance with :data:`MIN_EVENTS` pseudo-events,
    ``(n a_d + m a) / (n + m)``. The pooled model (:class:`theory.ConfidenceBuckets`) assumes every
    position draws its bucket from one law; a drafter's confidence falls with depth (on the accepted path the
    easy tokens come first), which this model keeps.
    """
    edges = np.asarray(pooled["edges"], dtype=np.float64)
    size = edges.size + 1
    laws, previous = [], (list(pooled["probability"]), list(pooled["acceptance"]))
    for d in range(depth):
        rows = [r for r in records if r["depth"] == d]
        if len(rows) >= MIN_EVENTS or (d == 0 and rows):
            labels = np.searchsorted(edges, [r["confidence"] for r in rows], side="right")
            chain = np.array([r["chain"] for r in rows], dtype=np.float64)
            counts = np.bincount(labels, minlength=size).astype(np.float64)
            sums = np.bincount(labels, weights=chain, minlength=size)
            prior = np.asarray(pooled["acceptance"], dtype=np.float64)
            acceptance = (sums + MIN_EVENTS * prior) / (counts + MIN_EVENTS)
            previous = ((counts / counts.sum()).tolist(), acceptance.tolist())
        laws.append(
            {"probability": [float(v) for v in previous[0]], "acceptance": [float(v) for v in previous[1]]}
        )
    return laws


def calibrate(
    records: list[dict],
    latency: LatencyProfile,
    *,
    temperature: float,
    depth: int,
    n_buckets: int = 4,
    prompts: list[int] | None = None,
    edges=None,
) -> Calibration:
    """The :class:`Calibration` of ``depth`` positions from event records (:func:`event_record`).

    Needs at least one depth-0 event. Depths without enough events of their own
    (:data:`MIN_EVENTS`) reuse the estimate of the depth above them: a chain that is rarely accepted far
    gives little evidence about its deep positions.
    """
    if not any(r["depth"] == 0 for r in records):
        raise ValueError("records: the calibration run has no verification event at the root")
    width = tree_width(temperature)
    by_depth_chain: list[list] = [[] for _ in range(depth)]
    by_depth_ranks: list[list] = [[] for _ in range(depth)]
    for r in records:
        if r["depth"] < depth:
            by_depth_chain[r["depth"]].append(r["chain"])
            by_depth_ranks[r["depth"]].append(r["ranks"][:width])
    positional, counts = _per_depth(by_depth_chain, depth, 0.0)
    ranks, _ = _per_depth(by_depth_ranks, depth, np.zeros(width))
    multidraft, bound = _root_grids([r for r in records if r["depth"] == 0])
    confidence = [r["confidence"] for r in records]
    buckets = confidence_buckets(confidence, [r["chain"] for r in records], n_buckets, edges)
    return Calibration(
        temperature=float(temperature),
        positional=[float(a) for a in positional],
        rank_matrix=[[float(a) for a in row] for row in ranks],
        multidraft=multidraft,
        bound=bound,
        buckets=buckets,
        events=counts,
        latency=latency,
        prompts=list(prompts or []),
        depth_buckets=depth_buckets(records, buckets, depth),
    )
