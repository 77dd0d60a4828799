"""executor.methods components against exact oracles: DySpec's tree against theory.dynamic_tree (the paper's
Alg. 1), layer groups and fuzzy drafting, draft², the calibration helpers, DEL's policy, the code-completion
rules and ROUGE-L."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import theory
from executor.decoders import AutoregressiveDecoder, DecodingState, DraftTree, Sampling
from executor.drafters import EarlyExitDrafter
from executor.methods.calibration import exit_profile, positional_acceptance, run_lengths
from executor.methods.code_completion import CodeCompletion, LogisticRule, rouge_l
from executor.methods.confidence import ConfidenceCalibration
from executor.methods.del_exit import DELPolicy, SwitchableExitDrafter
from executor.methods.dyspec import DySpecDecoder
from executor.methods.easyspec import LayerParallelDrafter, layer_groups
from executor.methods.staged import Draft2, Staged
from tests.executor.test_methods import spread_model

PROMPT = [1, 2, 3, 1, 2]


def token_paths(parents, tokens) -> set[tuple[int, ...]]:
    paths = {0: ()}
    for node in range(1, len(parents)):
        paths[node] = paths[parents[node]] + (int(tokens[node]),)
    return set(paths.values())


@pytest.mark.parametrize("seed", [3, 4, 5])
@pytest.mark.parametrize("budget", [4, 7])
def test_dyspec_tree_is_the_papers_global_greedy_tree(tiny_model, seed, budget):
    """At temperature 0 the decoder's tree equals theory.dynamic_tree (DySpec Alg. 1, heap over sites)."""
    model = spread_model(tiny_model, seed)
    head = model.tok_embeddings.weight

    def draft(path):
        tokens = PROMPT + list(path)
        model.setup_cache(len(tokens))
        logits = model(torch.tensor([tokens]), torch.arange(len(tokens)), exit_layer=1)[0, -1]
        return logits.double().softmax(-1).numpy()

    expected = theory.dynamic_tree(draft, budget, max_depth=3)
    decoder = DySpecDecoder(model, EarlyExitDrafter(model, 1), budget=budget, max_depth=3, max_width=8)
    model.setup_cache(32)
    model(torch.tensor([PROMPT[:-1]]), torch.arange(len(PROMPT) - 1))
    tree = decoder.draft(DecodingState(list(PROMPT)), torch.Generator())
    assert len(tree) == budget and head is model.tok_embeddings.weight
    assert decoder.max_tree_size >= budget
    assert token_paths(tree.parents, tree.tokens) == token_paths(
        list(expected.tree.parents), [0, *expected.tokens[1:]]
    )


def test_layer_groups_keep_the_ends_exact_and_pair_the_middle():
    assert layer_groups(8, 2, 2) == [[0], [1], [2, 3], [4, 5], [6], [7]]
    assert layer_groups(5, 2, 0) == [[0, 1], [2, 3], [4]]
    assert layer_groups(3, 4, 2) == [[0], [1], [2]]
    groups = layer_groups(26, 3, 4)
    assert sum(groups, []) == list(range(26)) and max(map(len, groups)) == 3


def fuzzy_chain_logits(model, group_size: int) -> torch.Tensor:
    drafter = LayerParallelDrafter(model, 3, group_size=group_size, exact_layers=0)
    drafter.start(PROMPT, 32)
    model.setup_cache(32)
    state = DecodingState(list(PROMPT))
    tree = DraftTree(PROMPT[-1])
    rows = [drafter.draft_logits(state, tree, [0])[0]]
    for token in (4, 5):
        node = tree.add_child(len(tree) - 1, token)
        rows.append(drafter.draft_logits(state, tree, [node])[0])
    return torch.stack(rows)


def test_groups_of_one_layer_draft_exactly_and_larger_groups_do_not(tiny_model):
    model = spread_model(tiny_model)
    tokens = PROMPT + [4, 5]
    model.setup_cache(32)
    exact = model(torch.tensor([tokens]), torch.arange(len(tokens)), exit_layer=3)[0, len(PROMPT) - 1 :]
    torch.testing.assert_close(fuzzy_chain_logits(model, 1), exact, rtol=1e-4, atol=1e-4)
    fuzzy = fuzzy_chain_logits(model, 2)
    torch.testing.assert_close(fuzzy[0], exact[0], rtol=1e-4, atol=1e-4)  # the calibration pass is exact
    assert not torch.allclose(fuzzy[1:], exact[1:], atol=1e-3)


def test_draft2_proposes_by_prompt_lookup_then_by_its_trigram_table():
    draft2 = Draft2().fit([[5, 6, 7, 5, 6, 9, 5, 6, 7]])
    assert draft2.propose([1, 2, 3, 1, 2], 2) == [3, 1]  # prompt lookup
    assert draft2.propose([0, 5, 6], 3) == [7, 5, 6]  # trigram (5, 6) -> 7, (6, 7) -> 5, (7, 5) -> 6
    assert draft2.propose([4], 3) == []  # nothing known


