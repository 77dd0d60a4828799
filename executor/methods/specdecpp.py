"""SpecDec++: adaptive candidate length (Huang, Guo & Wang, arXiv 2405.19715).

After drafting candidate ``k``, stop and verify when the predicted probability that some candidate is
rejected, :math:`1 - \\prod_{i \\le k} \\hat P_i`, exceeds ``h``; bounds ``K_min <= K <= K_max``.

:math:`\\hat P_i` is the paper's trained acceptance-prediction head (:class:`AcceptanceHead`) on the drafter's
hidden state behind candidate ``i`` (a drafter that exposes ``draft_feature(node)``: the feature heads). It is
trained by weighted soft binary cross-entropy on labels :math:`\\min(1, p(Y_i) / q(Y_i))` with rejections
weighted ``w = 6`` (the paper's setting), on chains drafted from standard-library prompts, never on the
evaluation prompts (:func:`cached_acceptance_head`; cached, about a minute). A drafter without features (the
early exit) uses a calibration of the draft's top-1 confidence instead (``head="confidence"``).

``h`` comes from the theory for the measured costs: the head's scores on calibration prompts, bucketed with
the acceptance each bucket realised, form a :class:`theory.ConfidenceBuckets` model; the draft/verify time
ratio is measured on the same runs; :func:`theory.optimal_length_policy` (the SpecDec++ MDP solved exactly)
gives the optimal threshold, whose ``rejection_threshold`` is the ``h`` of :func:`theory.specdecpp_threshold`,
which predicts the tokens per step. The decoder multiplies the *calibrated* score of each candidate (its
bucket's realised acceptance), which is the :math:`\\hat P` the theory's rule reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from executor.methods._common import MethodDrafter, check_exit_layer, checkpoint_cards, default_exit_layer
from executor.methods.adaptive_chain import AdaptiveChainDecoder, DraftPolicy
from executor.methods.base import Method, Prediction
from executor.methods.confidence import ConfidenceCalibration
from theory.checks import as_count, as_nonnegative, as_probabilities

__all__ = [
    "AcceptanceExamples",
    "AcceptanceHead",
    "HeuristicSchedule",
    "SpecDecFixed",
    "SpecDecHeuristic",
    "SpecDecPP",
    "SpecDecPPStop",
    "acceptance_examples",
    "cached_acceptance_head",
    "head_input",
    "rank_auc",
    "train_acceptance_head",
    "weighted_soft_bce",
]

KIND = "specdecpp-head"
HEADS = ("trained", "confidence")


class SpecDecPPStop(DraftPolicy):
    """Stop after candidate ``k`` when ``1 - prod P_hat > h`` (never before ``min_length``);
    ``predictor(logits, feature) -> P_hat``."""

    def __init__(self, predictor, threshold: float, max_length: int, min_length: int = 1) -> None:
        self.predictor = predictor
        self.threshold = float(as_probabilities(threshold, "threshold"))
        self.max_length = as_count(max_length, "max_length")
        self.min_length = as_count(min_length, "min_length", minimum=0)
        self._product = 1.0

    def start_round(self, state) -> None:
        self._product = 1.0

    def continue_after(self, drafted, logits, feature=None) -> bool:
        self._product *= float(self.predictor(logits, feature))
        return drafted < self.min_length or 1.0 - self._product <= self.threshold


#: Statistics of the draft distribution (temperature 1) appended to the feature: top-1 probability, entropy.
STATISTICS = 2


def head_input(feature: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """What :class:`AcceptanceHead` reads for one candidate: the drafter's feature behind it, then the draft
    distribution's top-1 probability and entropy (nats) at temperature 1."""
    q = logits.float().softmax(-1)
    entropy = torch.special.entr(q).sum(-1, keepdim=True)  # 0 log 0 = 0 where q underflows
    return torch.cat([feature.detach().float().cpu(), q.max(-1, keepdim=True).values.cpu(), entropy.cpu()])


