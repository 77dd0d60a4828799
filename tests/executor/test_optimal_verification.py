"""The torch twin of theory.optimal_verifier: exact tables, the sampled law, and the decoders that use it.

* the race's selection probabilities in torch equal the numpy build's on every enumerated draft tuple;
* Monte Carlo of ``verify_optimal`` (fixed seeds): output frequencies against ``p`` and the joint law of
  (drafts, output) against the numpy build's exact conditional; a copy whose ``r`` is perturbed is rejected;
* the multi-draft and tree decoders with ``verifier="optimal"`` reproduce the exact law of the next three
  tokens of a tiny model (G-test), a copy stepping against ``q`` instead of ``r`` is caught by the same test,
  and greedy decoding is the autoregressive argmax;
* in a tree with uneven i.i.d. children (3, 2 and 1 at the expanded nodes) every node builds its verifier for
  its own number of children, and the exact-law test and its negative control hold there too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from executor import optimal_verification
from executor.decoders import AutoregressiveDecoder, DynamicTree, MultiDraftDecoder, Sampling, TreeDecoder
from executor.drafters import EarlyExitDrafter, ModelDrafter
from executor.optimal_verification import build_tables, selection_probabilities, verify_optimal
from tests.executor.test_decoders import (
    P_THRESHOLD,
    PROMPT,
    SAMPLING,
    exact_law,
    flat_tiny_model,
    outcome_p_value,
    sample_outcomes,
)
from tests.goodness_of_fit import law_p_value
from theory import optimal_verifier
from theory.draft_laws import enumerate_drafts

P = np.array([0.05, 0.3, 0.0, 0.25, 0.15, 0.25])
Q = np.array([0.4, 0.1, 0.2, 0.05, 0.25, 0.0])
STEPS = 40_000


def test_torch_selection_equals_the_numpy_build_on_every_tuple():
    for n in (1, 2, 3, 4):
        tuples, _ = enumerate_drafts(Q, n)
        built = optimal_verifier(P, Q, n)
        tables = build_tables(torch.tensor(P), torch.tensor(Q), n)
        torch_selection = selection_probabilities(
            {k: v.expand(len(tuples), -1) for k, v in tables.items()}, torch.tensor(tuples)
        )
        np.testing.assert_allclose(torch_selection.numpy(), built.selection(tuples), rtol=0, atol=1e-15)
        np.testing.assert_allclose(tables["marginal"].numpy(), built.marginal, rtol=0, atol=0)


def test_batched_tables_equal_the_numpy_build_row_by_row():
    """Distinct rows of an LM-sized batch (grouped items, item counts that differ, a row with q = 0 tokens, and
    n = 1 with per-token tables): every table on the input's device, the marginal bitwise numpy's, and the
    selection probabilities of random draft tuples numpy's to 1e-15."""
    rng = np.random.default_rng(3)
    vocab, tuples = 3000, 64
    logits = 3.0 * rng.standard_normal((3, vocab))
    p = np.exp(logits / 0.7)
    q = np.exp((logits + 1.5 * rng.standard_normal((3, vocab))) / 0.7)
    q[2, :40] = 0.0
    p, q = p / p.sum(axis=1, keepdims=True), q / q.sum(axis=1, keepdims=True)
    for n in (1, 4):
        tables = build_tables(torch.tensor(p), torch.tensor(q), n)
        assert {t.device for t in tables.values()} == {torch.device("cpu")}
        drafts = torch.stack([torch.multinomial(torch.tensor(row), tuples * n, True) for row in q])
        drafts = drafts.reshape(3, tuples, n)
        expanded = {k: v[:, None].expand(3, tuples, v.shape[-1]) for k, v in tables.items()}
        chosen = selection_probabilities(expanded, drafts)
        for row in range(3):
            built = optimal_verifier(p[row], q[row], n)
            np.testing.assert_array_equal(tables["marginal"][row].numpy(), built.marginal)
            np.testing.assert_allclose(chosen[row].numpy(), built.selection(drafts[row].numpy()), atol=1e-15)


