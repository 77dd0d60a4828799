"""Tests of executor.verification: every torch verifier against its theory twin's exact laws.

For each multi-draft verifier and a few small (p, q, n) cases (zeros, disjoint supports, p == q), drafts are
drawn with executor.sampling.sample_drafts and verified in one batched call; then

* the joint law of (draft tuple, output token) is compared with P(x) * theory.verifier(name).conditional by a
  chi-square test (the strongest check: it pins the algorithm, not only its marginal);
* the output histogram is compared with theory's output_distribution (= p: all are lossless);
* the empirical acceptance (output in drafts) is compared with theory's exact acceptance by a z-test.

The chain kernels are tested in test_verification_chain.py. Thresholds: a correct kernel passes at p > 1e-3
and |z| < 4 (fixed seeds); each negative
control runs a deliberately broken kernel (ratio q/p, residual p, unnormalised residual, drafts out of draw
order, rho = 1, wrong draft law) and must be rejected at p < 1e-6.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import executor.verification as verification
from executor.sampling import logits_to_probs, sample_drafts, sample_token
from executor.verification import (
    MULTIDRAFT_VERIFIERS,
    VERIFIER_DRAFT_LAW,
    verify_chain,
    verify_chain_argmax,
    verify_multidraft,
    verify_multidraft_unchecked,
    verify_tree_argmax,
)
from tests.goodness_of_fit import law_p_value, z_score
from tests.kseq_rows import KSEQ_ROW_ARGUMENTS, kseq_row
from theory import draft_laws, strategies, verifier

ACCEPT_P_VALUE = 1e-3
CONTROL_P_VALUE = 1e-6
MAX_ABS_Z = 4.0
SAMPLES = 30_000  # per (verifier, case): ~0.6% resolution on acceptance, a few ms per batched call

SAMPLED_VERIFIERS = tuple(name for name in MULTIDRAFT_VERIFIERS if name != "argmax")


def acceptance_z(accepted: np.ndarray, exact: float) -> float:
    """z-score of an empirical acceptance frequency against the exact rate (rates 0 and 1 must match)."""
    return z_score(accepted, exact, variance=exact * (1 - exact))


# --------------------------------------------------------------------------------------------------------
# Multi-draft verifiers against their theory twins

CASES = {
    "zeros_v5_n2": (np.array([0.1, 0.2, 0.3, 0.0, 0.4]), np.array([0.3, 0.0, 0.2, 0.4, 0.1]), 2),
    "v6_n3": (
        np.array([0.32, 0.04, 0.2, 0.0, 0.3, 0.14]),
        np.array([0.1, 0.35, 0.05, 0.25, 0.15, 0.1]),
        3,
    ),
    "disjoint_v6_n2": (
        np.array([0.5, 0.3, 0.2, 0.0, 0.0, 0.0]),
        np.array([0.0, 0.0, 0.0, 0.5, 0.3, 0.2]),
        2,
    ),
    "v8_n4": (
        np.array([0.05, 0.2, 0.0, 0.15, 0.3, 0.1, 0.0, 0.2]),
        np.array([0.3, 0.1, 0.15, 0.05, 0.1, 0.0, 0.2, 0.1]),
        4,
    ),
    "identical_v4_n2": (np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.4, 0.3, 0.2, 0.1]), 2),
}

RUNS = [
    (name, case)
    for name in SAMPLED_VERIFIERS
    for case, (_, _, n) in CASES.items()
    if VERIFIER_DRAFT_LAW[name] != "spechub" or n == 2
]


def draw_and_verify(name, p, q, n, seed=0, *, draft=None, reorder=None):
    """Sample ``SAMPLES`` draft tuples and verify them in one batched call; returns numpy arrays."""
    generator = torch.Generator().manual_seed(seed)
    batch_p = torch.tensor(p).expand(SAMPLES, -1)
    batch_q = torch.tensor(q).expand(SAMPLES, -1)
    drafts = sample_drafts(batch_q, n, draft or VERIFIER_DRAFT_LAW[name] or "iid", generator)
    verified = drafts if reorder is None else reorder(drafts)
    index, token = verify_multidraft(name, batch_p, batch_q, verified, generator)
    return drafts.numpy(), index.numpy(), token.numpy()


@functools.cache
def run(name: str, case: str):
    p, q, n = CASES[case]
    return draw_and_verify(name, p, q, n)


def joint_p_value(name, p, q, n, drafts, tokens, draft=None) -> float:
    """Chi-square of sampled (draft tuple, output) pairs against P(tuple) * theory conditional."""
    vocab = p.shape[-1]
    tuples, probabilities = draft_laws.enumerate_drafts(q, n, draft or verifier(name).draft)
    conditional = verifier(name).conditional(p, q, tuples)
    joint = np.zeros(vocab ** (n + 1))
    powers = vocab ** np.arange(n + 1)[::-1]
    cells = (
        np.column_stack([np.repeat(tuples, vocab, axis=0), np.tile(np.arange(vocab), len(tuples))])
    ) @ powers
    np.add.at(joint, cells, (probabilities[:, None] * conditional).ravel())
    observed = np.bincount(np.column_stack([drafts, tokens]) @ powers, minlength=joint.size)
    return law_p_value(observed, joint)


@pytest.mark.parametrize(("name", "case"), RUNS)
def test_joint_law_of_drafts_and_output_matches_the_theory_twin(name, case):
    p, q, n = CASES[case]
    drafts, _, tokens = run(name, case)
    assert joint_p_value(name, p, q, n, drafts, tokens) > ACCEPT_P_VALUE


@pytest.mark.parametrize(("name", "case"), RUNS)
def test_output_law_matches_the_theory_output_distribution_which_is_the_target(name, case):
    p, q, n = CASES[case]
    _, _, tokens = run(name, case)
    exact = verifier(name).output_distribution(p, q, n)
    np.testing.assert_allclose(exact, p, atol=1e-12)  # every one of these verifiers is lossless
    assert law_p_value(np.bincount(tokens, minlength=p.size), exact) > ACCEPT_P_VALUE


@pytest.mark.parametrize(("name", "case"), RUNS)
def test_empirical_acceptance_matches_the_theory_acceptance(name, case):
    p, q, n = CASES[case]
    drafts, index, tokens = run(name, case)
    accepted = index >= 0
    # accepted_index is the definition "output in drafts", and points at the output.
    np.testing.assert_array_equal(accepted, (drafts == tokens[:, None]).any(axis=1))
    assert abs(acceptance_z(accepted, float(verifier(name).acceptance(p, q, n)))) < MAX_ABS_Z


@pytest.mark.parametrize("name", SAMPLED_VERIFIERS)
@given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(2, 9), rows=st.integers(1, 4))
def test_unchecked_verification_returns_what_the_checked_one_returns(name, seed, vocab, rows):
    # What decoders call: the same tokens and indices from the same generator state, on float32 rows of
    # logits_to_probs as a decoder hands them (rounding included), at any draft count the law allows.
    generator = torch.Generator().manual_seed(seed)
    scale = torch.rand((rows, 1), generator=generator) * 6
    p = logits_to_probs(scale * torch.randn(rows, vocab, generator=generator))
    q = logits_to_probs(scale * torch.randn(rows, vocab, generator=generator))
    law = VERIFIER_DRAFT_LAW[name]
    n = 2 if law == "spechub" else 1 + seed % min(4, vocab - 1 if law in ("wor", "greedy") else 4)
    drafts = sample_drafts(q, n, law, generator)
    state = generator.get_state()
    kernel, handed = verification._run_kernel, []  # the (p, q) each entry hands the kernel

    def recording(*arguments):
        handed.append(arguments[1:3])
        return kernel(*arguments)

    verification._run_kernel = recording
    try:
        checked = verify_multidraft(name, p, q, drafts, generator)
        generator.set_state(state)
        unchecked = verify_multidraft_unchecked(name, p, q, drafts, generator)
    finally:
        verification._run_kernel = kernel
    for a, b in zip(checked, unchecked, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(*handed, strict=True):
        assert a.dtype == b.dtype == torch.float64 and torch.equal(a, b)


# Negative controls: each broken twin must be caught by the same harness.

CONTROL_CASE = "v6_n3"


def _spechub_or(case, name):
    return "zeros_v5_n2" if VERIFIER_DRAFT_LAW[name] == "spechub" else case


@pytest.mark.parametrize("name", [name for name in SAMPLED_VERIFIERS if name != "nss"])
def test_negative_control_ratio_q_over_p_is_caught(name, monkeypatch):
    monkeypatch.setattr(
        verification, "_accepts", lambda u, numerator, denominator: u * numerator < denominator
    )
    p, q, n = CASES[_spechub_or(CONTROL_CASE, name)]
    drafts, _, tokens = draw_and_verify(name, p, q, n)
    assert joint_p_value(name, p, q, n, drafts, tokens) < CONTROL_P_VALUE


@pytest.mark.parametrize("name", ["naive", "rrs", "rrs_wor"])
def test_negative_control_resampling_the_target_after_rejection_is_caught(name, monkeypatch):
    if name == "naive":
        monkeypatch.setattr(verification, "_residual", lambda p, q: p)
    else:  # RRS forms its residuals as (p - shift q)_+
        monkeypatch.setattr(verification, "_shifted_residual", lambda p, q, shift: p.clone())
    p, q, n = CASES[CONTROL_CASE]
    _, _, tokens = draw_and_verify(name, p, q, n)
    assert law_p_value(np.bincount(tokens, minlength=p.size), p) < CONTROL_P_VALUE


# Only RRS feeds a residual into later accept ratios; elsewhere it is only sampled, where scale is harmless.
@pytest.mark.parametrize("name", ["rrs", "rrs_wor"])
def test_negative_control_unnormalised_residual_is_caught(name, monkeypatch):
    monkeypatch.setattr(verification, "_mass", lambda weights: torch.ones_like(weights[..., :1]))
    p, q, n = CASES[CONTROL_CASE]
    drafts, _, tokens = draw_and_verify(name, p, q, n)
    assert joint_p_value(name, p, q, n, drafts, tokens) < CONTROL_P_VALUE


def test_negative_control_rrs_wor_verified_out_of_draw_order_is_caught():
    p, q, n = CASES[CONTROL_CASE]
    drafts, _, tokens = draw_and_verify("rrs_wor", p, q, n, reorder=lambda d: d.flip(-1))
    assert joint_p_value("rrs_wor", p, q, n, drafts, tokens) < CONTROL_P_VALUE


def kseq_acceptance(p: np.ndarray, q: np.ndarray, n: int, rho: float) -> float:
    return 1.0 - (1.0 - np.minimum(p / rho, q).sum()) ** n


@given(strategies.distribution_pairs(vocab_size=st.integers(1, 8)), st.integers(1, 6))
def test_kseq_division_factor_in_torch_equals_its_numpy_twin(pair, n):
    # The same bisection on both sides; the sums round differently (torch and numpy reduce in other orders),
    # and where the lossless condition is flat near its root (p close to q) a 1e-16 change of beta moves the
    # root by up to ~1e-8 relative. What the verifier uses, the acceptance 1 - (1 - beta(rho))^n, has slope
    # at most n in beta and agrees to 1e-9. Each row of a batch is the row solved alone, bit for bit.
    p, q = pair
    theory_kseq = verifier("kseq")
    for target, draft in ((p, q), (q, p)):
        expected = float(theory_kseq.division_factor(target, draft, n))
        rho = verification._kseq_division_factor(torch.from_numpy(target), torch.from_numpy(draft), n)
        assert rho.shape == (1,)
        assert float(rho) == pytest.approx(expected, rel=1e-6)
        assert kseq_acceptance(target, draft, n, float(rho)) == pytest.approx(
            kseq_acceptance(target, draft, n, expected), abs=1e-9
        )
    batch = verification._kseq_division_factor(
        torch.from_numpy(np.stack([p, q])), torch.from_numpy(np.stack([q, p])), n
    )
    alone = verification._kseq_division_factor(torch.from_numpy(q), torch.from_numpy(p), n)
    assert batch[1, 0] == alone[0]


def kseq_beta(p: np.ndarray, q: np.ndarray, rho: float) -> float:
    return float(np.minimum(p / rho, q).sum())


@given(*KSEQ_ROW_ARGUMENTS)
def test_kseq_division_factor_is_the_smallest_valid_factor_at_vocabulary_scale(seed, concentration, n, shape):
    """The bucketed search (ratios binned on [1, n], the last halvings on one bucket's tokens) returns a valid
    factor that a 1e-9 smaller one is not, and the numpy twin's to 1e-6, on rows of 4,000 tokens
    (:func:`tests.kseq_rows.kseq_row`: ratios on the bucket edges, zeros in p and q)."""
    p, q = kseq_row(seed, concentration, n, shape, 4000)
    rho = float(verification._kseq_division_factor(torch.from_numpy(p), torch.from_numpy(q), n))
    assert 1.0 <= rho <= n
    beta = kseq_beta(p, q, rho)
    # valid; the full sum rounds differently from the search's (the twin's own factor can be 1e-16 past 1e-13)
    assert 1.0 - (1.0 - beta) ** n <= rho * beta + 1e-13 + 1e-14
    if rho > 1.0:
        smaller = rho * (1.0 - 1e-9)
        beta = kseq_beta(p, q, smaller)
        assert 1.0 - (1.0 - beta) ** n > smaller * beta + 1e-13 - 1e-14
    expected = float(verifier("kseq").division_factor(p, q, n))
    assert rho == pytest.approx(expected, rel=1e-6)
    assert kseq_acceptance(p, q, n, rho) == pytest.approx(kseq_acceptance(p, q, n, expected), abs=1e-9)


def test_kseq_division_factor_in_torch_runs_without_numpy(monkeypatch):
    # No host round trip: the kernel must not call theory's numpy bisection at run time.
    monkeypatch.setattr(np, "minimum", None)
    p = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.float64)
    rho = verification._kseq_division_factor(p, q, 3)
    assert 1.0 < float(rho) <= 3.0


def test_negative_control_kseq_without_the_division_factor_is_caught(monkeypatch):
    # rho = 1 is below rho* for n >= 2, so K-SEQ accepts too often and is no longer lossless.
    monkeypatch.setattr(verification, "_kseq_division_factor", lambda p, q, n: torch.ones_like(p[..., :1]))
    p, q, n = CASES[CONTROL_CASE]
    _, _, tokens = draw_and_verify("kseq", p, q, n)
    assert law_p_value(np.bincount(tokens, minlength=p.size), p) < CONTROL_P_VALUE


def test_negative_control_rrs_with_drafts_without_replacement_is_caught():
    # The i.i.d. RRS verifier on the without-replacement law: a draft-law mismatch, lossy.
    p, q, n = CASES[CONTROL_CASE]
    _, _, tokens = draw_and_verify("rrs", p, q, n, draft="wor")
    assert law_p_value(np.bincount(tokens, minlength=p.size), p) < CONTROL_P_VALUE


# Properties over hypothesis-generated pairs (200 examples each, from theory.strategies).


def _draft_count(name: str, q: np.ndarray, n: int) -> int:
    if VERIFIER_DRAFT_LAW[name] == "spechub":
        return 2
    if VERIFIER_DRAFT_LAW[name] in ("wor", "greedy"):
        return min(n, int(np.count_nonzero(q)))
    return n


def _verify_samples(name: str, p: np.ndarray, q: np.ndarray, n: int, seed: int, batch: int):
    """``batch`` draft tuples from the verifier's draft law and their verification ``(drafts, index, token)``.

    ``q`` falls back to uniform where SpecHub would have no second token, and ``n`` is clipped to the law.
    """
    if VERIFIER_DRAFT_LAW[name] == "spechub" and np.count_nonzero(q) < 2:
        q = np.full_like(q, 1 / q.size)
    n = _draft_count(name, q, n)
    generator = torch.Generator().manual_seed(seed)
    q_batch = torch.tensor(q).expand(batch, -1)
    drafts = sample_drafts(q_batch, n, VERIFIER_DRAFT_LAW[name] or "iid", generator)
    index, token = verify_multidraft(name, torch.tensor(p).expand(batch, -1), q_batch, drafts, generator)
    return drafts, index, token


PAIRS = strategies.distribution_pairs(vocab_size=st.integers(2, 6))
NAMES = st.sampled_from(MULTIDRAFT_VERIFIERS)


@given(PAIRS, strategies.draft_counts(max_n=3), NAMES, st.integers(0, 2**16))
def test_accepted_index_points_at_the_output_or_is_minus_one(pair, n, name, seed):
    drafts, index, token = _verify_samples(name, *pair, n, seed, batch=32)
    n = drafts.shape[1]
    member = drafts == token[:, None]
    assert torch.equal(index >= 0, member.any(dim=1))
    hit = index >= 0
    assert torch.equal(drafts[hit].gather(1, index[hit, None]).squeeze(1), token[hit])
    assert not bool(
        member[torch.arange(32)[hit, None], torch.arange(n)[None, :]]
        .logical_and(torch.arange(n)[None, :] < index[hit, None])
        .any()
    )  # the first matching draft


@given(PAIRS, strategies.draft_counts(max_n=3), st.sampled_from(SAMPLED_VERIFIERS), st.integers(0, 2**16))
def test_output_never_has_zero_target_probability(pair, n, name, seed):
    p, _ = pair
    _, _, token = _verify_samples(name, *pair, n, seed, batch=64)
    assert bool((torch.tensor(p)[token] > 0).all())


@given(
    strategies.distributions(vocab_size=st.integers(2, 6)),
    strategies.draft_counts(max_n=3),
    st.sampled_from([name for name in SAMPLED_VERIFIERS if name != "nss"]),
    st.integers(0, 2**16),
)
def test_every_verifier_accepts_always_when_target_equals_draft(p, n, name, seed):
    if VERIFIER_DRAFT_LAW[name] == "spechub" and np.count_nonzero(p) < 2:
        p = np.full_like(p, 1 / p.size)  # the target must equal the draft SpecHub falls back to
    _, index, _ = _verify_samples(name, p, p, n, seed, batch=64)
    assert bool((index >= 0).all())


@given(PAIRS, st.integers(0, 2**16))
def test_every_recursive_verifier_reduces_to_speculative_sampling_for_one_draft(pair, seed):
    # With n = 1 RRS (either law), Hu's greedy and the naive rule are one algorithm, consuming the same
    # random numbers: their outputs agree sample by sample.
    p, q = (torch.tensor(v).expand(64, -1) for v in pair)
    drafts = sample_drafts(q, 1, "iid", torch.Generator().manual_seed(seed))
    outputs = [
        verify_multidraft(name, p, q, drafts, torch.Generator().manual_seed(seed + 1))
        for name in ("naive", "rrs", "rrs_wor", "greedy")
    ]
    for index, token in outputs[1:]:
        assert torch.equal(index, outputs[0][0]) and torch.equal(token, outputs[0][1])


@given(PAIRS, st.integers(0, 2**16))
def test_multidraft_argmax_outputs_the_target_argmax(pair, seed):
    p, q = pair
    drafts = sample_drafts(torch.tensor(q).expand(8, -1), 3, "iid", torch.Generator().manual_seed(seed))
    index, token = verify_multidraft(
        "argmax", torch.tensor(p).expand(8, -1), torch.tensor(q).expand(8, -1), drafts, torch.Generator()
    )
    assert bool((token == int(np.argmax(p))).all())
    for row, position in zip(drafts.tolist(), index.tolist(), strict=True):
        assert position == (row.index(int(np.argmax(p))) if int(np.argmax(p)) in row else -1)


@pytest.mark.parametrize("name", MULTIDRAFT_VERIFIERS)
def test_verification_is_reproducible_with_a_seeded_generator(name):
    p, q, n = CASES["zeros_v5_n2"]
    first = draw_and_verify(name, p, q, n, seed=5)
    second = draw_and_verify(name, p, q, n, seed=5)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------------------------------------
# Input validation


def _inputs():
    p = torch.tensor([0.1, 0.2, 0.3, 0.0, 0.4], dtype=torch.float64)
    q = torch.tensor([0.3, 0.0, 0.2, 0.4, 0.1], dtype=torch.float64)
    return p, q, torch.Generator().manual_seed(0)


def test_unknown_verifier_name_lists_the_valid_ones():
    p, q, generator = _inputs()
    with pytest.raises(ValueError, match="name must be one of.*'rrs_wor'.*'spechub'"):
        verify_multidraft("specinfer", p, q, torch.tensor([0, 2]), generator)


@pytest.mark.parametrize(
    ("name", "drafts", "message"),
    [
        ("spechub", [0, 3, 2], "n must be 2"),
        ("spechub", [0, 2], "hub"),
        ("greedy", [0, 2], "top n - 1"),
        ("rrs_wor", [2, 2], "distinct"),
        ("rrs", [0, 1], "draft_probs = 0"),
        ("rrs", [0, 5], r"token ids in \[0, 5\)"),
    ],
)
def test_drafts_the_law_cannot_produce_are_rejected(name, drafts, message):
    p, q, generator = _inputs()
    with pytest.raises(ValueError, match=message):
        verify_multidraft(name, p, q, torch.tensor(drafts), generator)


def test_multidraft_shape_and_value_errors_name_the_argument():
    p, q, generator = _inputs()
    with pytest.raises(ValueError, match="same shape"):
        verify_multidraft("rrs", p, q[:4] / q[:4].sum(), torch.tensor([0]), generator)
    with pytest.raises(ValueError, match="target_probs must sum to 1"):
        verify_multidraft("rrs", p * 2, q, torch.tensor([0]), generator)
    with pytest.raises(ValueError, match="draft_probs contains negative"):
        verify_multidraft("rrs", p, q - 0.1, torch.tensor([0]), generator)
    with pytest.raises(ValueError, match="drafts must"):
        verify_multidraft("rrs", p, q, torch.tensor([[0, 2]]), generator)
    with pytest.raises(ValueError, match="drafts must be an integer"):
        verify_multidraft("rrs", p, q, torch.tensor([0.0]), generator)


def test_chain_shape_errors_name_the_argument():
    p, q, generator = _inputs()
    with pytest.raises(ValueError, match="target_probs must have shape"):
        verify_chain(torch.stack([p, p]), torch.stack([q, q]), torch.tensor([0, 0]), generator)
    with pytest.raises(ValueError, match="drafts must have shape"):
        verify_chain(torch.stack([p, p]), q[None], torch.tensor([0, 0]), generator)
    with pytest.raises(ValueError, match="drafts must have shape"):
        verify_chain_argmax(torch.stack([p, p]), torch.tensor([0, 0]))


def test_tree_parent_array_errors_name_the_argument():
    target = torch.rand(3, 4)
    with pytest.raises(ValueError, match="parents"):
        verify_tree_argmax(target, [0, 0, 1], torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"parents\[2\]"):
        verify_tree_argmax(target, [-1, 0, 2], torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="target"):
        verify_tree_argmax(target[:2], [-1, 0, 1], torch.tensor([0, 1, 2]))


def test_kernels_keep_tensors_on_the_generator_device_and_reject_a_mismatch():
    # CUDA-agnostic contract, checked on CPU: results live on the inputs' device; tensors on another device
    # type than the generator are refused (the meta device stands in for an accelerator).
    p, q, generator = _inputs()
    for name in MULTIDRAFT_VERIFIERS:
        law = VERIFIER_DRAFT_LAW[name] or "iid"
        index, token = verify_multidraft(name, p, q, sample_drafts(q, 2, law, generator), generator)
        assert index.device == token.device == p.device and token.dtype == torch.int64
    with pytest.raises(ValueError, match="generator"):
        verify_multidraft("rrs", p.to("meta"), q.to("meta"), torch.tensor([0, 2], device="meta"), generator)
    with pytest.raises(ValueError, match="generator"):
        verify_chain(p[None].expand(2, -1).to("meta"), q[None].to("meta"), torch.tensor([0]), generator)


def test_float32_softmax_over_a_large_vocabulary_is_accepted_by_every_verifier():
    # A float32 softmax over 49,152 tokens sums to 1 only within ~1e-5; the kernels (and theory's K-SEQ
    # division factor, whose check allows 1e-6) must still take it, renormalised within tolerance.
    generator = torch.Generator().manual_seed(0)
    p, q = logits_to_probs(torch.randn(2, 49_152, generator=generator) * 3, temperature=0.8)
    for name in MULTIDRAFT_VERIFIERS:
        n = 2 if name == "spechub" else 3
        drafts = sample_drafts(q, n, VERIFIER_DRAFT_LAW[name] or "iid", generator)
        _, token = verify_multidraft(name, p, q, drafts, generator)
        assert 0 <= int(token) < 49_152 and p[token] > 0
    chain_target = logits_to_probs(torch.randn(4, 49_152, generator=generator) * 3)
    chain_draft = logits_to_probs(torch.randn(3, 49_152, generator=generator) * 3)
    n_accepted, token = verify_chain(
        chain_target, chain_draft, sample_token(chain_draft, generator), generator
    )
    assert 0 <= int(n_accepted) <= 3 and chain_target[n_accepted, token] > 0