class AcceptanceHead(torch.nn.Module):
    """SpecDec++'s acceptance-prediction head: :math:`\\hat P = \\sigma(w^\\top f(x) + b)`, where ``f`` applies
    the residual block :math:`x \\mapsto x + \\mathrm{SiLU}(W x + c)` ``depth`` times (one block repeated, as
    in the paper's ``AcceptancePredictionHead``; depth 3 is its setting) to the draft feature ``x``. The
    paper's two-class softmax is the same family as this one logit.

    Two departures, both measured (docs/methods.md): the feature is RMS-normalised (the block's scale then
    does not depend on the drafter's feature norm), and the draft distribution's top-1 probability and entropy
    are appended to it (:func:`head_input`): on a few thousand training candidates the feature alone ranked
    acceptance worse than the top-1 probability alone.
    """

    def __init__(self, dim: int, depth: int = 3) -> None:
        super().__init__()
        self.depth = as_count(depth, "depth")
        self.dim = dim
        width = dim + STATISTICS
        self.block = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, 1)
        torch.nn.init.zeros_(self.block.weight)  # starts as the identity map, as a residual stack should
        torch.nn.init.zeros_(self.block.bias)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Logits of acceptance for :func:`head_input` rows, shape ``inputs.shape[:-1]``."""
        x = inputs.float()
        feature = x[..., : self.dim]
        feature = feature * torch.rsqrt(feature.pow(2).mean(-1, keepdim=True) + 1e-6)
        x = torch.cat([feature, x[..., self.dim :]], -1)
        for _ in range(self.depth):
            x = x + torch.nn.functional.silu(self.block(x))
        return self.out(x).squeeze(-1)

    @torch.no_grad()
    def probability(self, inputs: torch.Tensor) -> np.ndarray:
        return torch.sigmoid(self(inputs.to(self.out.weight.device))).cpu().double().numpy()


def weighted_soft_bce(logits: torch.Tensor, labels: torch.Tensor, reject_weight: float) -> torch.Tensor:
    """The paper's loss: :math:`-\\sum [w (1 - y) \\log(1 - \\hat P) + y \\log \\hat P] / \\sum [w (1 - y) + y]`
    with soft labels ``y`` in [0, 1] and rejections weighted ``w``."""
    log_accept = torch.nn.functional.logsigmoid(logits)
    log_reject = torch.nn.functional.logsigmoid(-logits)
    weights = reject_weight * (1 - labels)
    return -(weights * log_reject + labels * log_accept).sum() / (weights + labels).sum().clamp_min(1e-12)


@dataclass
class AcceptanceExamples:
    """Drafted candidates of fixed-length chains, one row each.

    ``features`` ``(N, dim + 2)``: :func:`head_input`, the drafter's hidden state behind the candidate and two
    statistics of its draft distribution (``None`` for a drafter without ``draft_feature``); ``labels``: the soft label
    :math:`\\min(1, p(y) / q(y))` (the probability that speculative sampling accepts the drafted ``y`` given
    the candidates before it); ``accepted``: whether it was accepted; ``reached``: whether every earlier
    candidate of its round was accepted (the condition under which :math:`\\hat P` predicts); ``depth``
    (1-based); ``confidence``: the draft's top-1 probability at temperature 1. ``draft_seconds`` /
    ``verify_seconds``: per drafted token and per verification step, measured on the same runs.
    """

    features: torch.Tensor | None
    labels: np.ndarray
    accepted: np.ndarray
    reached: np.ndarray
    depth: np.ndarray
    confidence: np.ndarray
    draft_seconds: float
    verify_seconds: float

    def __len__(self) -> int:
        return len(self.labels)


class _Recorder(DraftPolicy):
    """Draft ``max_length`` tokens every round and keep what :class:`AcceptanceExamples` holds."""

    def __init__(self, max_length: int) -> None:
        self.max_length = max_length
        self.rows: list[tuple] = []
        self._round: list[tuple] = []

    def start_round(self, state) -> None:
        self._round = []

    def continue_after(self, drafted, logits, feature=None) -> bool:
        if feature is None:
            self._round.append((None, float(logits.float().softmax(-1).max())))
        else:  # head_input already holds the top-1 probability: one softmax over the vocabulary, not two
            row = head_input(feature, logits)
            self._round.append((row, float(row[-STATISTICS])))
        return True

    def after_step(self, log) -> None:
        distributions = log.distributions
        for row, node in enumerate(log.expanded):
            child = log.parents.index(node)
            token = log.tokens[child]
            p = float(distributions.p[row, token])
            q = float(distributions.q[row, token])
            feature, confidence = self._round[row]
            depth = row + 1
            reached = depth == 1 or log.accepted[depth - 2]
            self.rows.append((feature, min(1.0, p / q), log.accepted[row], reached, depth, confidence))


class _TimedChain(AdaptiveChainDecoder):
    """Adds up the seconds spent drafting and in whole steps (verification = step - draft)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.draft_seconds = 0.0
        self.step_seconds = 0.0

    def draft(self, state, generator):
        start = time.perf_counter()
        tree = super().draft(state, generator)
        self.draft_seconds += time.perf_counter() - start
        return tree

    def step(self, state, generator):
        start = time.perf_counter()
        log = super().step(state, generator)
        self.step_seconds += time.perf_counter() - start
        return log


