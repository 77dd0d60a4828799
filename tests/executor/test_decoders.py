"""Decoders: exact output laws on tiny models, KV-cache rollback, bad input, greedy equality on SmolLM2."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from executor import verification
from executor.decoders import (
    AutoregressiveDecoder,
    ChainDecoder,
    ConfidenceStop,
    DraftTree,
    DynamicTree,
    MultiDraftDecoder,
    PrefillCache,
    Sampling,
    TreeDecoder,
    run_tree,
)
from executor.decoders import chain as chain_module
from executor.decoders import tree as tree_module
from executor.decoders.base import commit_path
from executor.drafters import EarlyExitDrafter, ModelDrafter, PromptLookupDrafter
from tests.goodness_of_fit import law_p_value

VOCAB = 8
HORIZON = 3  # the exact law is over the next 3 tokens: VOCAB**3 = 512 outcomes
PROMPT = [1, 2, 3, 1, 2]  # "1 2" repeats, so prompt lookup has something to propose
# 400 outcomes per law test. With the first-token and first-two-token laws tested beside the joint one
# (outcome_p_value), every negative control of this file, test_methods.py and test_methods_specdecpp.py is
# rejected at 400 with p <= 2e-9 (the joint test alone: p up to 0.2 at 400 and 7.5e-4 at 800).
SAMPLES = 400
P_THRESHOLD = 1e-3


def flat_tiny_model(tiny_model, seed: int):
    """A tiny model whose next-token laws are spread out (final-norm gain scaled down)."""
    model = tiny_model(seed, vocab_size=VOCAB, max_seq_len=32)
    with torch.no_grad():
        model.norm.weight.mul_(0.12)
    return model


def oracle_probs(logits: torch.Tensor, sampling: Sampling) -> np.ndarray:
    """Temperature, then top-k, then top-p (Hugging Face's order), re-derived in float64."""
    scores = logits.double().numpy() / sampling.temperature
    if sampling.top_k is not None:
        scores = np.where(scores < np.sort(scores)[::-1][sampling.top_k - 1], -np.inf, scores)
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    if sampling.top_p is not None:
        order = np.argsort(probs, kind="stable")
        drop = np.cumsum(probs[order]) <= 1 - sampling.top_p
        drop[-1] = False
        probs[order[drop]] = 0.0
        probs /= probs.sum()
    return probs


def exact_law(model, sampling: Sampling, prompt=PROMPT, horizon=HORIZON) -> np.ndarray:
    """P(next `horizon` tokens) by enumeration, each factor from a fresh forward pass."""
    next_token = {}
    with torch.no_grad():
        for depth in range(horizon):
            for continuation in itertools.product(range(VOCAB), repeat=depth):
                tokens = prompt + list(continuation)
                model.setup_cache(len(tokens))
                logits = model(torch.tensor([tokens]), torch.arange(len(tokens)))[0, -1]
                next_token[continuation] = oracle_probs(logits, sampling)
    law = np.zeros((VOCAB,) * horizon)
    for continuation in itertools.product(range(VOCAB), repeat=horizon):
        law[continuation] = np.prod([next_token[continuation[:d]][x] for d, x in enumerate(continuation)])
    return law.ravel()


def outcome_p_value(samples: list[tuple[int, ...]], law: np.ndarray) -> float:
    """Goodness of fit of the observed outcomes against the joint ``law`` of the next ``HORIZON`` tokens.

    Three tests (:func:`tests.goodness_of_fit.law_p_value`): the law of the first token (8 cells), of the first
    two (64) and of all three (512); the smallest p-value times three (Bonferroni, valid whatever their
    dependence). A broken verifier distorts the law of the first tokens already, and on 8 or 64 cells that
    shows with far fewer samples than on 512 (most of them pooled at a few hundred samples); the joint test
    keeps what only the later tokens show.
    """
    shape = (VOCAB,) * HORIZON
    counts = np.zeros(shape)
    for outcome in samples:
        counts[outcome] += 1
    law = law.reshape(shape)
    p_values = []
    for length in range(1, HORIZON + 1):
        later = tuple(range(length, HORIZON))
        p_values.append(law_p_value(counts.sum(axis=later).ravel(), law.sum(axis=later).ravel()))
    return min(1.0, HORIZON * min(p_values))


def sample_outcomes(decoder, seed: int, count: int = SAMPLES) -> list[tuple[int, ...]]:
    generator = torch.Generator().manual_seed(seed)
    return [tuple(decoder.generate(PROMPT, HORIZON, generator=generator).token_ids) for _ in range(count)]


SAMPLING = Sampling(temperature=1.0)


def make_decoder(kind: str, target, draft_model):
    early_exit = EarlyExitDrafter(target, 1)
    if kind == "chain-early-exit":
        return ChainDecoder(target, early_exit, gamma=2, sampling=SAMPLING)
    if kind == "chain-model":
        return ChainDecoder(target, ModelDrafter(draft_model), gamma=3, sampling=SAMPLING)
    if kind == "chain-ngram":
        return ChainDecoder(target, PromptLookupDrafter(), gamma=2, sampling=SAMPLING)
    if kind == "chain-topk-topp":
        sampling = Sampling(temperature=0.8, top_k=5, top_p=0.9)
        return ChainDecoder(target, ModelDrafter(draft_model), gamma=2, sampling=sampling)
    if kind.startswith("multidraft-"):
        verifier = kind.removeprefix("multidraft-")
        n = 2 if verifier == "spechub" else 3
        return MultiDraftDecoder(target, ModelDrafter(draft_model), n=n, verifier=verifier, sampling=SAMPLING)
    if kind == "tree-static":
        return TreeDecoder(target, ModelDrafter(draft_model), tree=[-1, 0, 0, 1, 1, 2], sampling=SAMPLING)
    if kind == "tree-dynamic":
        return TreeDecoder(
            target, early_exit, tree=DynamicTree(budget=6, max_depth=3, branching=2), sampling=SAMPLING
        )
    raise AssertionError(kind)


DECODER_KINDS = [
    "chain-early-exit",
    "chain-model",
    "chain-ngram",
    "chain-topk-topp",
    "multidraft-rrs",
    "multidraft-rrs_wor",
    "multidraft-kseq",
    "multidraft-spechub",
    "multidraft-greedy",
    "tree-static",
    "tree-dynamic",
]


@pytest.fixture(scope="module")
def models(tiny_model):
    return flat_tiny_model(tiny_model, 3), flat_tiny_model(tiny_model, 4)


@pytest.mark.slow
@pytest.mark.parametrize("kind", DECODER_KINDS)
def test_speculative_decoder_reproduces_the_exact_target_law_of_the_next_three_tokens(models, kind):
    target, draft_model = models
    decoder = make_decoder(kind, target, draft_model)
    law = exact_law(target, decoder.sampling)
    # The draft must actually differ from the target, or the test could not see a broken verifier.
    assert np.max(law) < 0.5
    p_value = outcome_p_value(sample_outcomes(decoder, seed=11), law)
    assert p_value > P_THRESHOLD, f"{kind}: G-test p = {p_value:.2e}"


@pytest.mark.slow
def test_autoregressive_sampling_reproduces_the_exact_target_law(models):
    target, _ = models
    decoder = AutoregressiveDecoder(target, sampling=SAMPLING)
    assert outcome_p_value(sample_outcomes(decoder, seed=5), exact_law(target, SAMPLING)) > P_THRESHOLD


def _residual_from_target(target_probs, draft_probs, drafts, generator):
    """A classic bug: after a rejection, resample from p instead of norm((p - q)+)."""
    gamma = drafts.shape[-1]
    p = target_probs.double()
    q = draft_probs.double()
    u = torch.rand(gamma, dtype=torch.float64, generator=generator)
    accepted = u * q[torch.arange(gamma), drafts] < p[torch.arange(gamma), drafts]
    n = int(accepted.long().cumprod(0).sum())
    return torch.tensor(n), torch.multinomial(p[n], 1, generator=generator)[0]


def _target_instead_of_residual(name, target_probs, draft_probs, drafts, generator):
    """The same bug in a tree: when every child is rejected, draw from p instead of the residual."""
    index, token = verification.verify_multidraft(name, target_probs, draft_probs, drafts, generator)
    if int(index) < 0:
        token = torch.multinomial(target_probs.double(), 1, generator=generator)[0]
    return index, token


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "module", "name", "broken"),
    [
        ("chain-model", chain_module, "verify_chain", _residual_from_target),
        ("tree-static", tree_module, "verify_multidraft_unchecked", _target_instead_of_residual),
    ],
)
def test_law_test_rejects_a_deliberately_broken_verifier(models, monkeypatch, kind, module, name, broken):
    """Negative control: the same samples, seeds and threshold catch a broken verifier."""
    target, draft_model = models
    decoder = make_decoder(kind, target, draft_model)
    law = exact_law(target, decoder.sampling)
    monkeypatch.setattr(module, name, broken)
    p_value = outcome_p_value(sample_outcomes(decoder, seed=11), law)
    assert p_value < P_THRESHOLD, f"the broken {name} went unnoticed: p = {p_value:.2e}"