def test_staged_drafting_saves_draft_passes_on_repetitive_text(tiny_model):
    model = spread_model(tiny_model)
    method = Staged(model, exit_layer=1, budget=5, max_depth=3, width=2, inner_length=3)
    decoder = method.build(0.0)
    prompt = [1, 2, 3, 4] * 4
    result = decoder.generate(prompt, 12)
    assert result.token_ids == AutoregressiveDecoder(model).generate(prompt, 12).token_ids
    assert decoder.drafter.draft_passes < decoder.drafter.draft_levels


def test_run_lengths_and_positional_acceptance_on_a_hand_example():
    runs = run_lengths(np.array([1, 1, 0, 1, 1, 1, 0]))
    assert runs.tolist() == [2, 1, 0, 3, 2, 1, 0]
    # P(run >= 1) = 5/7; P(run >= 2 | >= 1) = 3/5; P(run >= 3 | >= 2) = 1/3.
    np.testing.assert_allclose(positional_acceptance(runs, 3), [5 / 7, 3 / 5, 1 / 3])


def test_exit_profile_reads_each_exit_from_the_same_pass_as_a_truncated_forward(tiny_model):
    model = spread_model(tiny_model)
    tokens = PROMPT + [4, 5, 6]
    profile = exit_profile(model, tokens, len(PROMPT), [1, 2, 3])
    model.setup_cache(len(tokens))
    final = model(torch.tensor([tokens]), torch.arange(len(tokens)))[0, len(PROMPT) - 1 : -1].argmax(-1)
    for layer in (1, 2, 3):
        model.setup_cache(len(tokens))
        logits = model(torch.tensor([tokens]), torch.arange(len(tokens)), exit_layer=layer)[0]
        exit_logits = logits[len(PROMPT) - 1 : -1]
        row = profile.row(layer)
        assert profile.match[row].tolist() == (exit_logits.argmax(-1) == final).double().tolist()
        np.testing.assert_allclose(profile.confidence[row], exit_logits.softmax(-1).max(-1).values, rtol=1e-5)


def test_confidence_calibration_maps_each_bucket_to_its_acceptance():
    confidence = np.array([0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9])
    accept = np.array([0, 0, 0, 1, 1, 1, 1, 1], dtype=float)
    calibration = ConfidenceCalibration(buckets=2).fit(confidence, accept)
    assert calibration.predict_confidence(0.15) == pytest.approx(0.25)
    assert calibration.predict_confidence(0.95) == pytest.approx(1.0)
    model = calibration.model(4)
    assert model.law(1).mean_acceptance == pytest.approx(accept.mean())


def test_del_policy_chooses_what_theory_chooses_and_learns_online(tiny_model):
    model = spread_model(tiny_model)
    drafter = SwitchableExitDrafter(model, 1)
    prior = {1: 0.2, 2: 0.5, 3: 0.9}
    policy = DELPolicy(drafter, 4, [1, 2, 3], prior, prior_weight=10.0, max_gamma=6)
    choice = theory.del_exit_choice(prior, 4, max_gamma=6)
    assert (drafter.exit_layer, policy.gamma) == (choice.exit_layer, choice.gamma)
    for _ in range(30):  # layer 1 turns out to agree always, layer 3 never
        policy.update(
            {1: np.ones(3), 2: np.array([1.0, 0.0, 1.0]), 3: np.zeros(3)},
            {1: np.full(3, 0.9), 2: np.array([0.8, 0.2, 0.8]), 3: np.full(3, 0.2)},
        )
    assert policy.alpha(1) > 0.95 and policy.alpha(3) < 0.05
    assert drafter.exit_layer == 1
    assert policy.threshold(2) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("candidate", "reference", "expected"),
    [
        ([1, 2, 3], [1, 2, 3], 1.0),
        ([1, 2], [3, 4], 0.0),
        ([1, 2, 3], [1, 3], 0.8),
        ([], [], 1.0),
        ([], [1], 0.0),
    ],
)
def test_rouge_l_on_hand_examples(candidate, reference, expected):
    assert rouge_l(candidate, reference) == pytest.approx(expected)


def test_logistic_rule_fits_a_threshold_in_confidence():
    rng = np.random.default_rng(0)
    confidence = rng.uniform(size=400)
    rule = LogisticRule().fit(confidence, (confidence > 0.6).astype(float))
    assert rule(0.9) > 0.9 and rule(0.3) < 0.1 and rule(0.5) < rule(0.7)