def acceptance_examples(
    target, make_drafter, prompts, *, max_length: int, temperature: float, max_new_tokens: int, seed: int = 0
) -> AcceptanceExamples:
    """Decode ``prompts`` with chains of ``max_length`` drafts at ``temperature`` and record every candidate
    (:class:`AcceptanceExamples`); the labels read the target's and the draft's distributions at the drafted
    token, so they hold for candidates after a rejection too (the target scores the whole chain)."""
    from executor.decoders import Sampling

    recorder = _Recorder(as_count(max_length, "max_length"))
    decoder = _TimedChain(
        target,
        make_drafter(),
        policy=recorder,
        sampling=Sampling(temperature=temperature),
        log_distributions="full",
    )
    steps = 0
    for index, prompt in enumerate(prompts):
        result = decoder.generate(
            prompt, max_new_tokens, generator=torch.Generator().manual_seed(seed + index)
        )
        steps += len(result.steps)
    if not recorder.rows:
        raise ValueError(
            "prompts: no candidate was drafted (prompts of one token, or max_new_tokens too small)"
        )
    features, labels, accepted, reached, depth, confidence = zip(*recorder.rows, strict=True)
    drafted = len(labels)
    return AcceptanceExamples(
        features=None if features[0] is None else torch.stack(features),
        labels=np.array(labels),
        accepted=np.array(accepted, dtype=bool),
        reached=np.array(reached, dtype=bool),
        depth=np.array(depth),
        confidence=np.array(confidence),
        draft_seconds=decoder.draft_seconds / drafted,
        verify_seconds=(decoder.step_seconds - decoder.draft_seconds) / max(steps, 1),
    )