def sampled(n: int, seed: int, tables=None):
    generator = torch.Generator().manual_seed(seed)
    p, q = torch.tensor(P).expand(STEPS, -1), torch.tensor(Q).expand(STEPS, -1)
    drafts = torch.multinomial(q, n, replacement=True, generator=generator)
    if tables is None:
        tables = {k: v.expand(STEPS, -1) for k, v in build_tables(p[:1], q[:1], n).items()}
    return drafts.numpy(), verify_optimal(p, q, drafts, generator, tables).numpy()


@pytest.mark.parametrize("n", [2, 3])
def test_sampled_output_and_joint_law_match_the_exact_build(n):
    drafts, tokens = sampled(n, seed=n)
    assert law_p_value(np.bincount(tokens, minlength=P.size), P) > P_THRESHOLD
    built = optimal_verifier(P, Q, n)
    tuples, probabilities = enumerate_drafts(Q, n)
    joint = (probabilities[:, None] * built.conditional(tuples)).ravel()
    index = {tuple(t): i for i, t in enumerate(tuples.tolist())}
    cells = np.array([index[tuple(d)] for d in drafts.tolist()]) * P.size + tokens
    assert law_p_value(np.bincount(cells, minlength=joint.size), joint) > P_THRESHOLD
    accepted = (drafts == tokens[:, None]).any(axis=1).mean()
    assert abs(accepted - built.acceptance) < 5 * np.sqrt(built.acceptance * (1 - built.acceptance) / STEPS)


def perturbed_tables(p: torch.Tensor, q: torch.Tensor, n: int, delta: float = 0.05):
    """Tables whose r is moved by delta from the most selected token to the next: no longer the marginal."""
    tables = build_tables(p, q, n)
    r = tables["marginal"].clone()
    order = torch.argsort(r, dim=-1, descending=True)
    r.scatter_add_(-1, order[..., :1], torch.full_like(r[..., :1], -delta))
    r.scatter_add_(-1, order[..., 1:2], torch.full_like(r[..., :1], delta))
    excess = (p - r).clamp_min(0.0)
    total = excess.sum(dim=-1, keepdim=True)
    tables["marginal"] = r
    tables["residual"] = torch.where(total > 0, excess / torch.where(total > 0, total, 1.0), p)
    return tables


def test_a_perturbed_marginal_is_caught_by_the_same_test():
    p, q = torch.tensor(P)[None], torch.tensor(Q)[None]
    tables = {k: v.expand(STEPS, -1) for k, v in perturbed_tables(p, q, 3).items()}
    _, tokens = sampled(3, seed=11, tables=tables)
    assert law_p_value(np.bincount(tokens, minlength=P.size), P) < 1e-6


@pytest.fixture(scope="module")
def models(tiny_model):
    return flat_tiny_model(tiny_model, 3), flat_tiny_model(tiny_model, 4)


def decoders(target, draft_model):
    return {
        "multidraft": MultiDraftDecoder(
            target, ModelDrafter(draft_model), n=3, verifier="optimal", sampling=SAMPLING
        ),
        "tree": TreeDecoder(
            target,
            EarlyExitDrafter(target, 1),
            tree=DynamicTree(budget=6, max_depth=3, branching=2),
            verifier="optimal",
            sampling=SAMPLING,
        ),
        # Uneven static tree: the root has 3 children, its first child 2, its second 1.
        "uneven-tree": TreeDecoder(
            target, ModelDrafter(draft_model), tree=UNEVEN_TREE, verifier="optimal", sampling=SAMPLING
        ),
    }


