"""Training a tiny feature head for seconds: held-out KL falls, sum-min rises; interrupted runs resume."""

from __future__ import annotations

import json

import pytest
import torch

from executor.drafters import FeatureHead
from executor.training.features import build_features, load_features, target_logits
from executor.training.trainer import TrainConfig, choose_vocab, evaluate_head, train_feature_head

VOCAB = 16


def markov_chunks(count: int, length: int, seed: int) -> list[list[int]]:
    """A learnable corpus: x_{t+1} = 3 x_t + 1 + b_t (mod 16) with a fair coin b_t."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        chunk = [int(torch.randint(VOCAB, (1,), generator=generator))]
        for _ in range(length - 1):
            chunk.append((3 * chunk[-1] + 1 + int(torch.randint(2, (1,), generator=generator))) % VOCAB)
        out.append(chunk)
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from tests.tiny_models import build_tiny_model

    target = build_tiny_model(0, vocab_size=VOCAB, dim=32, n_heads=4, n_kv_heads=2, hidden_dim=64)
    directory = tmp_path_factory.mktemp("features")
    data = {"train": markov_chunks(48, 24, 0), "held_out": markov_chunks(6, 24, 1)}
    build_features(target, data, directory, progress=False)
    return target, load_features(directory, "train"), load_features(directory, "held_out")


CONFIG = TrainConfig(minutes=0.04, lr=3e-3, batch_size=8, vocab="full", eval_seconds=1.0)


def test_training_for_seconds_lowers_held_out_kl_and_raises_sum_min(setup, tmp_path):
    target, train, held_out = setup
    card = train_feature_head(target, train, held_out, tmp_path, CONFIG, progress=False)
    before, after = card["held_out_initial"], card["held_out"]
    assert after["kl"] < 0.5 * before["kl"]
    assert after["sum_min"] > before["sum_min"] + 0.2
    assert card["steps"] > 5 and card["ridge_r2"] > 0
    # The ridge start alone already beats the untrained head; the gradient steps then beat the ridge start.
    assert after["sum_min"] > 0.6


def test_evaluation_matches_a_direct_computation(setup):
    target, _, held_out = setup
    head = FeatureHead(target.config)
    metrics = evaluate_head(head, target, held_out, max_chunks=1)
    head.setup_cache(23)
    slots = torch.arange(23)
    with torch.no_grad():
        hidden = held_out.hidden[0].float()
        g = head(
            target, hidden[None, :-1], held_out.tokens[:1, 1:], slots, slots + 1, slots <= slots[:, None]
        )[0]
        p = target_logits(target, hidden[1:]).double().softmax(-1)
        q = head.logits(target, g).double().softmax(-1)
    assert metrics["tokens"] == 23
    assert metrics["sum_min"] == pytest.approx(float(torch.minimum(p, q).sum(-1).mean()), abs=1e-5)
    assert metrics["top1"] == pytest.approx(float((p.argmax(-1) == q.argmax(-1)).double().mean()))


def test_an_interrupted_run_resumes_from_its_saved_state(setup, tmp_path):
    target, train, held_out = setup
    first = train_feature_head(
        target, train, held_out, tmp_path, TrainConfig(minutes=0.01, vocab="full"), progress=False
    )
    state = torch.load(tmp_path / "train_state.pt", weights_only=False)
    assert state["progress"]["steps"] == first["steps"]
    second = train_feature_head(
        target, train, held_out, tmp_path, TrainConfig(minutes=0.03, vocab="full"), progress=False
    )
    assert second["steps"] > first["steps"]
    assert second["seconds"] >= 0.03 * 60 - 1e-6
    assert json.loads((tmp_path / "card.json").read_text())["steps"] == second["steps"]


def test_reduced_vocabulary_holds_the_targets_top_tokens_and_every_training_token(setup):
    target, train, _ = setup
    vocab, info = choose_vocab(target, train, "reduced")
    expected = (train.topk_counts > 0).clone()
    expected[train.tokens.unique()] = True
    assert info["chosen"] == "reduced" or vocab is None
    if vocab is not None:
        assert vocab.tolist() == torch.nonzero(expected).reshape(-1).tolist()
    assert choose_vocab(target, train, "full")[0] is None
    with pytest.raises(ValueError, match="vocab must be"):
        TrainConfig(vocab="tiny")
    with pytest.raises(ValueError, match="minutes must be positive"):
        TrainConfig(minutes=0)


def test_max_steps_stops_training_and_the_teacher_is_cached_for_resumes(setup, tmp_path):
    target, train, held_out = setup
    config = TrainConfig(minutes=5.0, lr=3e-3, batch_size=8, vocab="full", max_steps=7, teacher_topk=4)
    card = train_feature_head(target, train, held_out, tmp_path, config, progress=False)
    assert card["steps"] == 7 and card["teacher"]["topk"] == 4
    assert 0 < card["teacher"]["mean_tail_mass"] < 1
    assert (tmp_path / "teacher.safetensors").is_file() and "max_steps" not in card["recipe"]


def test_top_k_teacher_training_learns_as_well_as_the_full_teacher(setup, tmp_path):
    target, train, held_out = setup
    full = TrainConfig(lr=3e-3, batch_size=8, vocab="full", max_steps=40, teacher_topk=0)
    top = TrainConfig(lr=3e-3, batch_size=8, vocab="full", max_steps=40, teacher_topk=4)
    a = train_feature_head(target, train, held_out, tmp_path / "full", full, progress=False)["held_out"]
    b = train_feature_head(target, train, held_out, tmp_path / "top", top, progress=False)["held_out"]
    # The Markov corpus has two next tokens: a top-4 teacher holds all of p, so the heads agree closely.
    assert abs(a["sum_min"] - b["sum_min"]) < 0.05 and b["sum_min"] > 0.6


def test_cached_checkpoints_rank_by_held_out_sum_min_then_recency(setup, tmp_path, monkeypatch):
    import os

    from executor.training.checkpoint import model_fingerprint
    from executor.training.trainer import cached_checkpoints

    target = setup[0]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    prefix = f"feature-{model_fingerprint(target)['hash'][:12]}-"
    root = tmp_path / "specbound" / "drafters"
    cards = {"weak-new": 0.30, "strong-old": 0.50, "tie-new": 0.40, "tie-old": 0.40, "broken": None}
    for age, (name, value) in enumerate(reversed(cards.items())):
        (root / (prefix + name)).mkdir(parents=True)
        card = root / (prefix + name) / "card.json"
        card.write_text("{" if value is None else json.dumps({"held_out": {"sum_min": value}}))
        os.utime(card, (1000 + age, 1000 + age))
    (root / "falcon-other").mkdir()
    names = [p.name.removeprefix(prefix) for p in cached_checkpoints(target, "feature")]
    assert names == ["strong-old", "tie-new", "tie-old", "weak-new", "broken"]


@pytest.mark.parametrize("passes", [2, 3])
def test_unrolled_passes_equal_the_drafters_own_feature_steps(setup, passes):
    """Pass j of training (one batched call, its mask over a cache of j windows) equals drafting j tokens one by
    one from a cache holding the teacher-forced context 0..s, as the drafter does at run time."""
    from executor.training.trainer import _run_head

    target, _, held_out = setup
    torch.manual_seed(1)
    head = FeatureHead(target.config)
    with torch.no_grad():  # a layer that is not the identity, so the attention mask matters
        for parameter in head.layer.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    hidden, tokens = held_out.hidden[:1, :-1].float(), held_out.tokens[:1, 1:]
    length = tokens.shape[1]
    with torch.no_grad():
        unrolled = _run_head(head, target, hidden, tokens, passes)
        assert [g.shape[1] for g in unrolled] == [length - j for j in range(passes)]
        for s in (0, 5, length - passes):
            head.setup_cache(length + passes)
            slots = torch.arange(s + 1)
            g = head(
                target, hidden[:, : s + 1], tokens[:, : s + 1], slots, slots + 1, slots <= slots[:, None]
            )
            own = g[:, -1:]
            for j in range(2, passes + 1):
                slot = torch.tensor([s + j - 1])
                visible = torch.ones(1, s + j, dtype=torch.bool)
                own = head(target, own, tokens[:, s + j - 1 : s + j], slot, slot + 1, visible)
                torch.testing.assert_close(own[0, 0], unrolled[j - 1][0, s], atol=1e-5, rtol=1e-5)
            # Sensitive to the inputs: the teacher-forced feature at the same position differs.
            assert (unrolled[0][0, s + passes - 1] - own[0, 0]).abs().max() > 1e-3


def test_unroll_trains_on_own_features_and_keys_its_own_checkpoints(setup, tmp_path):
    target, train, held_out = setup
    config = TrainConfig(**{**CONFIG.__dict__, "unroll": 2})
    card = train_feature_head(target, train, held_out, tmp_path, config, progress=False)
    before, after = card["held_out_initial"], card["held_out"]
    assert card["steps"] > 3
    assert after["sum_min_2"] > before["sum_min_2"] + 0.1 and 0.0 <= after["top1_2"] <= 1.0
    assert "unroll" not in CONFIG.recipe() and config.recipe()["unroll"] == 2  # old cache keys unchanged
    with pytest.raises(ValueError, match="unroll must be 1 to 8"):
        TrainConfig(unroll=0)
