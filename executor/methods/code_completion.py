"""Dynamic inference for code completion (Sun et al., "When Neural Code Completion Models Size up the
Situation: Attaining Cheaper and Faster Completion through Dynamic Model Inference", ICSE 2024).

**Study.** For each layer ``l``, the fraction of code tokens whose early-exit prediction (final norm and LM
head on layer ``l``'s hidden state) already equals the full model's (the paper: 54.4% at GPT-2's first layer),
on greedy continuations of HumanEval prompts; and, teacher-forced on HumanEval's canonical solutions, how
often the full model's next-token prediction is wrong (the paper: 14.5%) and how accurate each exit is.

**Method.** Per token, the layers run in order; at each candidate exit layer (its exit head: the cached trained
``exit:K`` head where there is one, as the paper trains its exits, else the model's own norm and LM head) a
*learned decision* (a
logistic rule on the exit's top-1 probability, fit in milliseconds on calibration prompts: label = the exit's
prediction equals the full model's) stops the forward pass when the predicted agreement reaches
``exit_threshold``; the skipped layers' K/V for that token are written from the exit hidden state (state
propagation, as CALM, Schuster et al., NeurIPS 2022), so later tokens can attend at every layer. The *stop
rule* ends the completion when a second logistic rule, on the emitted token's confidence and fit on
teacher-forced canonical solutions (label = the full model's prediction is wrong), predicts a wrong token with
probability above ``stop_threshold``. Not lossless: the runner reports layers skipped, speedup, and
exact match and ROUGE-L against plain greedy decoding.

**Wrong token, unhelpful completion** (:func:`wrong_token_study`). The paper found that completions continued
from the full model's wrong tokens were accepted 4.2% of the time (human annotators' Acceptance Rate). Here,
teacher-forced on canonical solutions, at positions where the full model's argmax differs from the reference
token, the model completes the line greedily from its own wrong token (to the end of the line, at most
``max_tokens``); the same is done at positions where it was right (the control). A completion counts as
*helpful* when it reproduces the rest of the reference line exactly (``exact``) or with ROUGE-L >= 0.8
(``rouge``): automatic stand-ins for the annotators, stated as such in the report.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from executor.methods._common import calibration_profile
from executor.methods.base import Method, MethodResult, Prediction
from executor.methods.calibration import default_exit_head
from executor.methods.del_exit import exit_head_cards, trained_exit_head
from theory.checks import as_count, as_probabilities

__all__ = ["CodeCompletion", "LogisticRule", "rouge_l", "wrong_token_study"]


def rouge_l(candidate: list[int], reference: list[int]) -> float:
    """ROUGE-L F1 of two token sequences (longest common subsequence; Lin, 2004)."""
    if not candidate or not reference:
        return float(candidate == reference)
    previous = [0] * (len(reference) + 1)
    for a in candidate:
        current = [0]
        for j, b in enumerate(reference):
            current.append(previous[j] + 1 if a == b else max(previous[j + 1], current[j]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(candidate), lcs / len(reference)
    return 2 * precision * recall / (precision + recall)


def _greedy_line(model, prefix: list[int], first: int, line_end, max_tokens: int) -> list[int]:
    """``first`` followed by the model's greedy continuation of ``prefix + [first]`` until a line end."""
    out = [first]
    if line_end(first):
        return out
    with torch.no_grad():
        model.setup_cache(len(prefix) + max_tokens + 1)
        tokens = prefix + [first]
        logits = model(torch.tensor([tokens]), torch.arange(len(tokens)))[0, -1]
        while len(out) < max_tokens:
            token = int(logits.argmax())
            out.append(token)
            if line_end(token):
                break
            position = len(prefix) + len(out) - 1
            logits = model(torch.tensor([[token]]), torch.tensor([position]))[0, -1]
    return out


def wrong_token_study(
    model, prompts, references, line_end, *, max_tokens: int = 16, max_positions: int = 8
) -> dict:
    """How often a completion continued from the full model's wrong token is helpful, against the control of
    completions continued from its right tokens (see the module docstring).

    ``line_end(token) -> bool`` marks tokens that end a line; at most ``max_positions`` wrong and as many right
    positions per reference, evenly spaced. Returns counts and rates per group (``wrong``, ``right``).
    """
    groups = {"wrong": [], "right": []}
    for prompt, reference in zip(prompts, references, strict=False):
        if not reference:
            continue
        tokens = list(prompt) + list(reference)
        with torch.no_grad():
            model.setup_cache(len(tokens))
            predicted = model(torch.tensor([tokens]), torch.arange(len(tokens)))[0, len(prompt) - 1 : -1]
        predicted = predicted.argmax(-1).tolist()
        for name, wanted in (("wrong", False), ("right", True)):
            where = [t for t, p in enumerate(predicted) if (p == reference[t]) is wanted]
            if len(where) > max_positions:  # evenly spaced
                where = [where[int(i)] for i in np.linspace(0, len(where) - 1, max_positions).round()]
            for t in where:
                end = t
                while end < len(reference) and not line_end(reference[end]):
                    end += 1
                rest = reference[t : end + 1]
                completion = _greedy_line(
                    model, tokens[: len(prompt) + t], predicted[t], line_end, max_tokens
                )
                groups[name].append((completion == rest, rouge_l(completion, rest)))
    result = {}
    for name, rows in groups.items():
        result[name] = {
            "positions": len(rows),
            "exact_rate": float(np.mean([r[0] for r in rows])) if rows else None,
            "rouge_rate": float(np.mean([r[1] >= 0.8 for r in rows])) if rows else None,
            "mean_rouge_l": float(np.mean([r[1] for r in rows])) if rows else None,
        }
    return result


