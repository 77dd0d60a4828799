"""Predict, before running: each decoder configuration's tokens per step, acceptance by position and speedup,
from a :class:`~experiments.apriori.calibrate.Calibration` alone.

A step of every decoder costs one target pass over the tree it verifies and one draft pass per drafted level,
so with the calibrated latencies (``t(n)`` seconds to verify ``n`` tokens, ``t_d(k)`` for a step's ``k``-th
draft pass)

.. math:: \\text{speedup} = \\frac{\\tau \\; t(1)}{E[t(\\text{tree size})] + E[\\textstyle\\sum_{k < \\text{passes}} t_d(k)]}

against plain decoding (Leviathan et al., ICML 2023, arXiv 2211.17192, Theorem 3.8, with the measured
``t(n)`` of Sequoia, Chen et al., NeurIPS 2024, arXiv 2402.12374, §4.1; ``t_d(k)`` is the ``k``-th draft pass of
a step, measured in the calibration chains: :meth:`~experiments.apriori.calibrate.LatencyProfile.drafting`).
The tokens per step ``τ``:

* **chain** of ``γ`` drafts: :func:`theory.expected_tokens` of the positional acceptance; the *optimal* chain
  is :func:`theory.plan_tree`'s best chain (width 1) for the measured ``t(n)`` and draft passes;
* **multi-draft** (verifier, ``n``): ``1 + α`` with ``α`` the calibrated root acceptance of that verifier;
* **static tree**: :func:`theory.tree_expected_tokens` with the per-depth rank matrix; the tree is
  :func:`theory.plan_tree`'s for the measured latencies (and, for the budget sweep, the planner's best tree
  of each size);
* **dynamic tree** (the executor's level-wise best-first growth, DySpec / EAGLE-2): the tree that growth
  builds when each candidate's score is its positional acceptance (:func:`level_tree`);
* **stop rules**: SpecDec++'s threshold and Kangaroo's confidence stop (:func:`theory.specdecpp_threshold`,
  :func:`theory.kangaroo_confidence_stop`) with thresholds from :func:`theory.optimal_length_policy` on the
  calibrated :class:`theory.ConfidenceBuckets`; ``τ`` from :func:`theory.evaluate_rule`, the law of the
  draft length from :func:`length_law`. The executor runs the very same rule on the bucketed confidence of
  its drafts (:class:`BucketStopRule`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np

from experiments.apriori.calibrate import Calibration, tree_width

__all__ = [
    "BucketStopRule",
    "DecoderConfig",
    "Prediction",
    "bucket_model",
    "depth_length_law",
    "length_law",
    "level_tree",
    "plan_configurations",
    "predict",
    "stop_rules",
]


@dataclass(frozen=True)
class DecoderConfig:
    """One decoder configuration of the a-priori run.

    ``kind`` is ``"ar"``, ``"chain"`` (``gamma``), ``"multidraft"`` (``verifier``, ``n``), ``"tree"``
    (static ``parents``, verified with ``verifier``), ``"dynamic"`` (``budget``, ``gamma`` levels,
    ``n`` = branching) or ``"stop"`` (a chain of at most ``gamma`` drafts cut by ``rule`` with ``threshold``).
    """

    label: str
    kind: str
    verifier: str = "rrs"
    n: int = 1
    gamma: int = 0
    parents: tuple[int, ...] = ()
    budget: int = 0
    rule: str = ""
    threshold: float = 0.0
    note: str = ""

    def to_json(self) -> dict:
        return {**asdict(self), "parents": list(self.parents)}

    @classmethod
    def from_json(cls, data: dict) -> DecoderConfig:
        return cls(**{**data, "parents": tuple(data["parents"])})


@dataclass
class Prediction:
    """What the theory expects of one configuration: ``tau``, ``acceptance[i]`` = P(the accepted path reaches
    depth ``i + 1``), the step time and the speedup over plain decoding."""

    tau: float
    acceptance: list[float]
    step_time: float
    speedup: float
    detail: dict = field(default_factory=dict)


def _matrix(cal: Calibration) -> np.ndarray:
    return np.asarray(cal.rank_matrix, dtype=np.float64)


def level_tree(matrix, budget: int, max_depth: int, branching: int):
    """The tree the executor's :class:`~executor.decoders.DynamicTree` grows when every candidate child's score
    is its path's positional acceptance; returns ``(theory.Tree, draft passes)``.

    At each level every frontier node ``v`` offers its ``k``-th child with score ``s(v) * acc[depth][k]``; the
    ``branching`` best candidates of the level (fewer when the budget runs out) are drafted (EAGLE-2, Li et
    al., EMNLP 2024, arXiv 2406.16858; DySpec, Xiong et al., arXiv 2410.11744, under positional acceptance).
    """
    import theory

    matrix = np.atleast_2d(np.asarray(matrix, dtype=np.float64))
    parents, scores, frontier, passes = [-1], [1.0], [0], 0
    for level in range(max_depth):
        room = budget - len(parents)
        if room <= 0 or not frontier:
            break
        passes += 1
        row = matrix[min(level, matrix.shape[0] - 1)]
        candidates = [
            (scores[v] * row[k], i, k, v)
            for i, v in enumerate(frontier)
            for k in range(min(branching, row.size))
        ]
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
        counts = dict.fromkeys(frontier, 0)
        for _, _, _, v in candidates[: min(branching, room)]:
            counts[v] += 1
        frontier = []
        for v, count in counts.items():
            for k in range(count):
                parents.append(v)
                scores.append(scores[v] * row[k])
                frontier.append(len(parents) - 1)
    return theory.Tree(parents), passes


def bucket_model(cal: Calibration, horizon: int):
    """The calibrated confidence-bucket model (:class:`theory.ConfidenceBuckets`) with ``horizon`` drafts."""
    import theory

    b = cal.buckets
    return theory.ConfidenceBuckets(b["confidence"], b["acceptance"], b["probability"], max_length=horizon)


def stop_rules(cal: Calibration, horizon: int) -> dict[str, float]:
    """Thresholds from :func:`theory.optimal_length_policy` on the calibrated bucket model.

    SpecDec++: the policy's own threshold on the probability that a drafted token is rejected
    (``rejection_threshold``, clipped to [0, 1]). Kangaroo: the lowest bucket confidence after which the
    optimal policy continues past a single drafted token (1 when it never does).
    """
    import theory

    model = bucket_model(cal, horizon)
    # The policy prices every drafted token alike: the mean of the draft passes the predictions charge.
    draft_time = cal.latency.drafting(horizon) / horizon
    costs = theory.LengthCosts(draft_time=draft_time, target_time=cal.latency.target_time[1])
    policy = theory.optimal_length_policy(model, costs)
    h = policy.rejection_threshold if policy.rejection_threshold is not None else policy.threshold
    b = cal.buckets
    mean = float(np.dot(b["probability"], b["acceptance"]))
    go = [
        c
        for c, a, w in zip(b["confidence"], b["acceptance"], b["probability"], strict=True)
        if w > 0 and policy.should_continue(theory.DraftState(1, a, a, c, None, mean), None)
    ]
    return {
        "specdecpp": float(np.clip(h, 0.0, 1.0)),
        "kangaroo": float(min(go)) if go else 1.0,
        "policy_tau": policy.tokens_per_step,
    }


def _theory_rule(rule: str, threshold: float, horizon: int):
    import theory

    if rule == "specdecpp":
        return theory.specdecpp_threshold(threshold, max_length=horizon)
    if rule == "kangaroo":
        return theory.kangaroo_confidence_stop(threshold, max_length=horizon)
    raise ValueError(f"rule must be 'specdecpp' or 'kangaroo', got {rule!r}")


def length_law(rule, model) -> tuple[np.ndarray, np.ndarray]:
    """Exact law of one step under a memoryless length rule: ``P(K = k)`` for ``k = 0 .. horizon`` drafted
    tokens, and ``reach[i]`` = P(the accepted path reaches depth ``i + 1``).

    Forward enumeration of the draft states (bucket counts and newest bucket, as in
    :func:`theory.evaluate_rule`; ``1 + sum(reach)`` is its ``tokens_per_step``).
    """
    import theory

    horizon = model.horizon
    k_law, reach = np.zeros(horizon + 1), np.zeros(horizon)
    level = {((), None): (1.0, 1.0)}
    for drafted in range(horizon + 1):
        law = model.law(drafted + 1) if drafted < horizon else None
        following: dict = {}
        for (counts, last), (mass, prob) in level.items():
            current = model.law(max(drafted, 1))
            state = theory.DraftState(
                drafted,
                prob,
                None if last is None else float(current.acceptance[last]),
                None if last is None else float(current.confidence[last]),
                None if last is None or current.entropy is None else float(current.entropy[last]),
                None if law is None else law.mean_acceptance,
            )
            if law is None or not rule.should_continue(state, None):
                k_law[drafted] += mass
                continue
            base = counts or (0,) * law.probability.shape[0]
            for bucket in np.flatnonzero(law.probability):
                branch = mass * law.probability[bucket]
                survival = prob * law.acceptance[bucket]
                reach[drafted] += branch * survival
                key = (base[:bucket] + (base[bucket] + 1,) + base[bucket + 1 :], int(bucket))
                previous, _ = following.get(key, (0.0, survival))
                following[key] = (previous + branch, survival)
        level = following
    return k_law, reach


def depth_length_law(rule, belief: dict, laws: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`length_law` when the bucket law depends on the position: ``laws[d]`` (``probability`` and
    ``acceptance`` per bucket, :func:`~experiments.apriori.calibrate.depth_buckets`) is the law of position
    ``d + 1``, while the rule decides on ``belief`` (the pooled buckets the executor's :class:`BucketStopRule`
    holds: ``acceptance``, ``confidence``, ``probability``). States are whole bucket paths (their survival is
    no longer fixed by the bucket counts): at most ``B ** horizon``.
    """
    import theory

    horizon = len(laws)
    accept = np.asarray(belief["acceptance"], dtype=np.float64)
    confidence = np.asarray(belief["confidence"], dtype=np.float64)
    mean = float(np.dot(belief["probability"], accept))
    k_law, reach = np.zeros(horizon + 1), np.zeros(horizon)
    level = {(): (1.0, 1.0, 1.0)}  # bucket path -> (mass, the rule's belief that all are accepted, survival)
    for drafted in range(horizon + 1):
        following = {}
        for path, (mass, believed, survival) in level.items():
            last = path[-1] if path else None
            state = theory.DraftState(
                drafted,
                believed,
                None if last is None else float(accept[last]),
                None if last is None else float(confidence[last]),
                None,
                mean if drafted < horizon else None,
            )
            if drafted == horizon or not rule.should_continue(state, None):
                k_law[drafted] += mass
                continue
            law = laws[drafted]
            for bucket, weight in enumerate(law["probability"]):
                if weight <= 0:
                    continue
                alive = survival * law["acceptance"][bucket]
                reach[drafted] += mass * weight * alive
                following[(*path, bucket)] = (mass * weight, believed * accept[bucket], alive)
        level = following
    return k_law, reach