# --------------------------------------------------------------------------------------------------------
# KV-cache rollback


def cache_of(model, slots: int) -> list[torch.Tensor]:
    return [
        torch.cat([layer.attention.kv_cache.k[:, :, :slots], layer.attention.kv_cache.v[:, :, :slots]])
        for layer in model.layers
    ]


def fresh_prefill_cache(model, tokens: list[int]) -> list[torch.Tensor]:
    model.setup_cache(len(tokens))
    with torch.no_grad():
        model(torch.tensor([tokens]), torch.arange(len(tokens)))
    return cache_of(model, len(tokens))


def assert_same_cache(actual, expected):
    for layer, (a, e) in enumerate(zip(actual, expected, strict=True)):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4, msg=f"layer {layer}")


@st.composite
def trees_with_a_path(draw):
    size = draw(st.integers(1, 9))
    parents = [-1] + [draw(st.integers(0, node - 1)) for node in range(1, size)]
    tokens = draw(st.lists(st.integers(0, VOCAB - 1), min_size=size, max_size=size))
    node = draw(st.integers(0, size - 1))
    path = [node]
    while parents[path[-1]] != -1:
        path.append(parents[path[-1]])
    return parents, tokens, path[::-1]


@given(
    prefix=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6),
    case=trees_with_a_path(),
)
def test_cache_after_tree_verification_and_commit_equals_a_fresh_prefill_of_the_accepted_text(
    tiny_model, prefix, case
):
    parents, tokens, path = case
    model = tiny_model(7, vocab_size=VOCAB, max_seq_len=32)
    tree = DraftTree(tokens[0])
    for node in range(1, len(parents)):
        tree.add_child(parents[node], tokens[node])
    model.setup_cache(32)
    with torch.no_grad():
        model(torch.tensor([prefix]), torch.arange(len(prefix)))
        run_tree(model, tree, list(range(len(tree))), len(prefix))
    commit_path(model, len(prefix), path)
    accepted_text = prefix + [tokens[v] for v in path]
    actual = cache_of(model, len(accepted_text))
    assert_same_cache(actual, fresh_prefill_cache(model, accepted_text))


