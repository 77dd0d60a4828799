"""Tests of executor.verification's chain kernels (speculative sampling and argmax walks) against exact laws.

The chain verifier's joint law over (accepted drafts, next token) is compared with an exact enumeration
written here (chi-square, p > 1e-3 for the kernel, p < 1e-6 for the negative controls; fixed seeds).
"""

import functools
import itertools

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

import executor.verification as verification
from executor.sampling import logits_to_probs, sample_drafts
from executor.verification import (
    verify_chain,
    verify_chain_argmax,
    verify_tree_argmax,
)
from tests.goodness_of_fit import law_p_value, z_score
from theory import expected_tokens

ACCEPT_P_VALUE = 1e-3
CONTROL_P_VALUE = 1e-6
MAX_ABS_Z = 4.0
SAMPLES = 30_000  # chains per test: ~0.6% resolution on acceptance


# --------------------------------------------------------------------------------------------------------
# Chains

CHAIN_TARGET = np.array(
    [[0.5, 0.2, 0.3, 0.0], [0.1, 0.1, 0.4, 0.4], [0.25, 0.25, 0.25, 0.25], [0.0, 0.6, 0.0, 0.4]]
)
CHAIN_DRAFT = np.array([[0.3, 0.5, 0.0, 0.2], [0.1, 0.1, 0.4, 0.4], [0.7, 0.1, 0.1, 0.1]])


def chain_sequence_law(p: np.ndarray, q: np.ndarray) -> dict[tuple[int, ...], float]:
    """Exact law of the committed sequence (accepted drafts, then the next token), by enumeration.

    Position ``i`` accepts its draft ``x`` with joint probability ``q_i(x) min(1, p_i(x)/q_i(x)) =
    min(p_i(x), q_i(x))``; a rejection at ``k`` (probability ``1 - sum min(p_k, q_k)``) is followed by
    ``norm((p_k - q_k)_+)``, and full acceptance by the bonus ``p_gamma``.
    """
    gamma, vocab = q.shape
    law: dict[tuple[int, ...], float] = {}
    for k in range(gamma + 1):
        for prefix in itertools.product(range(vocab), repeat=k):
            mass = np.prod([min(p[i, x], q[i, x]) for i, x in enumerate(prefix)])
            if k < gamma:
                excess = np.maximum(p[k] - q[k], 0.0)
                rejection = 1.0 - np.minimum(p[k], q[k]).sum()
                after = rejection * (excess / excess.sum() if excess.sum() > 0 else p[k])
            else:
                after = p[gamma]
            for y in range(vocab):
                law[(*prefix, y)] = mass * after[y]
    return law


def sample_chains(p, q, seed=0, count=SAMPLES):
    generator = torch.Generator().manual_seed(seed)
    target = torch.tensor(p).expand(count, -1, -1)
    draft = torch.tensor(q).expand(count, -1, -1)
    drafts = torch.stack(
        [sample_drafts(draft[:, i], 1, "iid", generator)[:, 0] for i in range(q.shape[0])], 1
    )
    n_accepted, token = verify_chain(target, draft, drafts, generator)
    return drafts.numpy(), n_accepted.numpy(), token.numpy()


def chain_p_value(p, q, drafts, n_accepted, token) -> float:
    law = chain_sequence_law(p, q)
    keys = list(law)
    position = {key: i for i, key in enumerate(keys)}
    observed = np.zeros(len(keys))
    for row, k, y in zip(drafts.tolist(), n_accepted.tolist(), token.tolist(), strict=True):
        observed[position[(*row[:k], y)]] += 1
    return law_p_value(observed, np.array([law[key] for key in keys]))


@functools.cache
def chain_run():
    return sample_chains(CHAIN_TARGET, CHAIN_DRAFT)


def test_verify_chain_committed_sequence_law_matches_exact_enumeration():
    assert abs(sum(chain_sequence_law(CHAIN_TARGET, CHAIN_DRAFT).values()) - 1) < 1e-12
    assert chain_p_value(CHAIN_TARGET, CHAIN_DRAFT, *chain_run()) > ACCEPT_P_VALUE


def test_verify_chain_first_committed_token_follows_the_target():
    drafts, n_accepted, token = chain_run()
    first = np.where(n_accepted > 0, drafts[:, 0], token)
    assert law_p_value(np.bincount(first, minlength=4), CHAIN_TARGET[0]) > ACCEPT_P_VALUE


def test_verify_chain_tokens_per_step_match_theory_expected_tokens():
    _, n_accepted, _ = chain_run()
    rates = np.minimum(CHAIN_TARGET[:-1], CHAIN_DRAFT).sum(axis=1)
    exact = expected_tokens(rates, 3)
    tokens = n_accepted + 1.0
    assert abs(z_score(tokens, exact)) < MAX_ABS_Z