class BucketStopRule:
    """A :class:`~executor.decoders.ChainDecoder` stop rule that runs a theory length rule on the bucketed
    draft confidence, so that the executor does exactly what :func:`theory.evaluate_rule` models.

    The decoder asks before each position with that position's draft logits; the theory rule decides after
    each drafted token. So at call ``d >= 1`` the token drafted at position ``d`` (from the previous call's
    logits) enters the state, and the rule's stop ends the chain there: the call's draft pass is spent, which
    :func:`predict` charges.
    """

    def __init__(self, rule: str, threshold: float, buckets: dict, horizon: int) -> None:
        self.rule = _theory_rule(rule, threshold, horizon)
        self.edges = np.asarray(buckets["edges"])
        self.acceptance = np.asarray(buckets["acceptance"])
        self.confidence = np.asarray(buckets["confidence"])
        self.mean = float(np.dot(buckets["probability"], buckets["acceptance"]))
        self.horizon = horizon
        self.prob, self.pending = 1.0, 0

    def __call__(self, depth: int, draft_logits) -> bool:
        import theory

        confidence = float(draft_logits.float().softmax(-1).max())
        last = None
        if depth == 0:
            self.prob = 1.0
        else:
            last = self.pending
            self.prob *= float(self.acceptance[last])
        state = theory.DraftState(
            depth,
            self.prob,
            None if last is None else float(self.acceptance[last]),
            None if last is None else float(self.confidence[last]),
            None,
            self.mean if depth < self.horizon else None,
        )
        self.pending = int(np.searchsorted(self.edges, confidence, side="right"))
        return not self.rule.should_continue(state, None)


