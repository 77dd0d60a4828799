"""The HumanEval teacher-forced loop shared by experiments.drafter_eval and experiments.falcon_eval."""

from __future__ import annotations

import pytest
import torch

from executor.drafters import FalconDrafter, FalconHead, FeatureDrafter, FeatureHead
from executor.training.features import target_logits
from experiments import drafter_eval, falcon_eval

VOCAB = 16
TEXTS = [("abcde", "fghijklm"), ("hello ", "world, again")]


class CharTokenizer:
    def encode(self, text: str) -> list[int]:
        return [1 + ord(c) % (VOCAB - 1) for c in text]


@pytest.fixture
def target(monkeypatch):
    from tests.tiny_models import build_tiny_model

    monkeypatch.setattr(drafter_eval, "humaneval_continuations", lambda count: TEXTS[:count])
    return build_tiny_model(5, vocab_size=VOCAB, max_seq_len=64)


def test_shared_loop_scores_a_perfect_head_at_one_and_counts_tokens(target):
    def rows_of(ids, start, hidden):
        p = target_logits(target, hidden[0]).softmax(-1)
        yield "exact", p, target_logits(target, hidden[0]), torch.arange(VOCAB)
        yield "uniform", p, torch.zeros_like(p), torch.arange(VOCAB)

    figures = drafter_eval.humaneval_figures(target, CharTokenizer(), 2, rows_of)
    assert figures["exact"]["sum_min"] == pytest.approx(1.0) and figures["exact"]["top1"] == 1.0
    assert figures["exact"]["tokens"] == len("abcdefghijklm") + len("hello world, again")
    assert figures["uniform"]["sum_min"] < 0.9  # negative control


def test_feature_figures_equal_a_direct_computation(target):
    torch.manual_seed(0)
    head = FeatureHead(target.config)
    for parameter in head.parameters():
        torch.nn.init.normal_(parameter, std=0.2)
    got = drafter_eval.teacher_forced(target, CharTokenizer(), FeatureDrafter(target, head), 1)
    ids = CharTokenizer().encode("abcdefghijklm")
    target.setup_cache(len(ids))
    with torch.no_grad():
        _, hidden = target(torch.tensor([ids]), torch.arange(len(ids)), return_hidden=True)
        head.setup_cache(len(ids) - 1)
        slots = torch.arange(len(ids) - 1)
        g = head(target, hidden[:, :-1], torch.tensor([ids[1:]]), slots, slots + 1, slots <= slots[:, None])
        rows = slice(5 - 2, len(ids) - 1)
        p = target_logits(target, hidden[0, 1:][rows]).softmax(-1)
        q = head.logits(target, g[0][rows]).softmax(-1)
    assert got["tokens"] == p.shape[0] and got["problems"] == 1
    assert got["sum_min"] == pytest.approx(float(torch.minimum(p, q).sum(-1).mean()), abs=1e-6)
    assert got["top1"] == pytest.approx(float((p.argmax(-1) == q.argmax(-1)).float().mean()))


def test_falcon_figures_score_four_positions_over_the_solution(target):
    torch.manual_seed(1)
    drafter = FalconDrafter(target, FalconHead(target.config))
    got = falcon_eval.teacher_forced(target, CharTokenizer(), drafter, 2)
    assert got["problems"] == 2
    assert set(got) == {"token1", "token2", "token3", "token4", "problems"}
    scored = sum(len(s) for _, s in TEXTS)
    assert abs(got["token1"]["tokens"] + got["token2"]["tokens"] - scored) <= 4
    assert all(0 <= got[name]["sum_min"] <= 1 for name in ("token1", "token2", "token3", "token4"))


def test_own_greedy_text_scores_the_targets_greedy_continuation(target, monkeypatch):
    from executor.decoders import AutoregressiveDecoder
    from experiments import prompts

    monkeypatch.setattr(prompts, "humaneval_prompts", lambda count: ["abcde", "hello "][:count])
    torch.manual_seed(2)
    head = FeatureHead(target.config)
    for parameter in head.parameters():
        torch.nn.init.normal_(parameter, std=0.2)
    drafter = FeatureDrafter(target, head)
    got = drafter_eval.own_greedy_text(target, CharTokenizer(), drafter, 2, 6)
    # the 6 generated tokens and the one after the text (target against head there too), per prompt
    assert got["tokens"] == 2 * 7 and (got["prompts"], got["new_tokens"]) == (2, 6)
    # On greedy text the target's argmax is the next token: top-1 counts the head's argmax hitting it.
    hits = 0
    for text in ("abcde", "hello "):
        prompt = CharTokenizer().encode(text)
        ids = prompt + AutoregressiveDecoder(target).generate(prompt, 6).token_ids
        target.setup_cache(len(ids))
        with torch.no_grad():
            _, hidden = target(torch.tensor([ids]), torch.arange(len(ids)), return_hidden=True)
            head.setup_cache(len(ids) - 1)
            slots = torch.arange(len(ids) - 1)
            g = head(
                target, hidden[:, :-1], torch.tensor([ids[1:]]), slots, slots + 1, slots <= slots[:, None]
            )
            # entry s (features after token s + 1) predicts token s + 2
            rows = slice(len(prompt) - 2, len(ids) - 1)
            predicted = head.logits(target, g[0][rows]).argmax(-1)
            wanted = target_logits(target, hidden[0, 1:][rows]).argmax(-1)
        assert wanted[:-1].tolist() == ids[len(prompt) :]  # the scored text is the greedy continuation
        hits += int((predicted == wanted).sum())
    assert got["top1"] == pytest.approx(hits / 14)