@given(
    seed=st.integers(0, 2**16),
    shape=st.sampled_from([[-1, 0, 1, 2], [-1, 0, 0, 1, 1, 2], [-1, 0, 0, 0], [-1, 0, 1, 1, 2, 0]]),
    temperature=st.sampled_from([0.0, 1.0]),
)
def test_decoder_caches_after_random_accept_reject_patterns_equal_a_fresh_prefill(
    tiny_model, seed, shape, temperature
):
    target = flat_tiny_model(tiny_model, 3)
    draft_model = flat_tiny_model(tiny_model, 4)
    drafter = ModelDrafter(draft_model)
    decoder = TreeDecoder(target, drafter, tree=shape, sampling=Sampling(temperature=temperature))
    result = decoder.generate(PROMPT, 8, generator=torch.Generator().manual_seed(seed))
    # Everything the steps committed (the last step may run past max_new_tokens); the target's cache holds
    # all of it but the last token, the drafter's cache its first ``drafter.length`` tokens.
    text = PROMPT + [token for step in result.steps for token in step.emitted]
    assert text[: len(PROMPT) + len(result.token_ids)] == PROMPT + result.token_ids
    target_cache = cache_of(target, len(text) - 1)
    draft_cache = cache_of(draft_model, drafter.length)
    assert_same_cache(target_cache, fresh_prefill_cache(target, text[:-1]))
    assert_same_cache(draft_cache, fresh_prefill_cache(draft_model, text[: drafter.length]))