def train_acceptance_head(
    examples: AcceptanceExamples,
    *,
    depth: int = 3,
    reject_weight: float = 6.0,
    steps: int = 300,
    lr: float = 3e-3,
    held_out: float = 0.2,
    seed: int = 0,
) -> tuple[AcceptanceHead, dict]:
    """Fit an :class:`AcceptanceHead` to ``examples`` by full-batch AdamW on :func:`weighted_soft_bce`; a
    random ``held_out`` fraction is kept out and its loss reported before and after (the card)."""
    reject_weight = as_nonnegative(reject_weight, "reject_weight")
    steps = as_count(steps, "steps")
    if examples.features is None:
        raise ValueError("examples: the drafter exposes no features (draft_feature); use head='confidence'")
    if len(examples) < 2:
        raise ValueError(f"examples: need at least 2 candidates to train on, got {len(examples)}")
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(examples), generator=generator)
    cut = max(1, int(round(len(examples) * (1 - held_out))))
    train, test = order[:cut], order[cut:]
    features = examples.features.float()
    labels = torch.as_tensor(examples.labels, dtype=torch.float32)
    torch.manual_seed(seed)
    head = AcceptanceHead(features.shape[-1] - STATISTICS, depth)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)

    def loss_on(rows) -> float:
        with torch.no_grad():
            return float(weighted_soft_bce(head(features[rows]), labels[rows], reject_weight))

    before = loss_on(test) if len(test) else None
    start = time.perf_counter()
    best, best_step, best_state = float("inf"), 0, None
    with torch.enable_grad():
        for step in range(1, steps + 1):
            optimizer.zero_grad()
            loss = weighted_soft_bce(head(features[train]), labels[train], reject_weight)
            loss.backward()
            optimizer.step()
            # Early stopping on the held-out loss: a few thousand candidates overfit a dim x dim block.
            if len(test) and (step % 10 == 0 or step == steps):
                current = loss_on(test)
                if current < best:
                    best, best_step = current, step
                    best_state = {k: v.detach().clone() for k, v in head.state_dict().items()}
    if best_state is not None:
        head.load_state_dict(best_state)
    head.eval().requires_grad_(False)
    test_reached = test[torch.as_tensor(examples.reached)[test]].numpy()
    card = {
        "examples": len(examples),
        "held_out_auc": rank_auc(head.probability(features[test_reached]), examples.accepted[test_reached]),
        "held_out_auc_confidence": rank_auc(
            examples.confidence[test_reached], examples.accepted[test_reached]
        ),
        "held_out_examples": len(test),
        "held_out_loss_before": before,
        "held_out_loss_after": loss_on(test) if len(test) else None,
        "train_loss": loss.item(),
        "best_step": best_step if best_state is not None else steps,
        "mean_label": float(labels.mean()),
        "fit_seconds": time.perf_counter() - start,
        "recipe": {"depth": depth, "reject_weight": reject_weight, "steps": steps, "lr": lr, "seed": seed},
    }
    return head, card