def test_negative_control_chain_ratio_q_over_p_is_caught(monkeypatch):
    monkeypatch.setattr(
        verification, "_accepts", lambda u, numerator, denominator: u * numerator < denominator
    )
    assert (
        chain_p_value(CHAIN_TARGET, CHAIN_DRAFT, *sample_chains(CHAIN_TARGET, CHAIN_DRAFT)) < CONTROL_P_VALUE
    )


def test_negative_control_chain_residual_from_the_target_is_caught(monkeypatch):
    monkeypatch.setattr(verification, "_residual", lambda p, q: p)
    assert (
        chain_p_value(CHAIN_TARGET, CHAIN_DRAFT, *sample_chains(CHAIN_TARGET, CHAIN_DRAFT)) < CONTROL_P_VALUE
    )


def test_verify_chain_accepts_everything_when_target_equals_draft():
    p = torch.tensor(CHAIN_DRAFT).expand(200, -1, -1)
    generator = torch.Generator().manual_seed(3)
    drafts = torch.stack([sample_drafts(p[:, i], 1, "iid", generator)[:, 0] for i in range(3)], 1)
    target = torch.cat([p, torch.tensor(CHAIN_TARGET[-1:]).expand(200, -1, -1)], dim=1)
    n_accepted, token = verify_chain(target, p, drafts, generator)
    assert bool((n_accepted == 3).all())
    assert bool((torch.tensor(CHAIN_TARGET[-1])[token] > 0).all())


def test_verify_chain_with_no_drafts_samples_the_target():
    generator = torch.Generator().manual_seed(0)
    target = torch.tensor(CHAIN_TARGET[:1]).expand(20_000, -1, -1)
    n_accepted, token = verify_chain(
        target,
        torch.empty(20_000, 0, 4, dtype=torch.float64),
        torch.empty(20_000, 0, dtype=torch.int64),
        generator,
    )
    assert bool((n_accepted == 0).all())
    assert law_p_value(np.bincount(token.numpy(), minlength=4), CHAIN_TARGET[0]) > ACCEPT_P_VALUE


LOGITS = st.lists(st.integers(-3, 3), min_size=3, max_size=3)  # small integers: argmax ties do occur


@given(
    st.integers(0, 4).flatmap(
        lambda gamma: st.tuples(
            st.lists(LOGITS, min_size=gamma + 1, max_size=gamma + 1),
            st.lists(st.integers(0, 2), min_size=gamma, max_size=gamma),
        )
    )
)
def test_verify_chain_argmax_accepts_the_longest_prefix_of_target_argmaxes(data):
    logits, drafts = data
    target = torch.tensor(logits, dtype=torch.float32)
    n_accepted, token = verify_chain_argmax(target, torch.tensor(drafts, dtype=torch.int64))
    expected = 0
    while expected < len(drafts) and drafts[expected] == int(np.argmax(logits[expected])):
        expected += 1
    assert int(n_accepted) == expected
    assert int(token) == int(np.argmax(logits[expected]))  # numpy's argmax also takes the first maximum


@given(
    st.integers(0, 4).flatmap(
        lambda gamma: st.tuples(
            st.lists(LOGITS, min_size=gamma + 1, max_size=gamma + 1),
            st.lists(LOGITS, min_size=gamma, max_size=gamma),
        )
    ),
    st.integers(0, 2**16),
)
def test_sampling_at_temperature_zero_equals_argmax_verification(data, seed):
    target_logits, draft_logits = (torch.tensor(v, dtype=torch.float32).reshape(-1, 3) for v in data)
    target = logits_to_probs(target_logits, temperature=0.0)
    draft = logits_to_probs(draft_logits, temperature=0.0)
    generator = torch.Generator().manual_seed(seed)
    drafts = draft.argmax(dim=-1)  # the temperature-0 drafter
    assert tuple(verify_chain(target, draft, drafts, generator)) == tuple(
        verify_chain_argmax(target_logits, drafts)
    )


@st.composite
def trees(draw):
    size = draw(st.integers(1, 9))
    parents = [-1] + [draw(st.integers(0, node - 1)) for node in range(1, size)]
    tokens = draw(st.lists(st.integers(0, 2), min_size=size, max_size=size))
    logits = draw(st.lists(LOGITS, min_size=size, max_size=size))
    return parents, tokens, logits


@given(trees())
def test_verify_tree_argmax_follows_the_greedy_path(tree):
    parents, tokens, logits = tree
    path, token = verify_tree_argmax(torch.tensor(logits, dtype=torch.float32), parents, torch.tensor(tokens))
    # Brute force: the path is the longest chain of nodes whose tokens are the argmax after their parent,
    # choosing the first such child at each node.
    node, expected = 0, []
    while True:
        best = int(np.argmax(logits[node]))
        children = [
            child for child in range(1, len(parents)) if parents[child] == node and tokens[child] == best
        ]
        if not children:
            break
        node = children[0]
        expected.append(node)
    assert path.tolist() == expected
    assert int(token) == int(np.argmax(logits[node]))