def _finish(config: DecoderConfig, cal: Calibration, tau: float, reach, passes_time: float, detail=None):
    """The :class:`Prediction` with the configuration's measured per-step overhead charged on top of its target
    and draft passes (and plain decoding's own overhead on the baseline); ``detail`` keeps the speedup without
    the overheads (the model before they were measured)."""
    t1 = cal.latency.target_time[1]
    overhead = float(cal.overhead.get(config.label, 0.0))
    baseline = t1 + float(cal.overhead.get("ar", 0.0))
    step = passes_time + overhead
    detail = {**(detail or {}), "overhead": overhead, "speedup_passes_only": tau * t1 / passes_time}
    return Prediction(float(tau), [float(a) for a in reach], step, tau * baseline / step, detail)


def _tree_prediction(config, tree, matrix: np.ndarray, cal: Calibration, passes: int) -> Prediction:
    import theory

    distribution = theory.tree_token_distribution(tree, matrix)
    reach = [float(distribution[k:].sum()) for k in range(1, distribution.size)]
    tau = theory.tree_expected_tokens(tree, matrix)
    step = cal.latency.t(tree.size) + cal.latency.drafting(passes)
    return _finish(config, cal, tau, reach, step, {"size": tree.size})


def decoder_depth(config: DecoderConfig) -> int:
    """Deepest draft position of ``config`` (0 for plain decoding; a dynamic tree's level limit)."""
    if config.kind == "ar":
        return 0
    if config.kind == "multidraft":
        return 1
    if config.kind == "tree":
        import theory

        return theory.Tree(list(config.parents)).depth
    return config.gamma


