"""Tests of executor.sampling: logits processing against hand computations and Hugging Face's warpers, and the
torch draft samplers against the exact draft laws of theory.draft_laws (chi-square, with negative controls).

Statistical tests use fixed seeds and reject at p < 1e-3; a negative control feeds each one a deliberately
wrong sampler and requires p < 1e-6, so the test is shown to have the power to catch that bug.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import executor.sampling as sampling
from executor.sampling import (
    TORCH_DRAFT_LAWS,
    first_argmax,
    largest_positive,
    logits_to_probs,
    sample_drafts,
    sample_drafts_unchecked,
    sample_token,
    top_tokens,
)
from tests.goodness_of_fit import law_p_value
from theory import draft_laws

ACCEPT_P_VALUE = 1e-3  # a correct sampler passes at this level
CONTROL_P_VALUE = 1e-6  # a broken one must be rejected far more strongly


def tuple_p_value(drafts: torch.Tensor, q: np.ndarray, n: int, law: str) -> float:
    """Chi-square p-value of sampled draft tuples against ``theory.draft_laws.enumerate_drafts``."""
    vocab = q.shape[-1]
    tuples, probabilities = draft_laws.enumerate_drafts(q, n, law)
    codes = tuples @ vocab ** np.arange(n)[::-1]
    sampled = drafts.numpy() @ vocab ** np.arange(n)[::-1]
    law_on_codes = np.zeros(vocab**n)
    np.add.at(law_on_codes, codes, probabilities)
    return law_p_value(np.bincount(sampled, minlength=vocab**n), law_on_codes)


# --------------------------------------------------------------------------------------------------------
# logits_to_probs


def test_logits_to_probs_matches_a_hand_computed_softmax_at_temperature_two():
    logits = torch.tensor([1.0, 2.0, 3.0])
    weights = np.exp(np.array([0.5, 1.0, 1.5]))
    expected = weights / weights.sum()
    probs = logits_to_probs(logits, temperature=2.0)
    assert probs.dtype == torch.float32
    np.testing.assert_allclose(probs.numpy(), expected, rtol=1e-6)


def test_logits_to_probs_top_k_keeps_the_k_largest_by_hand():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.0])
    probs = logits_to_probs(logits, top_k=2)
    expected = np.array([0.0, np.e / (np.e + 1), 0.0, 1 / (np.e + 1)])
    np.testing.assert_allclose(probs.numpy(), expected, rtol=1e-6, atol=1e-7)


def test_logits_to_probs_top_k_keeps_every_token_tied_at_the_boundary():
    # Hugging Face's TopKLogitsWarper removes only scores strictly below the k-th largest.
    probs = logits_to_probs(torch.tensor([2.0, 1.0, 1.0, 0.0]), top_k=2)
    assert (probs[:3] > 0).all() and probs[3] == 0


def test_logits_to_probs_top_p_keeps_the_smallest_nucleus_by_hand():
    probs_in = np.array([0.5, 0.3, 0.15, 0.05])
    logits = torch.tensor(np.log(probs_in), dtype=torch.float32)
    # Ascending cumulative sums 0.05, 0.2, 0.5, 1.0; drop those <= 1 - 0.7 = 0.3: tokens 3 and 2.
    probs = logits_to_probs(logits, top_p=0.7)
    np.testing.assert_allclose(probs.numpy(), [0.625, 0.375, 0.0, 0.0], rtol=1e-6, atol=1e-7)
    # A nucleus smaller than the top token still keeps the top token.
    np.testing.assert_allclose(logits_to_probs(logits, top_p=0.01).numpy(), [1, 0, 0, 0], atol=1e-7)


def test_temperature_zero_is_one_hot_on_the_lowest_tied_argmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, -1.0, 5.0, 5.0]])
    probs = logits_to_probs(logits, temperature=0.0, top_k=1, top_p=0.5)
    expected = torch.zeros(2, 4)
    expected[0, 1] = expected[1, 0] = 1.0
    assert torch.equal(probs, expected)
    assert torch.equal(probs.argmax(dim=-1), logits.argmax(dim=-1))


def test_masked_logits_get_probability_zero():
    probs = logits_to_probs(torch.tensor([0.0, float("-inf"), 1.0]), temperature=0.7)
    assert probs[1] == 0 and abs(float(probs.sum()) - 1) < 1e-6


@given(
    logits=st.lists(st.floats(-20, 20, allow_subnormal=False), min_size=2, max_size=12, unique=True),
    temperature=st.floats(0.05, 3.0),
    top_k=st.one_of(st.none(), st.integers(1, 14)),
    top_p=st.one_of(st.none(), st.floats(0.05, 0.999)),
)
def test_logits_to_probs_matches_hugging_face_warpers(logits, temperature, top_k, top_p):
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = torch.tensor([logits], dtype=torch.float32)
    hf = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k is not None:
        hf = TopKLogitsWarper(top_k)(None, hf)
    if top_p is not None:
        hf = TopPLogitsWarper(top_p)(None, hf)
    expected = hf.softmax(dim=-1)[0]
    got = logits_to_probs(scores[0], temperature=temperature, top_k=top_k, top_p=top_p)
    # Ties in the cumulative sums could let the two sorts differ; unique logits after scaling rule them out.
    assume(len(set((scores[0] / temperature).tolist())) == len(logits))
    assert torch.equal(got > 0, expected > 0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_logits_to_probs_is_batched_over_leading_axes():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 2, 7, generator=generator)
    batched = logits_to_probs(logits, temperature=0.8, top_k=4, top_p=0.9)
    for index in np.ndindex(3, 2):
        torch.testing.assert_close(batched[index], logits_to_probs(logits[index], 0.8, 4, 0.9))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_logits_to_probs_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        logits_to_probs(torch.zeros(4), **kwargs)


def test_logits_to_probs_rejects_bad_logits():
    with pytest.raises(ValueError, match="logits"):
        logits_to_probs(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="logits"):
        logits_to_probs(torch.full((3,), float("-inf")))
    with pytest.raises(ValueError, match="logits"):
        logits_to_probs(torch.tensor([1, 2]))


# --------------------------------------------------------------------------------------------------------
# sample_token

TOKEN_LAW = np.array([0.1, 0.0, 0.45, 0.05, 0.4])


def test_sample_token_follows_the_distribution():
    generator = torch.Generator().manual_seed(1)
    probs = torch.tensor(TOKEN_LAW).expand(50_000, 5)
    tokens = sample_token(probs, generator)
    assert tokens.shape == (50_000,) and tokens.dtype == torch.int64
    assert law_p_value(np.bincount(tokens.numpy(), minlength=5), TOKEN_LAW) > ACCEPT_P_VALUE


def test_sample_token_negative_control_detects_a_shifted_law():
    generator = torch.Generator().manual_seed(1)
    shifted = np.array([0.11, 0.0, 0.44, 0.05, 0.4])  # one point of mass moved
    tokens = sample_token(torch.tensor(shifted).expand(50_000, 5), generator)
    assert law_p_value(np.bincount(tokens.numpy(), minlength=5), TOKEN_LAW) < CONTROL_P_VALUE


@given(
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=9).filter(lambda w: sum(w) > 1e-3), st.integers(0, 99)
)
def test_sample_token_never_draws_a_zero_probability_token(weights, seed):
    probs = torch.tensor(weights, dtype=torch.float64)
    probs = probs / probs.sum()
    tokens = sample_token(probs.expand(64, -1), torch.Generator().manual_seed(seed))
    assert bool((probs[tokens] > 0).all())


def test_sample_token_is_reproducible_with_a_seeded_generator():
    probs = torch.softmax(torch.arange(10.0), dim=-1).expand(100, 10)
    first = sample_token(probs, torch.Generator().manual_seed(7))
    assert torch.equal(first, sample_token(probs, torch.Generator().manual_seed(7)))


def test_sample_token_rejects_a_zero_row_and_negative_entries():
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="probs"):
        sample_token(torch.zeros(2, 3), generator)
    with pytest.raises(ValueError, match="probs"):
        sample_token(torch.tensor([0.5, -0.1, 0.6]), generator)


# --------------------------------------------------------------------------------------------------------
# sample_drafts against theory.draft_laws

DRAFT_CASES = [
    (np.array([0.3, 0.0, 0.2, 0.4, 0.1]), 2),
    (np.array([0.05, 0.35, 0.0, 0.25, 0.2, 0.15]), 3),
    (np.array([0.6, 0.25, 0.1, 0.05]), 4),
]


@pytest.mark.parametrize(
    ("law", "q", "n"),
    [(law, q, n) for law in TORCH_DRAFT_LAWS for q, n in DRAFT_CASES if law != "spechub" or n == 2],
)
def test_sample_drafts_follows_the_theory_draft_law(law, q, n):
    generator = torch.Generator().manual_seed(11)
    drafts = sample_drafts(torch.tensor(q).expand(40_000, -1), n, law, generator)
    assert drafts.shape == (40_000, n) and drafts.dtype == torch.int64
    assert tuple_p_value(drafts, q, n, law) > ACCEPT_P_VALUE


def test_sample_drafts_negative_control_wor_out_of_draw_order_is_detected():
    # Successive sampling is not exchangeable: reversing the Gumbel-top-n order changes the tuple law.
    q, n = DRAFT_CASES[1]
    drafts = sample_drafts(torch.tensor(q).expand(40_000, -1), n, "wor", torch.Generator().manual_seed(11))
    assert tuple_p_value(drafts.flip(-1), q, n, "wor") < CONTROL_P_VALUE


def test_sample_drafts_negative_control_iid_is_not_wor():
    q, n = DRAFT_CASES[0]
    drafts = sample_drafts(torch.tensor(q).expand(40_000, -1), n, "iid", torch.Generator().manual_seed(11))
    assert tuple_p_value(drafts, q, n, "wor") < CONTROL_P_VALUE


@given(
    st.lists(
        st.sampled_from([0.0, 1e-300, 1e-200, 1e-17, 1e-9, 0.1, 0.5, 1.0, 3.0]), min_size=2, max_size=12
    ).filter(lambda w: sum(1 for x in w if x > 0) >= 1),
    st.integers(0, 2**32 - 1),
)
def test_wor_drafts_are_distinct_tokens_of_the_support(weights, seed):
    """Successive sampling never repeats a token nor draws one with q = 0, down to masses of 1e-300 next to
    masses of order 1 (where a carried point lands an ulp from an interval's end), and with n the whole
    support every positive token comes out once."""
    q = torch.tensor(weights, dtype=torch.float64)
    q = q / q.sum()
    support = int((q > 0).sum())
    for n in sorted({1, (support + 1) // 2, support}):
        drafts = sample_drafts(q.expand(64, -1), n, "wor", torch.Generator().manual_seed(seed))
        for row in drafts.tolist():
            assert len(set(row)) == n and all(q[token] > 0 for token in row)
            if n == support:
                assert sorted(row) == torch.nonzero(q > 0).reshape(-1).tolist()


ENTRIES = st.sampled_from([float("-inf"), -1.0, 0.0, 0.5, 1.0, float("inf"), float("nan")])


@given(
    st.lists(st.lists(ENTRIES, min_size=5, max_size=5), min_size=1, max_size=3),
    st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    st.booleans(),
    st.booleans(),
)
def test_first_argmax_is_torchs_argmax_on_ties_infinities_and_nan(rows, dtype, keepdim, one_row):
    x = torch.tensor(rows[0] if one_row else rows, dtype=dtype)
    expected = x.argmax(dim=-1, keepdim=keepdim)
    got = first_argmax(x, keepdim=keepdim)
    assert got.dtype == torch.int64 and got.shape == expected.shape
    assert torch.equal(got, expected)


@given(
    st.lists(st.sampled_from([0.0, 0.0, 0.1, 0.2, 0.5]), min_size=1, max_size=12),
    st.integers(1, 20),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_largest_positive_is_torch_topk_of_the_positive_entries(weights, count, dtype):
    x = torch.tensor(weights, dtype=dtype)
    positive = int((x > 0).sum())
    expected = torch.topk(x, min(count, positive)).values.tolist()
    assert largest_positive(x, count) == expected


@given(
    st.lists(st.sampled_from([float("-inf"), -1.0, 0.0, 1.0]), min_size=2, max_size=12), st.integers(1, 12)
)
def test_top_tokens_of_masked_logits_is_the_stable_descending_order(logits, k):
    """Rows with -inf entries (a reduced draft vocabulary's logits) and ties, k up to the whole row: the first k
    of a stable descending sort, whichever path top_tokens takes (first maxima one by one, or torch's)."""
    x = torch.tensor(logits, dtype=torch.float32)
    k = min(k, len(logits))
    expected = torch.sort(x, descending=True, stable=True).indices[:k]
    assert torch.equal(top_tokens(x, k).reshape(-1), expected)


@given(
    st.lists(st.integers(0, 3), min_size=2, max_size=9).filter(lambda w: sum(w) > 0),
    st.integers(1, 9),
)
def test_top_tokens_matches_theory_including_ties(weights, k):
    q = np.array(weights, dtype=np.float64) / sum(weights)
    k = min(k, len(weights))
    expected = draft_laws.top_tokens(q, k)
    np.testing.assert_array_equal(top_tokens(torch.tensor(q), k).numpy(), expected)


@given(
    st.lists(st.integers(0, 3), min_size=2, max_size=8).filter(lambda w: sum(1 for x in w if x) >= 2),
    st.sampled_from(TORCH_DRAFT_LAWS),
    st.integers(0, 50),
)
def test_sampled_drafts_have_positive_probability_under_the_law(weights, law, seed):
    q = np.array(weights, dtype=np.float64) / sum(weights)
    n = 2 if law == "spechub" else min(3, int(np.count_nonzero(q)))
    drafts = sample_drafts(torch.tensor(q).expand(16, -1), n, law, torch.Generator().manual_seed(seed))
    tuples, _ = draft_laws.enumerate_drafts(q, n, law)
    support = {tuple(row) for row in tuples.tolist()}
    assert all(tuple(row) in support for row in drafts.tolist())


@given(
    seed=st.integers(0, 2**31 - 1),
    law=st.sampled_from(TORCH_DRAFT_LAWS),
    vocab=st.integers(2, 9),
    rows=st.integers(1, 4),
)
def test_unchecked_drafts_are_the_checked_ones(seed, law, vocab, rows):
    # What decoders call, on float32 rows of logits_to_probs as a decoder hands them: the same drafts from
    # the same generator state (the rows are renormalised in float64 alike before any draw).
    generator = torch.Generator().manual_seed(seed)
    q = logits_to_probs(
        torch.rand((rows, 1), generator=generator) * 6 * torch.randn(rows, vocab, generator=generator)
    )
    n = 2 if law == "spechub" else 1 + seed % min(4, vocab - 1 if law in ("wor", "greedy") else 4)
    state = generator.get_state()
    draw, handed = sampling._sample_normalised, []  # the q each entry draws from

    def recording(*arguments):
        handed.append(arguments[0])
        return draw(*arguments)

    sampling._sample_normalised = recording
    try:
        checked = sample_drafts(q, n, law, generator)
        generator.set_state(state)
        unchecked = sample_drafts_unchecked(q, n, law, generator)
    finally:
        sampling._sample_normalised = draw
    assert torch.equal(checked, unchecked)
    assert handed[0].dtype == handed[1].dtype == torch.float64 and torch.equal(*handed)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((2, "beam"), "draft must be one of"),
        ((0, "iid"), "n"),
        ((3, "spechub"), "n must be 2"),
        ((4, "wor"), "at least n tokens"),
    ],
)
def test_sample_drafts_rejects_bad_arguments(args, message):
    q = torch.tensor([0.5, 0.3, 0.2, 0.0])
    with pytest.raises(ValueError, match=message):
        sample_drafts(q, *args, torch.Generator().manual_seed(0))


def test_sample_drafts_rejects_a_q_that_is_not_a_distribution():
    with pytest.raises(ValueError, match="q must sum to 1"):
        sample_drafts(torch.tensor([0.5, 0.3]), 1, "iid", torch.Generator().manual_seed(0))


def test_samplers_keep_tensors_on_the_generator_device_and_reject_a_mismatch():
    # CUDA-agnostic contract, checked on CPU: outputs live on the inputs' device; a generator on another
    # device type is refused before any draw (the meta device stands in for an accelerator here).
    generator = torch.Generator(device="cpu").manual_seed(0)
    q = torch.tensor([0.5, 0.3, 0.2])
    for law in TORCH_DRAFT_LAWS:
        assert sample_drafts(q, 2, law, generator).device == q.device
    assert sample_token(q, generator).device == q.device
    with pytest.raises(ValueError, match="generator"):
        sample_token(q.to("meta"), generator)
    with pytest.raises(ValueError, match="generator"):
        sample_drafts(q.to("meta"), 2, "iid", generator)