def test_one_cpu_row_verified_in_numpy_takes_the_torch_paths_decisions():
    """A single CPU row runs the step in numpy (:func:`verify_optimal` without ``tables``); the batched torch
    path (``tables`` given) is its oracle: the same token for every seed and the generator left in the same
    state, on random pairs (float32 and float64 targets, leading shape () and (1,), n = 1-5), rejections
    included (the residual is drawn in both)."""
    rng = np.random.default_rng(0)
    rejected = 0
    for trial in range(120):
        vocab, n = int(rng.integers(2, 30)), int(rng.integers(1, 6))
        p = torch.tensor(rng.dirichlet(np.full(vocab, 0.5)), dtype=(torch.float32, torch.float64)[trial % 2])
        q = torch.tensor(rng.dirichlet(np.full(vocab, 0.5)))
        drafts = torch.multinomial(q, n, replacement=True, generator=torch.Generator().manual_seed(trial))
        shape = (1,) if trial % 3 == 0 else ()
        p, q, drafts = p.reshape(*shape, vocab), q.reshape(*shape, vocab), drafts.reshape(*shape, n)
        tables = build_tables(p, q, n)
        for seed in range(10):
            host, batched = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            token = verify_optimal(p, q, drafts, host)
            expected = verify_optimal(p, q, drafts, batched, tables=tables)
            assert token.shape == expected.shape and torch.equal(token, expected), (trial, seed)
            assert torch.equal(torch.rand(2, generator=host), torch.rand(2, generator=batched))
            rejected += int(token.item() not in drafts.reshape(-1).tolist())
    assert rejected > 50  # the residual draw was compared too


UNEVEN_TREE = [-1, 0, 0, 0, 1, 1, 2]


def test_every_tree_node_builds_its_verifier_for_its_own_children(models, monkeypatch):
    """Per node, the build sees ``n`` = that node's number of children (3 at the root, 2 or 1 below)."""
    target, draft_model = models
    calls = []

    def recording(p, q, n):
        calls.append(n)
        return build_tables(p, q, n)

    monkeypatch.setattr(optimal_verification, "build_tables", recording)
    decoder = decoders(target, draft_model)["uneven-tree"]
    generator = torch.Generator().manual_seed(5)
    for _ in range(30):
        calls.clear()
        decoder.generate(PROMPT, 1, generator=generator)
        # The walk verifies the root (3 children), then possibly node 1 (2) or node 2 (1), never node 3.
        assert calls[0] == 3 and calls[1:] in ([], [2], [1]), calls


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["multidraft", "tree", "uneven-tree"])
def test_decoders_with_the_optimal_verifier_reproduce_the_exact_target_law(models, kind):
    target, draft_model = models
    law = exact_law(target, SAMPLING)
    assert outcome_p_value(sample_outcomes(decoders(target, draft_model)[kind], seed=21), law) > P_THRESHOLD


def wrong_marginal_tables(p: torch.Tensor, q: torch.Tensor, n: int):
    """Tables that run the single-draft step against q instead of the race's marginal r (a plausible bug)."""
    tables = build_tables(p, q, n)
    excess = (p - q).clamp_min(0.0)
    total = excess.sum(dim=-1, keepdim=True)
    tables["marginal"] = q.to(torch.float64)
    tables["residual"] = torch.where(total > 0, excess / torch.where(total > 0, total, 1.0), p)
    return tables


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["multidraft", "uneven-tree"])
def test_the_law_test_rejects_decoding_with_a_wrong_marginal(models, monkeypatch, kind):
    target, draft_model = models
    monkeypatch.setattr(optimal_verification, "build_tables", wrong_marginal_tables)
    law = exact_law(target, SAMPLING)
    # 600 samples: p = 1e-9 (multidraft) and 4e-9 (uneven tree) on 2026-11-28, against 3.5e-7 and 9.4e-7 at 400.
    outcomes = sample_outcomes(decoders(target, draft_model)[kind], seed=22, count=600)
    assert outcome_p_value(outcomes, law) < P_THRESHOLD


def test_greedy_decoding_with_the_optimal_verifier_equals_autoregressive_argmax(models):
    target, draft_model = models
    greedy = Sampling(temperature=0.0)
    generator = torch.Generator().manual_seed(0)
    expected = (
        AutoregressiveDecoder(target, sampling=greedy).generate(PROMPT, 12, generator=generator).token_ids
    )
    for decoder in (
        MultiDraftDecoder(target, ModelDrafter(draft_model), n=3, verifier="optimal", sampling=greedy),
        TreeDecoder(
            target, ModelDrafter(draft_model), tree=[-1, 0, 0, 1, 1], verifier="optimal", sampling=greedy
        ),
    ):
        assert decoder.generate(PROMPT, 12, generator=generator).token_ids == expected