def _with_shallow_roots(cal: Calibration) -> Calibration:
    """``cal`` with its root statistics replaced by those of the one-draft chains (``cal.shallow``)."""
    shallow = cal.shallow
    return replace(
        cal,
        positional=[shallow["positional"], *cal.positional[1:]],
        rank_matrix=[shallow["rank_matrix"], *cal.rank_matrix[1:]],
        multidraft={**cal.multidraft, **shallow["multidraft"]},
        bound={**cal.bound, **shallow["bound"]},
    )


def predict(config: DecoderConfig, cal: Calibration, *, rule_buckets: dict | None = None) -> Prediction:
    """The theory's :class:`Prediction` for ``config`` from the calibration alone (see the module docstring).

    A configuration that drafts one level only (:func:`decoder_depth` 1) is predicted from the root profile of
    one-draft calibration chains when the calibration has one (``cal.shallow``).

    ``rule_buckets`` are the buckets a stop rule decides on (default ``cal.buckets``; a bootstrap resample of
    the calibration passes the point calibration's, which the executor runs).
    """
    import theory

    if cal.shallow and decoder_depth(config) == 1:
        cal = _with_shallow_roots(cal)
    lat = cal.latency
    t1 = lat.target_time[1]
    if config.kind == "ar":
        return _finish(config, cal, 1.0, [], t1)
    if config.kind == "chain":
        alphas = np.asarray(cal.positional[: config.gamma])
        tau = theory.expected_tokens(alphas, config.gamma)
        step = lat.t(config.gamma + 1) + lat.drafting(config.gamma)
        return _finish(config, cal, tau, np.cumprod(alphas), step)
    if config.kind == "multidraft":
        alpha = cal.multidraft[f"{config.verifier}-n{config.n}"]
        step = lat.t(config.n + 1) + lat.drafting(1)
        bound = cal.bound[f"{config.verifier}-n{config.n}"]
        return _finish(config, cal, 1.0 + alpha, [alpha], step, {"optimal_acceptance": bound})
    matrix = _matrix(cal)
    if config.kind == "tree":
        tree = theory.Tree(list(config.parents))
        return _tree_prediction(config, tree, matrix, cal, tree.depth)
    if config.kind == "dynamic":
        tree, passes = level_tree(matrix, config.budget, config.gamma, config.n)
        return _tree_prediction(config, tree, matrix, cal, passes)
    if config.kind == "stop":
        model = bucket_model(cal, config.gamma)
        rule = _theory_rule(config.rule, config.threshold, config.gamma)
        pooled = theory.evaluate_rule(rule, model, theory.LengthCosts(lat.draft_time, t1)).tokens_per_step
        if cal.depth_buckets:
            laws = cal.depth_buckets[: config.gamma]
            k_law, reach = depth_length_law(rule, rule_buckets or cal.buckets, laws)
        else:
            k_law, reach = length_law(rule, model)
        sizes = np.arange(k_law.size)
        passes = sizes + (sizes < config.gamma)
        step = float(sum(w * (lat.t(k + 1) + lat.drafting(int(passes[k]))) for k, w in enumerate(k_law)))
        tau = 1.0 + float(reach.sum())
        drafted = float(np.dot(sizes, k_law))
        return _finish(config, cal, tau, reach, step, {"drafted": drafted, "pooled_tau": pooled})
    raise ValueError(f"config.kind: unknown decoder kind {config.kind!r}")


def _sequoia_tree(matrix: np.ndarray, size: int, depth: int, width: int):
    import theory

    return theory.optimal_tree(matrix, size, max_depth=depth, max_width=width).tree


