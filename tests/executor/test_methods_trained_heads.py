"""DEL, Kangaroo, staged, EasySpec and code completion with the trained exit heads / Kangaroo adapter cached
for the target:
found by kind, used for drafting (or exiting), greedy output identical to plain decoding for the lossless ones;
``trained=True`` without a checkpoint is refused."""

from __future__ import annotations

import pytest
import torch

from executor import methods
from executor.decoders import AutoregressiveDecoder
from executor.drafters.exit_head import ExitHead, KangarooDrafter
from executor.methods.calibration import default_exit_head
from executor.methods.staged import StagedDrafter
from executor.training import checkpoint
from tests.executor.test_drafters_exit_head import random_head

PROMPT = [1, 2, 3, 1, 2]


@pytest.fixture
def target(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tiny_model(5, vocab_size=12, n_layers=4, max_seq_len=64)


def target_cache(target):
    return checkpoint.cache_root() / "drafters"


def cache_head(target, kind: str, seed: int, head=None):
    family, _, layer = kind.partition(":")
    if head is None:
        head = random_head(target, seed, attention=family == "kangaroo", layer=int(layer))
    fingerprint = checkpoint.model_fingerprint(target)
    directory = checkpoint.default_checkpoint_dir(kind, fingerprint, {"recipe": 1})
    checkpoint.save_checkpoint(directory, head.state_dict(), {"kind": kind, "target": fingerprint})
    return directory


def test_del_uses_the_cached_trained_exit_heads_and_stays_greedy_exact(target):
    with pytest.raises(ValueError, match="no trained exit:K head is cached"):
        methods.get("del")(target, trained=True)
    for layer, seed in ((1, 3), (2, 4)):
        cache_head(target, f"exit:{layer}", seed)
    method = methods.get("del")(target, max_gamma=4)
    assert method.layers == [1, 2] and method.options()["trained_layers"] == [1, 2]
    untrained = methods.get("del")(target, layers=[1, 2], max_gamma=4, trained=False)
    assert untrained.options()["trained_layers"] == []
    reference = AutoregressiveDecoder(target).generate(PROMPT, 24).token_ids
    result = method.run(PROMPT, max_new_tokens=24)
    assert result.token_ids == reference
    assert result.extra["verified_positions"] > len(result.token_ids) - 1 or result.steps < 24


@pytest.mark.parametrize("name", ["kangaroo", "kangaroo-fixed"])
def test_kangaroo_uses_the_cached_trained_adapter_and_stays_greedy_exact(target, name):
    with pytest.raises(ValueError, match="no trained kangaroo:K adapter is cached"):
        methods.get(name)(target, trained=True)
    path = cache_head(target, "kangaroo:2", 7)
    method = methods.get(name)(target, gamma=3)
    assert method.exit_layer == 2 and method.options()["adapter"] == str(path)
    assert isinstance(method.make_drafter(), KangarooDrafter)
    assert methods.get(name)(target, exit_layer=1, gamma=3).options()["adapter"] is None
    reference = AutoregressiveDecoder(target).generate(PROMPT, 24).token_ids
    assert method.run(PROMPT, max_new_tokens=24).token_ids == reference
    prediction = method.predict([[4, 5, 6, 7], [3, 3, 1]], 0.0, 12)
    assert 0 <= prediction.details["eta"] <= 1


def test_code_completion_exits_through_the_cached_trained_heads(target):
    with pytest.raises(ValueError, match="no trained exit:K head is cached"):
        methods.get("code-completion")(target, trained=True)
    cache_head(target, "exit:1", 3)
    method = methods.get("code-completion")(target)
    assert method.options()["trained_layers"] == [1] and 1 in method.exit_layers
    hidden = torch.randn(target.config.dim)
    untrained = default_exit_head(target)
    assert not torch.allclose(method.head(1, hidden), untrained(1, hidden))  # layer 1: the trained head
    assert torch.equal(method.head(2, hidden), untrained(2, hidden))  # no head cached at layer 2
    assert methods.get("code-completion")(target, trained=False).options()["trained_layers"] == []
    prediction = method.predict([[4, 5, 6, 7], [3, 3, 1]], 0.0, 12)
    # The exit rules are fit on the confidences of the heads that decode, next to the paper's study.
    assert set(prediction.details["exit_head_agreement"]) == set(method.exit_layers)
    assert len(prediction.details["agreement_with_final_by_layer"]) == target.config.n_layers - 1
    result = method.run(PROMPT, max_new_tokens=8)
    assert len(result.token_ids) <= 8 and result.extra["exit_layers"][0] == 0


def test_staged_and_easyspec_draft_with_the_deepest_cached_trained_exit_head(target):
    for layer, seed in ((1, 3), (2, 4)):
        cache_head(target, f"exit:{layer}", seed)
    for name in ("staged", "staged-single", "easyspec"):
        method = methods.get(name)(target)
        assert method.exit_layer == 2 and method.options()["head"].startswith(str(target_cache(target)))
        assert methods.get(name)(target, exit_layer=1).exit_layer == 1
        assert methods.get(name)(target, trained=False).options()["head"] is None
    easyspec = methods.get("easyspec")(target, exact_layers=0)
    hidden = torch.randn(3, target.config.dim)
    drafter = easyspec.make_drafter()
    assert not torch.allclose(drafter.head(hidden), default_exit_head(target)(2, hidden))


class CheckedStagedDrafter(StagedDrafter):
    """Checks every row draft² hands out against the inner drafter's own pass on the same nodes."""

    def draft_logits(self, state, tree, nodes):
        rows = super().draft_logits(state, tree, nodes)
        torch.testing.assert_close(rows, self.inner.draft_logits(state, tree, nodes), atol=1e-4, rtol=1e-4)
        return rows


def test_draft2_hands_out_the_trained_heads_exact_draft_logits_and_saves_passes(target):
    # Near the untrained exit (W = I, a small random bias), so that its drafts follow the repetitive prompt
    # often enough for draft² to be used, and still a head of its own.
    head = ExitHead(target.config, 2)
    with torch.no_grad():
        head.fc.bias.copy_(0.3 * torch.randn(target.config.dim, generator=torch.Generator().manual_seed(4)))
    cache_head(target, "exit:2", 4, head)
    method = methods.get("staged")(target, budget=5, max_depth=3, width=2, inner_length=3)
    decoder = method.build(1.0)
    decoder.drafter = CheckedStagedDrafter(
        target, method.make_drafter(), method.draft2, scratch_offset=method.tree.tree.size, inner_length=3
    )
    prompt = [1, 2, 3, 4] * 4
    decoder.generate(prompt, 12, generator=torch.Generator().manual_seed(0))
    assert decoder.drafter.draft_passes < decoder.drafter.draft_levels  # some rows came from draft²
    hidden = torch.randn(3, target.config.dim)
    assert not torch.allclose(method.make_drafter().head_logits(hidden), default_exit_head(target)(2, hidden))
    reference = AutoregressiveDecoder(target).generate(prompt, 12).token_ids
    assert method.run(prompt, temperature=0.0, max_new_tokens=12).token_ids == reference
    single = methods.get("staged-single")(target, budget=5, max_depth=3, width=2)
    assert single.run(prompt, temperature=0.0, max_new_tokens=12).token_ids == reference


def test_methods_report_the_cards_of_the_trained_heads_they_draft_with(target):
    from experiments.methods_run import drafter_training

    assert methods.get("staged")(target).drafter_cards() == []  # nothing cached: untrained exit
    for layer, seed in ((1, 3), (2, 4)):
        cache_head(target, f"exit:{layer}", seed)
    cache_head(target, "kangaroo:2", 7)
    kinds = {
        name: [card["kind"] for card in methods.get(name)(target).drafter_cards()]
        for name in ("staged", "easyspec", "del", "code-completion", "kangaroo")
    }
    assert kinds == {
        "staged": ["exit:2"],
        "easyspec": ["exit:2"],
        "del": ["exit:1", "exit:2"],
        "code-completion": ["exit:1", "exit:2"],
        "kangaroo": ["kangaroo:2"],
    }
    assert methods.get("staged")(target, trained=False).drafter_cards() == []
    # Heads trained in one job share its seconds on each card: counted once.
    joint = [{"kind": f"exit:{k}", "seconds": 360.0, "trained_with": "exit:1,2"} for k in (1, 2)]
    alone = {"kind": "kangaroo:2", "seconds": 240.0}
    assert drafter_training(joint + [alone])["drafter_train_seconds"] == 600.0
    assert drafter_training([])["drafter_train_seconds"] == 0.0