class LogisticRule:
    """:math:`P(y = 1 \\mid c) = \\sigma(w_0 + w_1 c)`, fit by Newton's method (with a small ridge)."""

    def __init__(self) -> None:
        self.weights = np.zeros(2)

    def fit(self, feature, label, ridge: float = 1e-3, steps: int = 25) -> LogisticRule:
        x = np.stack([np.ones(len(feature)), np.asarray(feature, dtype=np.float64)], axis=1)
        y = np.asarray(label, dtype=np.float64)
        w = np.zeros(2)
        for _ in range(steps):
            p = 1 / (1 + np.exp(-x @ w))
            gradient = x.T @ (p - y) + ridge * w
            hessian = (x * (p * (1 - p))[:, None]).T @ x + ridge * np.eye(2)
            w -= np.linalg.solve(hessian, gradient)
        self.weights = w
        return self

    def __call__(self, feature: float) -> float:
        return float(1 / (1 + np.exp(-(self.weights[0] + self.weights[1] * feature))))


class CodeCompletion(Method):
    name = "code-completion"
    lossless = False
    paper = "Dynamic inference for code completion, Sun et al., ICSE 2024"

    def __init__(
        self,
        target,
        tokenizer=None,
        *,
        exit_layers=None,
        exit_threshold: float = 0.9,
        stop_threshold: float = 0.95,
        head=None,
        trained: bool | None = None,
        study_tokens: int = 16,
        study_positions: int = 4,
    ):
        super().__init__(target, tokenizer)
        self.study_tokens = as_count(study_tokens, "study_tokens")
        self.study_positions = as_count(study_positions, "study_positions")
        n = target.config.n_layers
        self.trained_layers: list[int] = []
        if head is None:
            # The paper's exits are trained for the task: the cached exit:K heads where there are any, at
            # the requested exit layers (by default also at every layer that has one).
            head, self.trained_layers = trained_exit_head(target, exit_layers, trained, "exit:12,18,24")
        if exit_layers is None:
            exit_layers = sorted({max(1, n - k) for k in (2, 4, 6)} | set(self.trained_layers))
        self.exit_layers = [int(layer) for layer in exit_layers]
        for layer in self.exit_layers:
            if not 1 <= layer < n:
                raise ValueError(f"exit_layers must lie in [1, {n}), got {layer}")
        self.exit_threshold = float(as_probabilities(exit_threshold, "exit_threshold"))
        self.stop_threshold = float(as_probabilities(stop_threshold, "stop_threshold"))
        self.custom_head = head is not None
        self.head = head if head is not None else default_exit_head(target)
        self.exit_rules: dict[int, LogisticRule] = {}
        self.stop_rule: LogisticRule | None = None
        self.references: list[list[int]] | None = None

    def drafter_cards(self) -> list[dict]:
        return exit_head_cards(self.target, self.trained_layers)

    def options(self) -> dict:
        return {
            "exit_layers": self.exit_layers,
            "trained_layers": self.trained_layers,
            "exit_threshold": self.exit_threshold,
            "stop_threshold": self.stop_threshold,
            "study_tokens": self.study_tokens,
            "study_positions": self.study_positions,
        }

    def build(self, temperature: float = 0.0):
        raise ValueError("code-completion is not a speculative decoder; use run()")

    # ---------------------------------------------------------------------------------------- calibration
    def predict(self, calibration_prompts, temperature, max_new_tokens):
        n = self.target.config.n_layers
        study_layers = list(range(1, n))
        # The study is the paper's: the model's own final norm and LM head on every layer.
        profile, _ = calibration_profile(self.target, calibration_prompts, study_layers, 0.0, max_new_tokens)
        details = {"agreement_with_final_by_layer": profile.match.mean(axis=1).tolist()}
        if self.custom_head:  # the exit rules see the confidences of the heads that decode
            profile, _ = calibration_profile(
                self.target, calibration_prompts, self.exit_layers, 0.0, max_new_tokens, head=self.head
            )
            details["exit_head_agreement"] = {
                layer: float(profile.match[profile.row(layer)].mean()) for layer in self.exit_layers
            }
        start = time.perf_counter()
        for layer in self.exit_layers:
            row = profile.row(layer)
            self.exit_rules[layer] = LogisticRule().fit(profile.confidence[row], profile.match[row])
        train = time.perf_counter() - start
        if self.references:
            wrong, confidence = [], []
            for prompt, reference in zip(calibration_prompts, self.references, strict=False):
                tokens = prompt + reference
                truth = np.array(reference)
                final_pred = self._teacher_forced(tokens, len(prompt))
                wrong.append(final_pred[0] != truth)
                confidence.append(final_pred[1])
            wrong_all = np.concatenate(wrong)
            start = time.perf_counter()
            self.stop_rule = LogisticRule().fit(np.concatenate(confidence), wrong_all.astype(float))
            train += time.perf_counter() - start
            details["full_model_wrong_rate"] = float(wrong_all.mean())
            if self.tokenizer is not None:
                decode = self.tokenizer.decode
                details["wrong_token_completions"] = wrong_token_study(
                    self.target,
                    calibration_prompts,
                    self.references,
                    lambda token: "\n" in decode([token]),
                    max_tokens=self.study_tokens,
                    max_positions=self.study_positions,
                )
        return Prediction(None, details, train_seconds=train)

    def _teacher_forced(self, tokens, start):
        with torch.no_grad():
            self.target.setup_cache(len(tokens))
            logits = self.target(torch.tensor([tokens]), torch.arange(len(tokens)))[0, start - 1 : -1]
        probs = logits.softmax(-1)
        return logits.argmax(-1).numpy(), probs.max(-1).values.double().numpy()

    # ------------------------------------------------------------------------------------------- decoding
    def _propagate(self, hidden, layer_from: int, slot: torch.Tensor, cos, sin) -> None:
        """Write the K/V of layers ``layer_from..L-1`` for one token from the exit hidden state."""
        for layer in self.target.layers[layer_from:]:
            k, v = layer.attention.key_value(layer.attention_norm(hidden), cos, sin)
            layer.attention.kv_cache.write(slot, k, v)

    def _token(self, token: int, position: int, temperature: float, generator):
        model = self.target
        device = model.tok_embeddings.weight.device
        slot = torch.tensor([position], device=device)
        cos, sin = model._rope(slot)
        mask = torch.ones(1, position + 1, dtype=torch.bool, device=device)
        x = model.tok_embeddings(torch.tensor([[token]], device=device))
        n = model.config.n_layers
        for index, layer in enumerate(model.layers, start=1):
            x = layer(x, cos, sin, slot, mask)
            if index in self.exit_rules and index < n:
                logits = self.head(index, x[0, -1])
                confidence = float(logits.softmax(-1).max())
                if self.exit_rules[index](confidence) >= self.exit_threshold:
                    self._propagate(x, index, slot, cos, sin)
                    return logits, index, confidence
        logits = self.head(n, x[0, -1])
        return logits, n, float(logits.softmax(-1).max())

    def run(self, prompt_ids, *, temperature=0.0, max_new_tokens=64, generator=None, eos_id=None):
        from executor.decoders import Sampling

        sampling = Sampling(temperature=temperature)
        prompt = list(prompt_ids)
        if generator is None:
            generator = torch.Generator().manual_seed(0)
        model = self.target
        start = time.perf_counter()
        layers, tokens, stopped = [], [], False
        from executor.methods.base import LayerCounter

        with torch.no_grad(), LayerCounter(model) as counter:
            model.setup_cache(len(prompt) + max_new_tokens + 1)
            if len(prompt) > 1:
                model(torch.tensor([prompt[:-1]]), torch.arange(len(prompt) - 1))
            last = prompt[-1]
            for step in range(max_new_tokens):
                logits, used, confidence = self._token(last, len(prompt) - 1 + step, temperature, generator)
                last = sampling.draw(sampling.probs(logits), generator)
                tokens.append(last)
                layers.append(used)
                if eos_id is not None and last == eos_id:
                    break
                if self.stop_rule is not None and self.stop_rule(confidence) > self.stop_threshold:
                    stopped = True
                    break
        wall = time.perf_counter() - start
        counter.exclude_prefill(len(prompt))
        n = model.config.n_layers
        return MethodResult(
            token_ids=tokens,
            steps=len(tokens),
            acceptance_by_position=[],
            layer_evaluations=int(sum(layers)),
            wall_time=wall,
            extra={
                "layers_skipped_mean": float(n - np.mean(layers)) if layers else 0.0,
                "exit_layers": np.bincount(layers, minlength=n + 1).tolist(),
                "stopped_early": stopped,
                "layer_passes": counter.passes,
                "head_passes": counter.heads,
            },
        )