# --------------------------------------------------------------------------------------------------------
# Greedy: every decoder equals autoregressive decoding token for token


def greedy_decoders(target, draft_model):
    return {
        "chain-early-exit": ChainDecoder(target, EarlyExitDrafter(target, 1), gamma=3),
        "chain-model": ChainDecoder(target, ModelDrafter(draft_model), gamma=4),
        "chain-ngram": ChainDecoder(target, PromptLookupDrafter(), gamma=4),
        "chain-confidence-stop": ChainDecoder(
            target, EarlyExitDrafter(target, 1), gamma=4, stop_rule=ConfidenceStop(0.5)
        ),
        "multidraft": MultiDraftDecoder(target, ModelDrafter(draft_model), n=3),
        "tree-static": TreeDecoder(target, ModelDrafter(draft_model), tree=[-1, 0, 0, 1, 1, 2, 3]),
        "tree-dynamic": TreeDecoder(target, EarlyExitDrafter(target, 1), tree=DynamicTree(10, 4, 3)),
    }


def test_every_greedy_decoder_equals_autoregressive_greedy_on_a_tiny_model(tiny_model):
    target = tiny_model(21, vocab_size=16, max_seq_len=128)
    draft_model = tiny_model(22, vocab_size=16, max_seq_len=128)
    for prompt in ([5], [1, 2, 3, 4], [7, 7, 1, 9, 7, 7]):
        reference = AutoregressiveDecoder(target).generate(prompt, 40).token_ids
        for name, decoder in greedy_decoders(target, draft_model).items():
            assert decoder.generate(prompt, 40).token_ids == reference, name


# --------------------------------------------------------------------------------------------------------
# Prefill cache


def prefill_decoders(target, draft_model) -> dict:
    """Greedy decoders, sampled ones, and chains with the feature head (which reads the prompt's hidden states)."""
    from tests.executor.test_drafters_feature import drafter_for

    sampled = Sampling(temperature=1.0)
    return {
        **greedy_decoders(target, draft_model),
        "ar-t1": AutoregressiveDecoder(target, sampling=sampled),
        "multidraft-t1": MultiDraftDecoder(target, ModelDrafter(draft_model), n=3, sampling=sampled),
        "tree-t1": TreeDecoder(target, EarlyExitDrafter(target, 1), tree=[-1, 0, 0, 1], sampling=sampled),
        "feature": ChainDecoder(target, drafter_for(target), gamma=3),
        "feature-t1": ChainDecoder(target, drafter_for(target), gamma=3, sampling=sampled),
    }


def generation_trace(decoder, prompt, cache=None) -> tuple:
    result = decoder.generate(prompt, 24, generator=torch.Generator().manual_seed(7), prefill_cache=cache)
    return result.token_ids, [(step.tokens, step.n_accepted) for step in result.steps]


def test_a_prefill_copied_from_the_cache_reproduces_every_decoder_step_for_step(tiny_model):
    target = tiny_model(21, vocab_size=16, max_seq_len=128)
    decoders = prefill_decoders(target, tiny_model(22, vocab_size=16, max_seq_len=128))
    cache = PrefillCache(target)
    prompts = ([1, 2, 3, 4], [7, 7, 1, 9, 7, 7], [5])
    for name, decoder in decoders.items():
        for prompt in prompts:
            # The first use keeps the prefill (the first decoder's), every later one copies it.
            reference = generation_trace(decoder, prompt)
            assert generation_trace(decoder, prompt, cache) == reference, (name, prompt)
            assert generation_trace(decoder, prompt, cache) == reference, (name, prompt)
    assert len(cache) == 2  # a one-token prompt has nothing to prefill


def test_the_cache_is_what_a_generation_reads(tiny_model):
    """Negative controls: values replaced in the cache change the sampled tokens (same seed); hidden states
    moved there change what the feature head drafts but not the greedy tokens."""
    target = tiny_model(21, vocab_size=16, max_seq_len=128)
    decoders = prefill_decoders(target, tiny_model(22, vocab_size=16, max_seq_len=128))
    prompt = [7, 7, 1, 9, 7, 7]
    cache = PrefillCache(target)
    sampled, feature = decoders["ar-t1"], decoders["feature"]  # this tiny model's greedy text repeats a token
    tokens, _ = generation_trace(sampled, prompt, cache)
    feature_tokens, steps = generation_trace(feature, prompt, cache)
    (entry,) = cache._entries.values()
    with torch.no_grad():
        entry.hidden.mul_(-1.0)
    moved_tokens, moved_steps = generation_trace(feature, prompt, cache)
    assert moved_tokens == feature_tokens and moved_steps != steps
    with torch.no_grad():
        for _, values in entry.keys_values:
            values.copy_(torch.randn(values.shape, generator=torch.Generator().manual_seed(0)))
    assert generation_trace(sampled, prompt, cache)[0] != tokens


