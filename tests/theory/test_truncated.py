"""Certified intervals on truncated (top-k) positions against brute force over the completions of the tail.

The oracle is independent of theory.truncated: it lists completions of the unlogged entries (every vertex of
the capped simplex, where a concave quantity takes its minimum, plus a grid) and evaluates each quantity on
the full vectors with the exact dense routines (subset enumeration for alpha*, the verifiers' own closed
forms); the maxima of the overlap and of the greedy optimum come from a linear programme over completions.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import linprog

from theory import optimal_acceptance, verifier
from theory.truncated import (
    TRUNCATED_QUANTITIES,
    overlap_interval,
    top_k_positions,
    truncated_interval,
)

TOL = 1e-9


def tail_vectors(known, vocab, cap, rest, grid=6):
    """Full vectors completing ``known`` (id -> value): capped-simplex vertices plus a grid of the tail."""
    unknown = [i for i in range(vocab) if i not in known]
    base = np.zeros(vocab)
    for token, value in known.items():
        base[token] = value
    if not unknown or rest <= 1e-15:
        return [base]
    tails = set()
    full = int(np.floor(rest / cap + 1e-12))
    fraction = rest - full * cap
    for at_cap in itertools.combinations(range(len(unknown)), min(full, len(unknown))):
        others = [i for i in range(len(unknown)) if i not in at_cap] or [None]
        for partial in others:
            tail = np.zeros(len(unknown))
            tail[list(at_cap)] = cap
            if partial is not None:
                tail[partial] += fraction
            tails.add(tuple(np.round(tail, 15)))
    for parts in itertools.product(range(grid + 1), repeat=len(unknown)):
        if sum(parts) == grid and max(parts) * rest / grid <= cap + 1e-12:
            tails.add(tuple(np.array(parts) * rest / grid))
    vectors = []
    for tail in tails:
        vector = base.copy()
        vector[unknown] = tail
        vectors.append(vector)
    return vectors


def iid_optimum(p, q, n):
    """1 + min over every token set H of p(H) - q(H)^n, for (B, V) rows."""
    vocab = p.shape[-1]
    members = (np.arange(1 << vocab)[:, None] >> np.arange(vocab)) & 1  # every token set, as rows
    gaps = np.atleast_2d(p) @ members.T - (np.atleast_2d(q) @ members.T) ** n
    return 1.0 + gaps.min(axis=-1)


def dense_value(quantity, p, q, n):
    """The quantity on full (B, V) rows (or one row)."""
    single = np.ndim(p) == 1
    p, q = np.atleast_2d(p), np.atleast_2d(q)
    if quantity == "overlap":
        values = np.minimum(p, q).sum(axis=-1)
    elif quantity in ("iid", "optimal"):
        values = iid_optimum(p, q, n)
    elif quantity == "wor":
        values = np.array(
            [optimal_acceptance(a, b, n, draft="wor", method="enumerate") for a, b in zip(p, q, strict=True)]
        )
    else:
        values = np.atleast_1d(verifier(quantity).acceptance(p, q, n))
    return values[0] if single else values


def max_overlap_lp(p_known, q_known, vocab, a, b, r_p, r_q, q_scale=None, top=()):
    """max sum_i min(p_i, q''_i) over completions, as an LP in (p tail, q tail, t).

    q'' = q / q_scale off ``top`` and 1 on ``top`` (the greedy optimum); ``q_scale = None`` means 1.
    """
    scale = 1.0 if q_scale is None else q_scale
    up = [i for i in range(vocab) if i not in p_known]
    uq = [i for i in range(vocab) if i not in q_known]
    nx, ny = len(up), len(uq)
    size = nx + ny + vocab
    cost = np.zeros(size)
    cost[nx + ny :] = -1.0
    rows, rhs = [], []
    for i in range(vocab):
        for side, known, unknown, offset, factor in (
            ("p", p_known, up, 0, 1.0),
            ("q", q_known, uq, nx, 1.0 / scale),
        ):
            row = np.zeros(size)
            row[nx + ny + i] = 1.0
            if side == "q" and i in top:
                bound = 1.0
            elif i in known:
                bound = known[i] * factor
            else:
                row[offset + unknown.index(i)] = -factor
                bound = 0.0
            rows.append(row)
            rhs.append(bound)
    equalities, targets = [], []
    for count, offset, total in ((nx, 0, r_p), (ny, nx, r_q)):
        if count:
            row = np.zeros(size)
            row[offset : offset + count] = 1.0
            equalities.append(row)
            targets.append(total)
    bounds = [(0, a)] * nx + [(0, b)] * ny + [(0, None)] * vocab
    result = linprog(
        cost,
        A_ub=np.array(rows),
        b_ub=rhs,
        A_eq=np.array(equalities) if equalities else None,
        b_eq=targets or None,
        bounds=bounds,
        method="highs",
    )
    assert result.status == 0
    return -result.fun


def top_k(vector, k):
    ids = np.argsort(-vector, kind="stable")[:k]
    return ids, vector[ids]


def random_case(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(4, 7))
    p = rng.dirichlet(np.full(vocab, 0.6))
    q = rng.dirichlet(np.full(vocab, 0.6))
    kp, kq = int(rng.integers(1, vocab)), int(rng.integers(1, vocab))
    return vocab, p, q, kp, kq


def brute_force(vocab, p, q, kp, kq, quantity, n):
    p_ids, p_vals = top_k(p, kp)
    q_ids, q_vals = top_k(q, kq)
    p_known, q_known = (
        dict(zip(p_ids.tolist(), p_vals, strict=True)),
        dict(zip(q_ids.tolist(), q_vals, strict=True)),
    )
    grid = 3 if quantity in ("wor", "rrs_wor") else 6
    ps = np.array(tail_vectors(p_known, vocab, p_vals.min(), 1 - p_vals.sum(), grid))
    qs = np.array(tail_vectors(q_known, vocab, q_vals.min(), 1 - q_vals.sum(), grid))
    pairs_p = np.repeat(ps, len(qs), axis=0)
    pairs_q = np.tile(qs, (len(ps), 1))
    values = dense_value(quantity, pairs_p, pairs_q, n)
    return values.min(), values.max()


CASES = [random_case(seed) for seed in range(14)]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("quantity", TRUNCATED_QUANTITIES)
def test_interval_contains_every_completion_and_exact_ends_are_attained(case, quantity):
    vocab, p, q, kp, kq = CASES[case]
    n = 2 + case % 2
    if quantity in ("wor", "spechub", "rrs_wor"):
        n = 2
    p_ids, p_vals = top_k(p, kp)
    q_ids, q_vals = top_k(q, kq)
    positions = top_k_positions(p_ids, p_vals, q_ids, q_vals, vocab)
    interval = truncated_interval(positions, quantity, n)
    lowest, highest = brute_force(vocab, p, q, kp, kq, quantity, n)
    assert interval.low[0] <= lowest + TOL
    assert interval.high[0] >= highest - TOL
    if interval.exact_low[0]:
        assert interval.low[0] == pytest.approx(lowest, abs=1e-9)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_overlap_and_greedy_maxima_equal_the_linear_programme(case):
    vocab, p, q, kp, kq = CASES[case]
    p_ids, p_vals = top_k(p, kp)
    q_ids, q_vals = top_k(q, kq)
    positions = top_k_positions(p_ids, p_vals, q_ids, q_vals, vocab)
    a, b = p_vals.min(), q_vals.min()
    p_known, q_known = (
        dict(zip(p_ids.tolist(), p_vals, strict=True)),
        dict(zip(q_ids.tolist(), q_vals, strict=True)),
    )
    expected = max_overlap_lp(p_known, q_known, vocab, a, b, 1 - p_vals.sum(), 1 - q_vals.sum())
    assert overlap_interval(positions).high[0] == pytest.approx(expected, abs=1e-9)
    greedy = truncated_interval(positions, "greedy", 2)
    if greedy.exact_high[0]:
        top = int(q_ids[0])
        lp = max_overlap_lp(
            p_known, q_known, vocab, a, b, 1 - p_vals.sum(), 1 - q_vals.sum(), 1 - q[top], (top,)
        )
        assert greedy.high[0] == pytest.approx(lp, abs=1e-9)


def test_brute_force_rejects_an_interval_shrunk_by_a_little():
    """Negative control: the oracle's extremes sit at the interval's exact ends, so a shrunk one fails."""
    misses = 0
    for vocab, p, q, kp, kq in CASES:
        positions = top_k_positions(*top_k(p, kp), *top_k(q, kq), vocab)
        interval = overlap_interval(positions)
        lowest, highest = brute_force(vocab, p, q, kp, kq, "overlap", 1)
        misses += (interval.low[0] + 1e-3 > lowest) or (interval.high[0] - 1e-3 < highest)
    assert misses == len(CASES)


def test_exact_low_flags_are_exercised():
    """A negative control for the exactness checks: some random cases do satisfy the disjoint-tail rule."""
    flags = []
    for vocab, p, q, kp, kq in CASES:
        positions = top_k_positions(*top_k(p, kp), *top_k(q, kq), vocab)
        flags.append(truncated_interval(positions, "iid", 2).exact_low[0])
    assert 0 < sum(flags) < len(flags)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_width_is_zero_when_every_token_is_logged(n):
    rng = np.random.default_rng(3)
    vocab = 7
    p, q = rng.dirichlet(np.ones(vocab), size=4), rng.dirichlet(np.ones(vocab), size=4)
    shuffle = np.argsort(rng.random((4, vocab)), axis=1)  # ids in any order, different for p and q
    positions = top_k_positions(
        shuffle,
        np.take_along_axis(p, shuffle, 1),
        shuffle[:, ::-1],
        np.take_along_axis(q, shuffle[:, ::-1], 1),
        vocab,
    )
    for quantity in TRUNCATED_QUANTITIES:
        if quantity == "spechub" and n != 2:
            continue
        interval = truncated_interval(positions, quantity, n)
        np.testing.assert_allclose(interval.width, 0.0, atol=1e-12)
        assert interval.exact_low.all() and interval.exact_high.all()
        expected = [dense_value(quantity, p[i], q[i], n) for i in range(4)]
        np.testing.assert_allclose(interval.low, expected, atol=1e-9)


def test_batched_rows_equal_rows_one_at_a_time_with_ragged_padding():
    rng = np.random.default_rng(8)
    vocab, rows = 30, 6
    p, q = rng.dirichlet(np.full(vocab, 0.3), size=rows), rng.dirichlet(np.full(vocab, 0.3), size=rows)
    ks = rng.integers(1, 8, size=rows)
    width = ks.max()
    p_ids = np.full((rows, width), -1)
    q_ids = np.full((rows, width + 2), -1)
    p_vals = np.full(p_ids.shape, -np.inf)
    q_vals = np.zeros(q_ids.shape)
    for i, k in enumerate(ks):
        p_ids[i, :k], p_vals[i, :k] = top_k(p[i], k)
        q_ids[i, : k + 2], q_vals[i, : k + 2] = top_k(q[i], k + 2)
    batch = top_k_positions(p_ids, np.where(p_ids >= 0, p_vals, 0.0), q_ids, q_vals, vocab)
    for quantity in ("overlap", "iid", "wor", "greedy", "rrs"):
        together = truncated_interval(batch, quantity, 2)
        for i, k in enumerate(ks):
            alone = truncated_interval(
                top_k_positions(*top_k(p[i], k), *top_k(q[i], k + 2), vocab), quantity, 2
            )
            assert together.low[i] == pytest.approx(alone.low[0], abs=1e-12)
            assert together.high[i] == pytest.approx(alone.high[0], abs=1e-12)
            if quantity in ("iid", "wor"):
                truth = optimal_acceptance(p[i], q[i], 2, draft=quantity)
            else:
                truth = dense_value(quantity, p[i], q[i], 2)
            assert together.low[i] - TOL <= truth <= together.high[i] + TOL


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"p_ids": [[0, 9]]}, "p_ids must lie in"),
        ({"q_ids": [[1, 1]]}, "q_ids repeat"),
        ({"p_values": [[0.7, 0.6]]}, "p_values sum to more than 1"),
        ({"q_values": [[np.nan, 0.1]]}, "q_values must be finite"),
        ({"p_values": [[0.3, 0.01]]}, "remaining mass cannot fit"),
        ({"p_rest": [0.5]}, "p_rest must equal"),
        ({"vocab_size": 0}, "vocab_size"),
    ],
)
def test_bad_input_names_the_argument(change, message):
    arguments = {
        "p_ids": [[0, 1]],
        "p_values": [[0.5, 0.3]],
        "q_ids": [[1, 2]],
        "q_values": [[0.6, 0.2]],
        "vocab_size": 4,
    }
    arguments.update(change)
    vocab = arguments.pop("vocab_size")
    with pytest.raises(ValueError, match=message):
        top_k_positions(
            np.array(arguments.pop("p_ids")),
            arguments.pop("p_values"),
            np.array(arguments.pop("q_ids")),
            arguments.pop("q_values"),
            vocab,
            **arguments,
        )


@pytest.mark.parametrize("draft", ["iid", "wor"])
def test_more_drafts_than_logged_tokens_still_gives_a_valid_interval(draft):
    rng = np.random.default_rng(2)
    vocab = 6
    p, q = rng.dirichlet(np.ones(vocab)), rng.dirichlet(np.ones(vocab))
    positions = top_k_positions(*top_k(p, 1), *top_k(q, 1), vocab)
    interval = truncated_interval(positions, draft, 5)
    truth = optimal_acceptance(p, q, 5, draft=draft)
    assert interval.low[0] - TOL <= truth <= interval.high[0] + TOL


@pytest.mark.parametrize("n", [2, 3])
def test_dust_bound_tightens_the_without_replacement_low_and_stays_below_every_completion(n):
    """The dust low must beat the i.i.d. low somewhere (else the test of its validity would be vacuous)."""
    from theory.truncated import optimal_acceptance_interval

    gains = []
    for vocab, p, q, kp, kq in CASES[:8]:
        positions = top_k_positions(*top_k(p, kp), *top_k(q, kq), vocab)
        dust = optimal_acceptance_interval(positions, n, draft="wor")
        plain = optimal_acceptance_interval(positions, n, draft="wor", wor_low="iid")
        lowest, _ = brute_force(vocab, p, q, kp, kq, "wor", n)
        assert plain.low[0] <= dust.low[0] <= lowest + TOL
        gains.append(dust.low[0] - plain.low[0])
    assert max(gains) > 0.01


def split_dust_low(positions, n, tokens):
    """The former dust bound: alpha*_wor with q's tail split into ``tokens`` equal tokens (p = 0), minus the
    split's error n(n - 1)/(2 tokens) (docs/truncated_logs.md, section 3, step 3)."""
    from theory.multidraft import _sorted

    s, rows = positions, len(positions)
    p = np.concatenate([np.where(s.known_p, s.p, 0.0), s.p_rest[:, None], np.zeros((rows, tokens))], axis=1)
    q = np.concatenate(
        [
            np.where(s.known_q, s.q, 0.0),
            np.zeros((rows, 1)),
            np.repeat(s.q_rest[:, None] / tokens, tokens, 1),
        ],
        axis=1,
    )
    return _sorted(p, q, n, "wor") - np.where(s.q_rest > 0, n * (n - 1) / (2 * tokens), 0.0)