def test_code_completion_without_exits_is_plain_greedy_and_with_exits_skips_layers(tiny_model):
    model = spread_model(tiny_model)
    reference = AutoregressiveDecoder(model).generate(PROMPT, 10).token_ids
    method = CodeCompletion(model, exit_layers=[2], exit_threshold=1.0)
    method.predict([[3, 1, 4, 1, 5]], 0.0, 6)
    result = method.run(PROMPT, max_new_tokens=10)
    assert result.token_ids == reference and result.extra["layers_skipped_mean"] == 0.0
    eager = CodeCompletion(model, exit_layers=[2], exit_threshold=0.0)
    eager.predict([[3, 1, 4, 1, 5]], 0.0, 6)
    result = eager.run(PROMPT, max_new_tokens=10)
    assert result.extra["layers_skipped_mean"] == 2.0 and result.layer_evaluations == 2 * 10
    with pytest.raises(ValueError, match="run"):
        eager.build(0.0)


def test_dyspec_reserves_cache_slots_for_every_tentative_node(tiny_model, monkeypatch):
    """Nodes drawn at one level can be displaced later; the drafting tree may outgrow the final budget."""
    model = spread_model(tiny_model)
    decoder = DySpecDecoder(
        model,
        EarlyExitDrafter(model, 1),
        budget=4,
        max_depth=3,
        max_width=4,
        sampling=Sampling(temperature=1.0),
    )
    sizes = []
    final_tree = decoder._final_tree

    def record(work, chosen):
        sizes.append(len(work))
        return final_tree(work, chosen)

    monkeypatch.setattr(decoder, "_final_tree", record)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        decoder.generate(PROMPT, 6, generator=generator)
    assert max(sizes) <= decoder.max_tree_size
    assert max(sizes) > decoder.budget


def test_wrong_token_study_groups_positions_and_a_wrong_start_never_matches(tiny_model):
    from executor.decoders import AutoregressiveDecoder
    from executor.methods.code_completion import wrong_token_study

    model = tiny_model(3, vocab_size=8, n_layers=2, max_seq_len=64)
    prompt = [1, 2, 3]
    own = AutoregressiveDecoder(model).generate(prompt, 10).token_ids
    # The model's own greedy text, every token ending a line: all positions right, each one-token line exact.
    study = wrong_token_study(model, [prompt], [own], lambda t: True, max_positions=20)
    assert study["wrong"]["positions"] == 0 and study["right"] == {
        "positions": 10,
        "exact_rate": 1.0,
        "rouge_rate": 1.0,
        "mean_rouge_l": 1.0,
    }
    # No line ends, 10-token completions: only the completion from position 0 reproduces the rest exactly.
    study = wrong_token_study(model, [prompt], [own], lambda t: False, max_tokens=10, max_positions=20)
    assert study["right"]["positions"] == 10 and study["right"]["exact_rate"] == pytest.approx(0.1)
    # A reference the model disagrees with: completions from its wrong tokens never match exactly.
    other = [0, 7, 1, 6, 2, 5, 3, 4, 0, 7]
    study = wrong_token_study(model, [prompt], [other], lambda t: False, max_tokens=4, max_positions=1)
    assert study["wrong"]["positions"] == 1 and study["wrong"]["exact_rate"] == 0.0
    full = wrong_token_study(model, [prompt], [other], lambda t: False, max_tokens=4, max_positions=10)
    assert (
        full["wrong"]["positions"] + full["right"]["positions"] == 10 and full["wrong"]["exact_rate"] == 0.0
    )


def test_tree_methods_measure_the_acceptance_table_once_per_prompts_and_temperature(tiny_model, monkeypatch):
    import executor.methods.dyspec as dyspec_module
    from executor.methods import DySpec, Sequoia

    model = spread_model(tiny_model, seed=11)
    calls = []
    measured = dyspec_module.tree_acceptance
    monkeypatch.setattr(dyspec_module, "_TREE_ACCEPTANCE", {})
    monkeypatch.setattr(
        dyspec_module, "tree_acceptance", lambda *args: calls.append(args[4]) or measured(*args)
    )
    options = {"exit_layer": 1, "budget": 5, "max_depth": 3, "width": 2}
    prompts = [[3, 1, 4, 1, 5]]
    first = DySpec(model, **options).measure(prompts, 0.0, 6)
    second = Sequoia(model, **options).measure(prompts, 0.0, 6)
    Staged(model, **options).measure(prompts, 1.0, 6)
    assert calls == [0.0, 1.0] and np.array_equal(first.table, second.table)
    assert first.table.shape == (3, 2)
    # A drafter passed in is measured every time (its identity is not part of the key).
    DySpec(model, **options, drafter=lambda: EarlyExitDrafter(model, 1)).measure(prompts, 0.0, 6)
    assert calls == [0.0, 1.0, 0.0]