def test_a_prefill_cache_of_another_model_is_refused(tiny_model):
    target, other = (
        tiny_model(0, vocab_size=VOCAB, max_seq_len=32),
        tiny_model(1, vocab_size=VOCAB, max_seq_len=32),
    )
    with pytest.raises(ValueError, match="prefill_cache holds the prefills of another model"):
        AutoregressiveDecoder(target).generate([1, 2, 3], 2, prefill_cache=PrefillCache(other))


# --------------------------------------------------------------------------------------------------------
# Bad input


def test_bad_input_gets_a_value_error_naming_the_problem(tiny_model):
    target = tiny_model(0, vocab_size=VOCAB, max_seq_len=32)
    decoder = ChainDecoder(target, EarlyExitDrafter(target, 1), gamma=2)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        decoder.generate([], 4)
    with pytest.raises(ValueError, match="longer than the model's context"):
        decoder.generate([1] * 33, 1)
    with pytest.raises(ValueError, match="context is 32"):
        decoder.generate([1] * 20, 20)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 0"):
        decoder.generate([1, 2], -1)
    with pytest.raises(ValueError, match=r"prompt_ids must hold token ids in \[0, 8\)"):
        decoder.generate([1, 99], 2)
    with pytest.raises(ValueError, match="verifier must be one of"):
        MultiDraftDecoder(target, EarlyExitDrafter(target, 1), verifier="nope")
    with pytest.raises(ValueError, match="n must be 2 for verifier 'spechub'"):
        MultiDraftDecoder(target, EarlyExitDrafter(target, 1), n=3, verifier="spechub")
    with pytest.raises(ValueError, match="gamma must be at least 1"):
        ChainDecoder(target, EarlyExitDrafter(target, 1), gamma=0)
    with pytest.raises(ValueError, match="exit_layer must be below"):
        EarlyExitDrafter(target, 2)
    with pytest.raises(ValueError, match="vocabulary of 16 tokens but the target has 8"):
        ChainDecoder(target, ModelDrafter(tiny_model(1, vocab_size=16)))
    with pytest.raises(ValueError, match="temperature must be"):
        Sampling(temperature=-1.0)
    with pytest.raises(ValueError, match="every node's parent must come before it"):
        TreeDecoder(target, EarlyExitDrafter(target, 1), tree=[-1, 2, 0])
    with pytest.raises(ValueError, match="log_distributions must be"):
        AutoregressiveDecoder(target, log_distributions="top5")
    assert decoder.generate([1, 2], 0).token_ids == []


def test_generation_stops_after_the_eos_token(tiny_model):
    target = tiny_model(21, vocab_size=16, max_seq_len=128)
    reference = AutoregressiveDecoder(target).generate([1, 2, 3], 30).token_ids
    eos = reference[4]
    first = reference.index(eos)
    for decoder in greedy_decoders(target, tiny_model(22, vocab_size=16, max_seq_len=128)).values():
        assert decoder.generate([1, 2, 3], 30, eos_id=eos).token_ids == reference[: first + 1]


# --------------------------------------------------------------------------------------------------------
# Greedy equality on the embedded SmolLM2-135M and 8 HumanEval prompts

HUMANEVAL_PROMPTS = 2  # 2 prompts x 48 tokens per decoder: the slowest tests of the suite, cut to fit CI
NEW_TOKENS = 48
NEAR_TIE = 1e-4


def truncated_copy(model, n_layers: int):
    """A separate draft model: the first ``n_layers`` layers of ``model`` in their own Transformer."""
    from dataclasses import replace

    from executor.model import Transformer

    config = replace(model.config, n_layers=n_layers)
    with torch.device("meta"):
        draft = Transformer(config)
    state = {
        k: v.clone()
        for k, v in model.state_dict().items()
        if not k.startswith("layers.") or int(k.split(".")[1]) < n_layers
    }
    draft.load_state_dict(state, assign=True)
    return draft.requires_grad_(False).eval()