def long_tail_positions(seed, rows=6, vocab=200, concentration=0.05):
    """Top-12 / top-9 positions of peaked rows with some unlogged mass (V = 200)."""
    rng = np.random.default_rng(seed)
    p, q = (
        rng.dirichlet(np.full(vocab, concentration), size=rows),
        rng.dirichlet(np.full(vocab, concentration), size=rows),
    )
    tops = [top_k(row, 12) for row in p], [top_k(row, 9) for row in q]
    return top_k_positions(*(np.stack([t[i] for t in side]) for side in tops for i in (0, 1)), vocab)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_direct_dust_bound_is_at_least_the_split_dust_bound_and_its_limit(n):
    # The Poisson dust is the M -> oo limit of M tokens of r/M: the direct bound must lie above every split
    # bound (which subtracts the split's worst error) and within that error of the split's alpha*.
    from theory.truncated import _dust_low

    positions = long_tail_positions(40 + n)
    direct = _dust_low(positions, n)
    for tokens in (20, 400):
        split = split_dust_low(positions, n, tokens)
        slack = n * (n - 1) / (2 * tokens)
        assert np.all(direct >= split - 1e-12)
        assert np.all(direct <= split + slack + 1e-12)
    assert np.max(direct - split_dust_low(positions, n, 400)) > 0.5 * n * (n - 1) / 800  # the slack is gone


def test_split_dust_comparison_can_fail():
    # Negative control: a split bound without its error term exceeds the direct bound somewhere.
    from theory.truncated import _dust_low

    positions = long_tail_positions(43)
    tokens = 3
    unpenalised = split_dust_low(positions, 3, tokens) + 3 * 2 / (2 * tokens)
    assert np.any(unpenalised > _dust_low(positions, 3) + 1e-6)