def test_the_calibration_tree_puts_width_children_under_every_first_child():
    from executor.methods.dyspec import calibration_tree

    assert calibration_tree(3, 2) == [-1, 0, 0, 1, 1, 3, 3]
    tree = theory.Tree(calibration_tree(4, 3))
    assert tree.size == 13 and tree.depth == 4 and tree.level_sizes().tolist() == [1, 3, 3, 3, 3]
    with pytest.raises(ValueError, match="width"):
        calibration_tree(2, 0)


#: Acceptance that falls with depth: the first child at depth 1 is accepted half the time, at depth 3 never.
FALLING = np.array([[0.5, 0.2], [0.3, 0.1], [0.0, 0.0]])


def fake_measurement(monkeypatch):
    """Replace the tree methods' measurement with the FALLING table (no model run)."""
    import executor.methods.dyspec as dyspec_module
    from executor.methods.calibration import DepthAcceptance

    fake = DepthAcceptance(FALLING.copy(), np.zeros((3, 2), int), np.full((3, 2), 10), 4)
    monkeypatch.setattr(dyspec_module, "_TREE_ACCEPTANCE", {})
    monkeypatch.setattr(dyspec_module, "tree_acceptance", lambda *args: fake)


@pytest.mark.parametrize("name", ["dyspec", "sequoia", "staged"])
def test_tree_methods_predict_from_the_per_depth_table(tiny_model, monkeypatch, name):
    import executor.methods as methods

    fake_measurement(monkeypatch)
    model = spread_model(tiny_model, seed=11)
    method = methods.get(name)(model, exit_layer=1, budget=6, max_depth=3, width=2)
    if name == "staged":
        monkeypatch.setattr(method.draft2, "fit", lambda texts: None)
        monkeypatch.setattr("executor.methods.calibration.continuation", lambda *args, **kw: [1, 2])
    prediction = method.predict([[3, 1, 4, 1, 5]], 0.0, 6)
    planner = theory.greedy_tree if name == "dyspec" else theory.optimal_tree
    expected = planner(FALLING, 6, max_depth=3)
    blind = planner(FALLING[0], 6, max_depth=3)  # the single-law prediction the table replaces
    assert prediction.predicted_tau == pytest.approx(expected.expected_tokens, abs=1e-12)
    assert abs(prediction.predicted_tau - blind.expected_tokens) > 0.05
    assert prediction.details["acceptance_table"] == FALLING.tolist() and prediction.details["depth_aware"]
    if name != "dyspec":  # Sequoia (and staged's outer tree) is planned with the table too
        assert method.tree.tree == expected.tree and prediction.details["tree"] == list(expected.tree.parents)


def test_tree_methods_predict_on_a_tiny_model_from_the_measured_table(tiny_model, monkeypatch):
    import executor.methods.dyspec as dyspec_module
    from executor.methods import DySpec

    monkeypatch.setattr(dyspec_module, "_TREE_ACCEPTANCE", {})
    model = spread_model(tiny_model, seed=11)
    prediction = DySpec(model, exit_layer=1, budget=5, max_depth=3, width=2).predict(
        [[3, 1, 4, 1, 5]], 1.0, 8
    )
    table = np.array(prediction.details["acceptance_table"])
    assert table.shape == (3, 2) and np.all(table.sum(axis=1) <= 1 + 1e-12)
    assert prediction.details["acceptance_trials"][0] >= 1
    assert prediction.predicted_tau == pytest.approx(
        theory.greedy_tree(table, 5, max_depth=3).expected_tokens
    )


def test_easyspec_predicts_tau_from_the_fuzzy_drafters_acceptance_per_depth(tiny_model):
    from executor.methods import EasySpec

    model = spread_model(tiny_model, seed=11)
    method = EasySpec(model, exit_layer=3, gamma=2, group_size=2, exact_layers=0)
    prediction = method.predict([[3, 1, 4, 1, 5], [2, 7, 1, 6]], 0.0, 8)
    alphas = prediction.details["alpha_fuzzy_by_position"]
    assert len(alphas) == 2 and prediction.details["depth_aware"]
    assert [row[0] for row in prediction.details["acceptance_table"]] == alphas
    assert prediction.predicted_tau == pytest.approx(theory.expected_tokens(alphas, 2), abs=1e-12)
    # The multi-device model reads the exact drafter's acceptance and the drop per depth.
    exact, drops = prediction.details["alpha_exact_by_position"], prediction.details["alpha_drop_by_position"]
    assert len(drops) == 2 and drops[0] == 0.0 and drops[1] == max(0.0, exact[1] - alphas[1])
    one_device = prediction.details["predicted_by_devices"][1]
    expected = theory.expected_tokens([exact[0], exact[1] - drops[1]], 2)
    assert one_device["speedup"] > 0 and expected == pytest.approx(
        theory.layer_parallel_speedup(exact, drops, 2, 3, 1, layer_time=0.1, target_time=1.0).tokens_per_step
    )
