"""Training exit heads and Kangaroo's adapter on a tiny model for seconds: held-out KL falls and sum-min rises
on a learnable corpus; several exit layers train in one job; interrupted runs resume; bad kinds are refused."""

from __future__ import annotations

import json

import pytest
import torch

from executor.drafters.exit_head import ExitDrafter, KangarooDrafter
from executor.training.exit_heads import ExitTrainConfig, evaluate_exit_head, parse_kind, train_layer_kind
from executor.training.features import build_features, load_features, target_logits
from executor.training.layer_features import add_layer_features, load_layer_features
from tests.executor.test_training_trainer import VOCAB, markov_chunks


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from tests.tiny_models import build_tiny_model

    target = build_tiny_model(0, vocab_size=VOCAB, n_layers=3, dim=32, n_heads=4, n_kv_heads=2, hidden_dim=64)
    directory = tmp_path_factory.mktemp("features")
    data = {"train": markov_chunks(48, 24, 0), "held_out": markov_chunks(6, 24, 1)}
    build_features(target, data, directory, progress=False)
    return target, directory


CONFIG = ExitTrainConfig(
    minutes=0.04, lr=3e-3, batch_size=8, vocab="full", eval_seconds=1.0, exit_rows=256, window=16
)


def cards_of(path, layers, family):
    if len(layers) == 1:
        return {layers[0]: json.loads((path / "card.json").read_text())}
    return {k: json.loads((path.parent / f"{family}-{k}" / "card.json").read_text()) for k in layers}


@pytest.mark.parametrize("kind", ["exit:1,2", "kangaroo:1"])
def test_training_for_seconds_lowers_held_out_kl_and_raises_sum_min(setup, tmp_path, kind):
    target, directory = setup
    family, layers = parse_kind(kind, target.config.n_layers)
    path = train_layer_kind(
        target, kind, directory, tmp_path, {}, CONFIG, {"corpus": "markov"}, progress=False
    )
    cards = cards_of(path, layers, family)
    assert sorted(cards) == layers  # several exit layers: one checkpoint each, from one job
    for layer, card in cards.items():
        before, after = card["held_out_initial"], card["held_out"]
        assert card["kind"] == f"{family}:{layer}" and card["corpus"] == "markov"
        assert after["kl"] < 0.5 * before["kl"], (layer, before, after)
        assert after["sum_min"] > before["sum_min"] + 0.1, (layer, before, after)
        assert card["steps"] > 5 and card["ridge_r2"] > 0
        # The saved head drafts: loading it gives the card's held-out figures back.
        cls = KangarooDrafter if family == "kangaroo" else ExitDrafter
        drafter = cls.from_checkpoint(
            target, path if len(layers) == 1 else path.parent / f"exit-{layer}", layer
        )
        train_split = {"features": load_features(directory, "held_out")}
        from executor.training.exit_heads import LayerData

        held = LayerData(train_split["features"], {layer: load_layer_features(directory, "held_out", layer)})
        again = evaluate_exit_head(drafter.head.float(), target, held)
        assert again["sum_min"] == pytest.approx(after["sum_min"], abs=1e-6)


def test_evaluation_matches_a_direct_computation(setup):
    from executor.drafters.exit_head import ExitHead
    from executor.training.exit_heads import LayerData

    target, directory = setup
    add_layer_features(target, directory, [2], progress=False)  # no other test's run order relied on
    features = load_features(directory, "held_out")
    data = LayerData(features, {2: load_layer_features(directory, "held_out", 2)})
    head = ExitHead(target.config, 2)
    metrics = evaluate_exit_head(head, target, data, max_chunks=1)
    with torch.no_grad():
        # The untrained head is the plain early exit: norm(h_2) through the final norm and the LM head.
        target.setup_cache(24)
        _, hidden = target(
            torch.tensor(features.tokens[:1].tolist()), torch.arange(24), exit_layer=2, return_hidden=True
        )
        q = target_logits(target, hidden[0]).double().softmax(-1)
        p = target_logits(target, features.hidden[0].float()).double().softmax(-1)
    assert metrics["tokens"] == 24
    assert metrics["sum_min"] == pytest.approx(float(torch.minimum(p, q).sum(-1).mean()), abs=1e-3)
    assert metrics["top1"] == pytest.approx(float((p.argmax(-1) == q.argmax(-1)).double().mean()))


def test_an_interrupted_run_resumes_from_its_saved_state(setup, tmp_path):
    target, directory = setup
    short = ExitTrainConfig(minutes=0.01, vocab="full", exit_rows=64)
    first = train_layer_kind(target, "exit:1", directory, tmp_path, {}, short, {}, progress=False)
    steps = json.loads((first / "card.json").read_text())["steps"]
    state = torch.load(tmp_path / "train_state.pt", weights_only=False)
    assert state["progress"]["steps"] == steps
    longer = ExitTrainConfig(minutes=0.03, vocab="full", exit_rows=64)
    train_layer_kind(target, "exit:1", directory, tmp_path, {}, longer, {}, progress=False)
    card = json.loads((first / "card.json").read_text())
    assert card["steps"] > steps and card["seconds"] >= 0.03 * 60 - 1e-6


def test_bad_kinds_and_configs_are_refused():
    for kind, message in [
        ("exit", "needs integer layers"),
        ("exit:a", "needs integer layers"),
        ("exit:0", r"must lie in \[1, 30\)"),
        ("exit:30", r"must lie in \[1, 30\)"),
        ("kangaroo:2,4", "one layer"),
        ("medusa:2", "kind must be"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_kind(kind, 30)
    assert parse_kind("exit:18,6,12,6", 30) == ("exit", [6, 12, 18])
    with pytest.raises(ValueError, match="window must be an integer >= 2"):
        ExitTrainConfig(window=1)