def greedy_deviations(model, prompt: list[int], output: list[int]) -> list[tuple[int, float]]:
    """Positions where ``output`` is not the target's argmax given its own prefix, with the top-two gap.

    One teacher-forced forward pass scores every prefix of ``prompt + output`` at once. Autoregressive greedy
    decoding emits exactly these argmaxes, so a decoder whose tokens are all argmaxes of their prefixes
    equals it token for token; a deviation is allowed only where the emitted token is the runner-up of a
    near-tie (float rounding in a different computation order can flip those).
    """
    tokens = prompt + output
    model.setup_cache(len(tokens))
    with torch.no_grad():
        logits = model(torch.tensor([tokens[:-1]]), torch.arange(len(tokens) - 1))[0, len(prompt) - 1 :]
    top = torch.topk(logits, 2, dim=-1)
    deviations = []
    for index, token in enumerate(output):
        if token != int(top.indices[index, 0]):
            assert token == int(top.indices[index, 1]), f"token {index} is not even the runner-up"
            deviations.append((index, float(top.values[index, 0] - top.values[index, 1])))
    return deviations


# The autoregressive decoder is the reference itself (its incremental logits are checked against full forward
# passes in test_model.py), so only the speculative decoders are run here, and with small trees, to fit CI.
GREEDY_DECODERS = {
    "chain-ngram": lambda model: ChainDecoder(model, PromptLookupDrafter(), gamma=4),
    "chain-early-exit": lambda model: ChainDecoder(model, EarlyExitDrafter(model, 4), gamma=2),
    "multidraft-model": lambda model: MultiDraftDecoder(model, ModelDrafter(truncated_copy(model, 4)), n=2),
    "tree-dynamic": lambda model: TreeDecoder(model, EarlyExitDrafter(model, 4), tree=DynamicTree(5, 2, 2)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", GREEDY_DECODERS)
def test_every_decoder_equals_autoregressive_greedy_on_humaneval_with_smollm(smollm, name):
    # One decoder per test so that pytest-xdist spreads them over the workers.
    from experiments.prompts import humaneval_prompts

    model, tokenizer = smollm
    decoder = GREEDY_DECODERS[name](model)
    for text in humaneval_prompts(HUMANEVAL_PROMPTS):
        prompt = tokenizer.encode(text)
        output = decoder.generate(prompt, NEW_TOKENS).token_ids
        assert len(output) == NEW_TOKENS
        for index, gap in greedy_deviations(model, prompt, output):
            assert gap < NEAR_TIE, (
                f"{name} leaves greedy decoding at token {index}, top-two logit gap {gap:.2e}"
            )


@pytest.mark.slow
def test_greedy_deviation_check_catches_a_decoder_that_is_not_greedy(smollm):
    # Negative control: sampled tokens are not argmaxes, and the check must say so.
    from experiments.prompts import humaneval_prompts

    model, tokenizer = smollm
    prompt = tokenizer.encode(humaneval_prompts(1)[0])
    sampled = AutoregressiveDecoder(model, sampling=Sampling(temperature=1.5)).generate(
        prompt, 16, generator=torch.Generator().manual_seed(0)
    )
    with pytest.raises(AssertionError):
        for _, gap in greedy_deviations(model, prompt, sampled.token_ids):
            assert gap < NEAR_TIE


@given(tree_parents=st.lists(st.integers(0, 20), min_size=0, max_size=12), prefix=st.integers(0, 5))
def test_draft_tree_mask_equals_the_theory_tree_mask_behind_the_prefix(tree_parents, prefix):
    # The executor grows trees node by node; its mask must be theory.Tree's (self and ancestors) after a fully
    # visible committed prefix.
    from theory import Tree

    parents = [-1] + [min(parent, node) for node, parent in enumerate(tree_parents)]
    draft = DraftTree(root_token=0)
    for parent in parents[1:]:
        draft.add_child(parent, token=1)
    nodes = list(range(len(parents)))
    mask = draft.attention_mask(nodes, prefix).numpy()
    assert mask[:, :prefix].all()
    np.testing.assert_array_equal(mask[:, prefix:], Tree(parents).attention_mask())