def plan_configurations(
    cal: Calibration,
    *,
    multidraft: tuple[tuple[str, int], ...],
    fixed_gamma: int = 4,
    budgets: tuple[int, ...] = (),
    max_budget: int = 16,
    tree_verifier: str = "rrs_wor",
) -> tuple[list[DecoderConfig], dict]:
    """The decoder configurations of one temperature, chosen from the calibration, and the planner's curve.

    Returns the configurations (plain decoding first) and ``{"planner_curve": {size: speedup}, ...}`` with
    the planner's best predicted speedup at each tree size and the choices it made.
    """
    import theory

    depth = cal.depth
    width = tree_width(cal.temperature)
    matrix = _matrix(cal)
    c = cal.cost_ratio
    # The draft passes as the predictions charge them (the calibration chains' own, else the profile's).
    passes = cal.latency.pass_times or cal.latency.draft_time
    table = {n: cal.latency.t(n) for n in range(1, max(max_budget, depth + 1) + 1)}  # interpolated between
    # gamma*: the best chain (a tree of width 1) for the measured t(n) and draft passes; Leviathan's gamma*
    # (one cost ratio c, t(n) flat) is kept in the planning record for comparison.
    chain = theory.plan_tree(
        np.asarray(cal.positional)[:, None], table, passes, max_budget=depth + 1, max_depth=depth, max_width=1
    )
    gamma_star = chain.tree.depth
    leviathan = theory.optimal_draft_length(np.asarray(cal.positional), c, max_gamma=depth)
    configs = [DecoderConfig("ar", "ar")]
    note = f"plan_tree's best chain: γ* = {gamma_star} for the measured t(n) and draft passes" + (
        "; run at γ = 1" if gamma_star == 0 else ""
    )
    configs.append(DecoderConfig("chain-opt", "chain", gamma=max(gamma_star, 1), note=note))
    configs.append(DecoderConfig(f"chain-g{min(fixed_gamma, depth)}", "chain", gamma=min(fixed_gamma, depth)))
    for name, n in multidraft:
        configs.append(DecoderConfig(f"{name}-n{n}", "multidraft", verifier=name, n=n))

    plan = theory.plan_tree(matrix, table, passes, max_budget=max_budget, max_depth=depth, max_width=width)
    drafting = [a for a in plan.alternatives if a.depth >= 1]
    chosen = plan if plan.depth >= 1 else drafting[0]
    plan_tree = plan.tree if plan.depth >= 1 else _sequoia_tree(matrix, chosen.size, chosen.depth, width)
    configs.append(
        DecoderConfig(
            "tree-plan",
            "tree",
            verifier=tree_verifier,
            parents=tuple(int(v) for v in plan_tree.parents),
            note=f"plan_tree: size {plan_tree.size}, depth {plan_tree.depth}"
            + ("" if plan.depth >= 1 else " (the planner prefers no drafting; best drafting tree run)"),
        )
    )
    configs.append(
        DecoderConfig(
            "tree-dyspec",
            "dynamic",
            verifier=tree_verifier,
            n=width,
            gamma=max(plan_tree.depth, 1),
            budget=plan_tree.size,
            note=f"budget {plan_tree.size}, depth {plan_tree.depth}, branching {width}",
        )
    )
    curve: dict[int, float] = {}
    for a in drafting:
        curve[a.size] = max(curve.get(a.size, 0.0), a.speedup)
    for budget in budgets:
        best = next((a for a in drafting if a.size == budget), None)
        if best is None or budget == plan_tree.size:
            continue
        tree = _sequoia_tree(matrix, budget, best.depth, width)
        configs.append(
            DecoderConfig(
                f"tree-b{budget}", "tree", verifier=tree_verifier, parents=tuple(int(v) for v in tree.parents)
            )
        )
    thresholds = stop_rules(cal, depth)
    for rule in ("specdecpp", "kangaroo"):
        configs.append(
            DecoderConfig(
                f"stop-{rule}",
                "stop",
                gamma=depth,
                rule=rule,
                threshold=thresholds[rule],
                note=f"threshold {thresholds[rule]:.3f} from optimal_length_policy",
            )
        )
    planning = {
        "gamma_star": gamma_star,
        "gamma_star_leviathan": leviathan,
        "cost_ratio": c,
        "planner_curve": {str(n): s for n, s in sorted(curve.items())},
        "plan": {"size": plan.size, "depth": plan.depth, "speedup": plan.speedup},
        "thresholds": thresholds,
    }
    return configs, planning