def rank_auc(scores: np.ndarray, accepted: np.ndarray) -> float | None:
    """The probability that an accepted candidate scores above a rejected one (ties count half): the
    Mann-Whitney statistic; ``None`` when either class is empty."""
    from scipy.stats import rankdata

    accepted = np.asarray(accepted, dtype=bool)
    positives, negatives = int(accepted.sum()), int((~accepted).sum())
    if not positives or not negatives:
        return None
    ranks = rankdata(scores)
    return float((ranks[accepted].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def _training_prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    """``count`` prompts of ``length`` tokens spread over the standard library's training files (never the
    held-out files, never HumanEval)."""
    from executor.training.corpus import load_corpus, tokenize_chunks

    corpus = load_corpus()
    windows = tokenize_chunks(corpus.train, tokenizer.encode, None, length, 40 * count * length)
    if len(windows) < count:
        raise ValueError(f"the training corpus gave {len(windows)} prompts of {length} tokens, need {count}")
    stride = len(windows) // count
    return [windows[i * stride] for i in range(count)]


def cached_acceptance_head(
    target,
    tokenizer,
    make_drafter,
    drafter_key: str,
    *,
    temperature: float,
    max_length: int = 8,
    prompts: int = 24,
    prompt_length: int = 96,
    max_new_tokens: int = 48,
    depth: int = 3,
    reject_weight: float = 6.0,
    steps: int = 300,
    seed: int = 0,
) -> tuple[AcceptanceHead, dict]:
    """Train (once per target, drafter, temperature and recipe; cached under
    ``$XDG_CACHE_HOME/specbound/drafters/specdecpp-head-*``) an acceptance head on chains drafted from
    standard-library prompts; returns the head and its card (``seconds``: data and training)."""
    from executor.training.checkpoint import (
        CARD_NAME,
        default_checkpoint_dir,
        load_checkpoint,
        model_fingerprint,
        save_checkpoint,
    )

    recipe = {
        "drafter": drafter_key,
        "temperature": float(temperature),
        "max_length": max_length,
        "prompts": prompts,
        "prompt_length": prompt_length,
        "max_new_tokens": max_new_tokens,
        "depth": depth,
        "reject_weight": reject_weight,
        "steps": steps,
        "seed": seed,
        "corpus": "stdlib",
    }
    fingerprint = model_fingerprint(target)  # hashes sampled weights: once per call
    directory = default_checkpoint_dir(KIND, fingerprint, recipe)
    if (directory / CARD_NAME).is_file():
        tensors, card = load_checkpoint(directory, target=target, kind=KIND)
        head = AcceptanceHead(tensors["block.weight"].shape[0] - STATISTICS, depth)
        head.load_state_dict(tensors)
        return head.eval().requires_grad_(False), {**card, "cached": True}
    start = time.perf_counter()
    examples = acceptance_examples(
        target,
        make_drafter,
        _training_prompts(tokenizer, prompts, prompt_length),
        max_length=max_length,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        seed=seed,
    )
    head, card = train_acceptance_head(
        examples, depth=depth, reject_weight=reject_weight, steps=steps, seed=seed
    )
    card = {
        **card,
        "kind": KIND,
        "recipe": recipe,
        "seconds": time.perf_counter() - start,
        "target": fingerprint,
    }
    save_checkpoint(directory, head.state_dict(), card)
    return head, {**card, "cached": False}


class SpecDecPP(Method):
    """SpecDec++ on ``drafter`` (default: the trained feature head when cached, else the early exit at
    ``exit_layer``) with ``head="trained"`` (the paper's acceptance head; the default where the drafter has
    features) or ``"confidence"``; ``acceptance_head=`` (``head(logits, feature) -> probability``) takes
    any predictor, ``threshold=`` fixes ``h`` instead of the theory's."""

    name = "specdecpp"
    paper = "SpecDec++, Huang, Guo & Wang, arXiv 2405.19715"

    def __init__(
        self,
        target,
        tokenizer=None,
        *,
        exit_layer=None,
        max_length: int = 8,
        threshold=None,
        head=None,
        acceptance_head=None,
        drafter=None,
    ):
        super().__init__(target, tokenizer)
        self.exit_layer = check_exit_layer(
            target, default_exit_layer(target) if exit_layer is None else exit_layer
        )
        self.max_length = as_count(max_length, "max_length")
        self.threshold = None if threshold is None else float(as_probabilities(threshold, "threshold"))
        if head is not None and head not in HEADS:
            raise ValueError(f"head must be one of {', '.join(HEADS)}, got {head!r}")
        self.make_drafter = MethodDrafter(target, drafter, self.exit_layer)
        has_features = hasattr(self.make_drafter(), "draft_feature")
        if head is None:
            head = "trained" if has_features else "confidence"
        elif head == "trained" and not has_features:
            raise ValueError(
                "head='trained' reads the drafter's features, and this drafter exposes none (draft_feature); "
                "use a feature drafter or head='confidence'"
            )
        self.head = head
        self.predictor = acceptance_head
        self.card: dict = {}

    def drafter_cards(self) -> list[dict]:
        return checkpoint_cards(self.make_drafter())

    def options(self) -> dict:
        return {
            "drafter": self.make_drafter.name or "custom",
            "head": self.head,
            "exit_layer": self.exit_layer,
            "max_length": self.max_length,
            "threshold": self.threshold,
        }

    def policy(self) -> DraftPolicy:
        """The draft-length policy of one decoder (a fresh one per decoder: policies keep round state)."""
        predictor = self.predictor
        if predictor is None:  # before predict(): the raw top-1 confidence
            predictor = lambda logits, feature: float(logits.float().softmax(-1).max())  # noqa: E731
        threshold = 0.7 if self.threshold is None else self.threshold  # the paper's single setting
        return SpecDecPPStop(predictor, threshold, self.max_length)

    def rule(self, fixed_speedups: dict):
        """This method's rule in :mod:`theory` (after :meth:`predict` has set ``threshold``)."""
        import theory

        return theory.specdecpp_threshold(self.threshold, min_length=1, max_length=self.max_length)

    def build(self, temperature: float = 0.0):
        return AdaptiveChainDecoder(
            self.target, self.make_drafter(), policy=self.policy(), sampling=self.sampling(temperature)
        )

    def _trained_head(self, temperature: float) -> AcceptanceHead:
        """Train (or load from the cache) the acceptance head for this drafter and temperature."""
        if self.tokenizer is None:
            raise ValueError("specdecpp with head='trained' needs a tokenizer (its training prompts)")
        card = getattr(self.make_drafter(), "card", None) or {}
        key = f"{self.make_drafter.name or 'custom'}:{card.get('weights_sha256', '')[:16]}"
        head, self.card = cached_acceptance_head(
            self.target,
            self.tokenizer,
            self.make_drafter,
            key,
            temperature=temperature,
            max_length=self.max_length,
        )
        return head

    def predict(self, calibration_prompts, temperature, max_new_tokens):
        import theory

        head = self._trained_head(temperature) if self.head == "trained" else None
        examples = acceptance_examples(
            self.target,
            self.make_drafter,
            calibration_prompts,
            max_length=self.max_length,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            seed=1000,
        )
        reached = examples.reached
        scores = examples.confidence if head is None else head.probability(examples.features)
        # The verified candidates (every earlier one accepted) are the positions the decoder meets; their soft
        # labels min(1, p/q) are their acceptance probabilities, less noisy than the accept flags. Candidates
        # after a rejection sit in contexts the decoder never reaches, and accept less (measured at T = 1:
        # pooled, tau 1.27 predicted against 1.43; verified only, 1.45 against 1.51). About 20 candidates a
        # bucket: a bucket's acceptance then has a standard error of at most 0.11.
        calibration = ConfidenceCalibration(buckets=int(np.clip(reached.sum() // 20, 1, 6)))
        calibration.fit(scores[reached], examples.labels[reached])
        if self.predictor is None:
            if head is None:
                self.predictor = lambda logits, feature: calibration(logits)
            else:
                self.predictor = lambda logits, feature: calibration.predict_confidence(
                    float(head.probability(head_input(feature, logits)[None])[0])
                )
        cost = examples.draft_seconds / examples.verify_seconds
        model = calibration.model(self.max_length)
        costs = theory.LengthCosts(draft_time=cost, target_time=1.0)
        policy = theory.optimal_length_policy(model, costs)
        h = policy.rejection_threshold if policy.rejection_threshold is not None else 0.7
        h = float(np.clip(h, 0.0, 1.0))
        if self.threshold is None:
            self.threshold = h
        fixed = {
            k: theory.evaluate_rule(theory.fixed_length_rule(k), model, costs).speedup
            for k in range(0, self.max_length + 1)
        }
        rule = self.rule(fixed)
        evaluation = theory.evaluate_rule(rule, model, costs)
        heuristic = theory.evaluate_rule(theory.heuristic_schedule(maximum=self.max_length), model, costs)
        return Prediction(
            evaluation.tokens_per_step,
            {
                "rule": rule.name,
                "head": self.head,
                "threshold": self.threshold,
                "optimal_policy_speedup": policy.speedup,
                "predicted_speedup": evaluation.speedup,
                "fixed_k_speedup": fixed,
                "heuristic_speedup": heuristic.speedup,
                "draft_cost_ratio": cost,
                "buckets": {
                    "score": calibration.confidence.tolist(),
                    "acceptance": calibration.acceptance.tolist(),
                    "probability": calibration.probability.tolist(),
                },
                "calibration_candidates": len(examples),
                "calibration_candidates_verified": int(reached.sum()),
                # How well each score ranks accepted above rejected candidates (0.5: no better than chance).
                "auc_head": None if head is None else rank_auc(scores[reached], examples.accepted[reached]),
                "auc_confidence": rank_auc(examples.confidence[reached], examples.accepted[reached]),
                "draft_seconds": examples.draft_seconds,
                "verify_seconds": examples.verify_seconds,
                "head_card": {k: v for k, v in self.card.items() if k not in ("target", "weights_sha256")},
            },
            train_seconds=float(self.card.get("seconds", 0.0))
            if head is not None
            else calibration.fit_seconds,
        )

    def extra(self, decoder) -> dict:
        lengths = decoder.drafted_lengths
        return {"mean_drafted": float(np.mean(lengths)) if lengths else 0.0}


class HeuristicSchedule(DraftPolicy):
    """transformers' "heuristic" schedule (assisted generation): draft ``K`` tokens, then ``K + 2`` if all were
    accepted, else ``max(1, K - 1)``; ``K`` starts at 5 and is capped at ``max_length``
    (:func:`theory.heuristic_schedule`)."""

    def __init__(self, max_length: int, start: int = 5) -> None:
        self.max_length = as_count(max_length, "max_length")
        self.length = min(as_count(start, "start"), self.max_length)

    def round_length(self) -> int:
        return self.length

    def after_step(self, log) -> None:
        if not log.accepted:
            return  # nothing was drafted (a one-token prompt's first step)
        grown = self.length + 2 if all(log.accepted) else self.length - 1
        self.length = int(np.clip(grown, 1, self.max_length))


class SpecDecFixed(SpecDecPP):
    """SpecDec++'s baseline, speculative decoding with a fixed ``K`` (``length``; default: the ``K`` in
    ``1..max_length`` with the theory's best speedup for the measured acceptance and costs), on the same
    drafter, prompts and calibration as ``specdecpp``. ``head`` defaults to ``"confidence"``: a fixed rule
    reads no acceptance prediction, and the theory's forecast only needs the acceptance mixture."""

    name = "specdecpp-fixed"

    def __init__(self, target, tokenizer=None, *, length=None, head="confidence", **options) -> None:
        super().__init__(target, tokenizer, head=head, **options)
        self.length = None if length is None else as_count(length, "length")
        if self.length is not None and self.length > self.max_length:
            raise ValueError(f"length must be at most max_length ({self.max_length}), got {self.length}")

    def options(self) -> dict:
        return {**super().options(), "length": self.length}

    def policy(self) -> DraftPolicy:
        policy = DraftPolicy()
        policy.max_length = self.max_length if self.length is None else self.length
        return policy

    def rule(self, fixed_speedups: dict):
        import theory

        if self.length is None:
            self.length = max(range(1, self.max_length + 1), key=lambda k: (fixed_speedups[k], -k))
        return theory.fixed_length_rule(self.length)


class SpecDecHeuristic(SpecDecPP):
    """SpecDec++'s other baseline: transformers' heuristic schedule (:class:`HeuristicSchedule`) on the same
    drafter, prompts and calibration as ``specdecpp``."""

    name = "specdecpp-heuristic"

    def __init__(self, target, tokenizer=None, *, head="confidence", **options) -> None:
        super().__init__(target, tokenizer, head=head, **options)

    def policy(self) -> DraftPolicy:
        return HeuristicSchedule(self.max_length)

    def rule(self, fixed_speedups: dict):
        import theory

        return theory.heuristic_schedule(maximum=self.max_length)
