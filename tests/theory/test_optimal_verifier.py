"""The run-time optimal verifier: exact output law, acceptance = alpha*, exact selection marginal.

Oracles re-derived here, not taken from the implementation:

* the output law and the selection marginal by enumerating every i.i.d. draft tuple (``enumerate_drafts``)
  and weighting ``.conditional`` / ``.selection`` by the tuple probabilities;
* alpha* by brute force over all 2^V token sets, and by ``optimal_acceptance(..., draft="iid")``;
* the acceptance P(output in drafts) summed from ``.conditional``;
* Monte Carlo of ``.sample`` (coin flips, not draws from ``.conditional``) on real SmolLM2 pairs with fixed
  seeds, against ``.marginal`` and ``p``, with a perturbed-law negative control.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.goodness_of_fit import law_p_value
from tests.native import require_native_code
from theory import _native, check_lossless, optimal_acceptance, optimal_verifier, strategies
from theory.draft_laws import enumerate_drafts

module = importlib.import_module("theory.optimal_verifier")
DATA = Path(__file__).parent / "data" / "smollm2_pairs.npz"


def _normalised(weights) -> np.ndarray:
    weights = np.asarray(weights, dtype=np.float64)
    return weights / weights.sum()


@st.composite
def degenerate_pairs(draw):
    """The families that break verifiers (issue #9): one-hot p or q, disjoint supports, q ~ 1e-18, p = q,
    peaked q (q_max = 1 - 2.5e-7, max p/q ~ 1e20), alpha* = 1 with a tight set, ties, n above the draft's
    support, and q at the bottom of float64 (1e-300 to the subnormal 5e-324, where p/q overflows)."""
    vocab = draw(st.integers(2, 7))
    kind = draw(
        st.sampled_from(
            [
                "one_hot_p",
                "one_hot_q",
                "disjoint",
                "tiny_q",
                "equal",
                "peaked",
                "tight",
                "ties",
                "small_support",
                "negligible_q",
            ]
        )
    )
    base = draw(strategies.distribution_pairs(vocab_size=vocab, min_probability=0.0))
    p, q = base
    index = draw(st.integers(0, vocab - 1))
    if kind == "one_hot_p":
        p = np.eye(vocab)[index]
    elif kind == "one_hot_q":
        q = np.eye(vocab)[index]
    elif kind == "disjoint":
        split = draw(st.integers(1, vocab - 1))
        p = _normalised(np.r_[np.ones(split), np.zeros(vocab - split)] * (0.1 + p))
        q = _normalised(np.r_[np.zeros(split), np.ones(vocab - split)] * (0.1 + q))
    elif kind == "tiny_q":
        q = q.copy()
        q[index] = 1e-18
        q = _normalised(q)
    elif kind == "equal":
        q = p.copy()
    elif kind == "peaked":
        q = np.full(vocab, 2.5e-7 / (vocab - 1))
        q[index] = 1.0 - 2.5e-7
        p = _normalised(0.05 + p)
        p[index] = 1e-20
        p = _normalised(p)
    elif kind == "tight":  # p(H) = q(H)^n for H = the first k tokens: alpha* = 1 with a tight set
        q = _normalised(0.05 + q)
        k = draw(st.integers(1, vocab - 1))
        n = draw(st.integers(2, 4))
        mass = q[:k].sum()
        head = q[:k] / mass * mass**n
        tail = _normalised(0.05 + p[k:]) * (1.0 - mass**n)
        return np.r_[head, tail], q, n
    elif kind == "ties":
        q = _normalised(np.round(4 * q) + (np.round(4 * q).sum() == 0))
        p = _normalised(np.round(3 * p) + (np.round(3 * p).sum() == 0))
    elif kind == "negligible_q":  # some tokens drafted with q in [5e-324, 1e-300], often with sizeable p
        tiny = np.array(draw(st.lists(st.booleans(), min_size=vocab, max_size=vocab)))
        tiny[index], tiny[(index + 1) % vocab] = True, False
        q = _normalised(np.where(tiny, 0.0, 0.05 + q))
        q[tiny] = draw(st.sampled_from([5e-324, 1e-320, 1e-310, 2.2e-308, 1e-305, 1e-300]))
        if draw(st.booleans()):
            p = _normalised(np.where(tiny, 0.3, p))
    else:  # small_support: more drafts than tokens with q > 0
        q = np.eye(vocab)[index] * 0.7 + np.eye(vocab)[(index + 1) % vocab] * 0.3
    return p, q, draw(st.integers(1, 5))


@st.composite
def cases(draw):
    """Random pairs (V <= 7) and degenerate families, with n <= 5 and V^n kept enumerable."""
    if draw(st.booleans()):
        p, q, n = draw(degenerate_pairs())
    else:
        p, q = draw(strategies.distribution_pairs(vocab_size=st.integers(1, 7), min_probability=0.0))
        n = draw(st.integers(1, 5))
    support = int(np.count_nonzero(q))
    while n > 1 and support**n > 3000:
        n -= 1
    return p, q, n


def enumerated(v, q, n, draft="iid"):
    """Output law, selection marginal and acceptance of a built verifier, by enumerating the draft tuples of
    the law ``draft``."""
    tuples, probabilities = enumerate_drafts(q, n, draft)
    conditional = v.conditional(tuples)
    selection = np.zeros(q.shape[-1])
    np.add.at(selection, tuples, probabilities[:, None] * v.selection(tuples))
    in_drafts = np.zeros_like(conditional, dtype=bool)
    np.put_along_axis(in_drafts, tuples, True, axis=1)
    acceptance = float(probabilities @ np.sum(conditional * in_drafts, axis=1))
    return probabilities @ conditional, selection, acceptance


def brute_force_optimum(p, q, n):
    """alpha* = 1 + min over all 2^V token sets H of p(H) - q(H)^n."""
    vocab = p.shape[-1]
    sets = (np.arange(2**vocab)[:, None] >> np.arange(vocab)) & 1
    return float(1.0 + np.min(sets @ p - (sets @ q) ** n))


def _built(p, q, n, native_fit):
    """The verifier, its classes fitted natively (the default) or by numpy."""
    if native_fit:
        require_native_code()
    with _native.enabled(native_fit):
        return optimal_verifier(p, q, n)


BOTH_FITS = pytest.mark.parametrize("native_fit", [False, True], ids=["numpy-fit", "native-fit"])


@BOTH_FITS
@given(cases())
def test_output_law_equals_target_by_enumeration(native_fit, case):
    p, q, n = case
    v = _built(p, q, n, native_fit)
    output, _, _ = enumerated(v, q, n)
    np.testing.assert_allclose(output, p / p.sum(), rtol=0, atol=1e-12)


@given(cases())
def test_acceptance_reaches_the_optimum(case):
    p, q, n = case
    v = optimal_verifier(p, q, n)
    _, _, acceptance = enumerated(v, q, n)
    alpha = optimal_acceptance(p, q, n, draft="iid")
    assert abs(v.acceptance - alpha) <= 1e-9
    assert abs(acceptance - v.acceptance) <= 1e-12  # the exact route agrees with sum min(p, r)
    assert abs(v.alpha_star - brute_force_optimum(p, q, n)) <= 1e-12
    assert 0.0 <= v.shortfall <= 1e-9
    assert v.shortfall == pytest.approx(max(v.alpha_star - v.acceptance, 0.0), abs=1e-15)


@BOTH_FITS
@given(cases())
def test_marginal_equals_the_enumerated_selection_marginal(native_fit, case):
    p, q, n = case
    v = _built(p, q, n, native_fit)
    _, selection, _ = enumerated(v, q, n)
    np.testing.assert_allclose(v.marginal, selection, rtol=0, atol=1e-12)
    np.testing.assert_allclose(v.acceptance, np.minimum(p / p.sum(), v.marginal).sum(), atol=1e-15)


def perturbed(v, q, delta=1e-6):
    """A copy whose accept probabilities and residual are computed against r + delta (e_a - e_b), and ``a``.

    ``a`` is the drafted token with 0 < p(a) < r(a) of largest p(a)/r(a) (None if there is none), ``b`` the
    token of largest r among the others. The copy accepts ``a`` with probability p(a)/(r(a) + delta) and its
    residual has no mass on ``a``, so its output law at ``a`` is p(a) r(a)/(r(a) + delta): off by about
    delta p(a)/r(a).
    """
    r = v.marginal.copy()
    candidates = np.flatnonzero((q > 0) & (v.p > 0) & (v.p < r - delta))
    if candidates.size == 0:
        return None, None
    a = candidates[np.argmax(v.p[candidates] / r[candidates])]
    others = np.flatnonzero(np.arange(r.shape[-1]) != a)
    b = others[np.argmax(r[others])]
    r[a] += delta
    r[b] -= delta
    copy = object.__new__(type(v))
    copy.__dict__.update(v.__dict__)
    with np.errstate(over="ignore"):  # p / subnormal r = inf: accepted with probability 1
        copy.accept_probability = np.where(r > 0, np.minimum(1.0, v.p / np.where(r > 0, r, 1.0)), 1.0)
    excess = np.maximum(v.p - r, 0.0)
    copy.residual = excess / excess.sum() if excess.sum() > 0 else v.p
    return copy, a


@given(cases())
def test_check_lossless_passes_it_and_flags_a_perturbed_marginal(case):
    p, q, n = case
    v = optimal_verifier(p, q, n)
    report = check_lossless(lambda p_, q_, drafts: v.conditional(drafts), p, q, n)
    assert report.lossless, str(report)
    copy, a = perturbed(v, q)
    if copy is not None and v.p[a] >= 1e-2 * v.marginal[a]:
        bad = check_lossless(lambda p_, q_, drafts: copy.conditional(drafts), p, q, n)
        assert not bad.lossless, str(bad)
        assert bad.max_error >= 0.5e-6 * v.p[a] / v.marginal[a]


def test_batched_build_matches_row_by_row():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(6), size=(2, 3)), rng.dirichlet(np.ones(6), size=(2, 3))
    batch = optimal_verifier(p, q, 3)
    assert batch.marginal.shape == (2, 3, 6) and np.shape(batch.acceptance) == (2, 3)
    drafts = rng.integers(0, 6, size=(2, 3, 4, 3))
    conditional = batch.conditional(drafts)
    for i in range(2):
        for j in range(3):
            single = optimal_verifier(p[i, j], q[i, j], 3)
            np.testing.assert_allclose(batch.marginal[i, j], single.marginal, atol=1e-15)
            np.testing.assert_allclose(conditional[i, j], single.conditional(drafts[i, j]), atol=1e-15)
    assert batch.sample(drafts, np.random.default_rng(1)).shape == (2, 3, 4)


def test_bad_input_is_rejected_with_the_argument_named():
    v = optimal_verifier([0.5, 0.5], [0.5, 0.5], 2)
    with pytest.raises(ValueError, match="n must be"):
        optimal_verifier([0.5, 0.5], [0.5, 0.5], 0)
    with pytest.raises(ValueError, match="p contains negative"):
        optimal_verifier([1.5, -0.5], [0.5, 0.5], 2)
    with pytest.raises(ValueError, match="drafts must hold n = 2"):
        v.conditional([0, 1, 1])
    with pytest.raises(ValueError, match="token ids"):
        v.conditional([0, 2])
    with pytest.raises(ValueError, match="q = 0"):
        optimal_verifier([0.5, 0.5], [1.0, 0.0], 2).conditional([0, 1])
    with pytest.raises(ValueError, match="rng"):
        v.sample([0, 1], rng=0)


def test_lm_sized_pairs_reach_alpha_star():
    """A peaked V = 4096 pair (max p/q ~ 1e20, q_max = 1 - 2.5e-7) and a heavy-tailed one build and reach
    alpha* of the sort-based reference; the marginal sums to 1 and respects the class structure."""
    rng = np.random.default_rng(3)
    vocab = 4096
    logits = 3.0 * rng.standard_normal(vocab)
    p = _normalised(np.exp(logits - logits.max()))
    q = np.full(vocab, 2.5e-7 / (vocab - 1)) * _normalised(rng.random(vocab)) * vocab
    q[np.argmin(p)] = 0.0
    q = q / q.sum() * 2.5e-7
    q[np.argmin(p)] = 1.0 - 2.5e-7
    noisy = _normalised(np.exp((logits + 1.5 * rng.standard_normal(vocab)) / 0.7))
    for target, draft in ((p, q), (p, noisy)):
        for n in (2, 4, 8):
            v = optimal_verifier(target, draft, n)
            assert abs(v.alpha_star - optimal_acceptance(target, draft, n)) <= 1e-12
            assert v.shortfall <= 1e-9
            assert abs(v.marginal.sum() - 1.0) <= 1e-12


def test_negligible_draft_mass_is_demoted_and_alpha_star_reached():
    """Regression: a token with q = 5e-324 (p/q overflows) and p = 0.025 left the race fit 0.0144 short of
    alpha* at n = 4. Now it is demoted below every draft (r = 0, class -1); acceptance reaches alpha*, the law is
    exact by enumeration, and no overflow warning is raised (the theory tests make RuntimeWarnings errors)."""
    p = np.array([0.025, 0.025, 0.025, 0.875, 0.025, 0.025])
    q = np.array([5e-324, 0.00628930818, 0.00628930818, 0.471698113, 0.00628930818, 0.509433962])
    q[1:] /= q[1:].sum()
    for n in (2, 3, 4):
        v = optimal_verifier(p, q, n)
        output, _, acceptance = enumerated(v, q, n)
        np.testing.assert_allclose(output, p, rtol=0, atol=1e-12)
        assert v.marginal[0] == 0.0 and v.class_id[0] == -1
        assert abs(v.acceptance - brute_force_optimum(p, q, n)) <= 1e-12, n
        # A tuple of demoted tokens alone picks uniformly among them (no 0/0 in the race).
        np.testing.assert_array_equal(v.selection(np.zeros(n, dtype=int)), np.full(n, 1.0 / n))
    # Whole LM-sized rows (the bucketed path) with some tokens at q = 1e-310, and at the threshold's edge.
    rng = np.random.default_rng(5)
    logits = 3.0 * rng.standard_normal(4096)
    p = _normalised(np.exp(logits - logits.max()))
    q = _normalised(np.exp(logits + rng.standard_normal(4096)))
    demoted = rng.choice(4096, 40, replace=False)
    q[demoted] = 0.0
    q /= q.sum()
    q[demoted[:20]], q[demoted[20:]] = 1e-310, module.NEGLIGIBLE_Q * 0.5
    for n in (2, 4):
        v = optimal_verifier(p, q, n)
        assert np.all(v.marginal[demoted] == 0.0) and np.all(v.class_id[demoted] == -1)
        assert abs(v.acceptance - optimal_acceptance(p, q, n)) <= 1e-9
        assert abs(v.marginal.sum() - 1.0) <= 1e-12


def _sweep_pair(draw, vocab=49_152):
    """The ``draw``-th pair of the issue #9 robustness sweep: ``default_rng(7)``, Gaussian logits of scale in
    {1, 3, 6, 12}, draft noise in {0.3, 1.5, 4}, temperature in {0.3, 0.7, 1, 1.5}."""
    rng = np.random.default_rng(7)
    for _ in range(draw + 1):
        scale, noise = rng.choice([1.0, 3.0, 6.0, 12.0]), rng.choice([0.3, 1.5, 4.0])
        temperature = rng.choice([0.3, 0.7, 1.0, 1.5])
        logits = scale * rng.standard_normal(vocab)
        draft = logits + noise * rng.standard_normal(vocab)
    p = np.exp((logits - logits.max()) / temperature)
    q = np.exp((draft - draft.max()) / temperature)
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("n", [2, 4, 8])
def test_very_peaked_pairs_build_few_units_and_stay_exact(monkeypatch, n):
    """Regression (issue #9 robustness sweep): on the 8th sweep pair (scale 12, noise 1.5, T = 0.3) the chain
    check took the whole-class sum (renormalised anyway) for a polytope violation and split the 7869-item top
    class into single items: 34 s and 2-3 GB per build; on the 9th (scale 12, noise 0.3, T = 1.5) the fit then
    went token by token over 49125 units (OOM at 23 GB). Now every fit has at most MAX_UNITS units, the 8th pair
    fits under 128 (the split no longer fires) and reaches alpha* to 1e-10, and the 9th builds and reports its
    shortfall (1.5e-6 to 1.9e-6 with the cap; its alpha* = 1 - 1.5e-10 to 1 leaves the fit too little room)."""
    seen = []
    fit = module.fit_log_weights
    monkeypatch.setattr(module, "fit_log_weights", lambda *a: (seen.append(a[1].shape[0]), fit(*a))[1])
    native_builds = module._native.build_items, module._native.build_row
    for draw, most, shortfall in ((7, 128, 1e-10), (8, module.MAX_UNITS, 5e-6)):
        p, q = _sweep_pair(draw)
        for counted in (True, False):  # numpy's code around the fits (units counted), then the native build
            seen.clear()
            for name, build in zip(("build_items", "build_row"), native_builds, strict=True):
                monkeypatch.setattr(module._native, name, (lambda *a: None) if counted else build)
            v = optimal_verifier(p, q, n)
            if counted:
                assert max(seen) <= most, (draw, seen)
            assert abs(v.alpha_star - optimal_acceptance(p, q, n)) <= 1e-12
            assert abs(v.marginal.sum() - 1.0) <= 1e-12 and np.all(v.marginal >= 0)
            assert abs(v.acceptance - np.minimum(p, v.marginal).sum()) <= 1e-12
            assert v.shortfall <= shortfall, (draw, v.shortfall)
    monkeypatch.setattr(module._native, "build_items", lambda *a: None)
    monkeypatch.setattr(module._native, "build_row", lambda *a: None)
    # Such pairs ask for hundreds of units with the cap lifted (a V = 4096 pair of the family of the 14th sweep
    # pair: scale 3, noise 0.3, T = 1.5; 434 units at n = 4): the cap is what binds on them, not the binning.
    seen.clear()
    monkeypatch.setattr(module, "MAX_UNITS", 10**6)
    rng = np.random.default_rng(0)
    logits = 3.0 * rng.standard_normal(4096)
    draft = logits + 0.3 * rng.standard_normal(4096)
    optimal_verifier(_normalised(np.exp(logits / 1.5)), _normalised(np.exp(draft / 1.5)), n)
    assert max(seen) > 256, seen


def _close_pair(vocab, noise, seed=0):
    """A close, full-vocabulary draft: the target's Gaussian logits (scale 3) plus noise of scale ``noise``."""
    rng = np.random.default_rng(seed)
    logits = 3.0 * rng.standard_normal(vocab)
    draft = logits + noise * rng.standard_normal(vocab)
    return _normalised(np.exp(logits - logits.max())), _normalised(np.exp(draft - draft.max()))


@pytest.mark.parametrize(("noise", "n"), [(0.05, 2), (0.05, 8), (0.3, 8)])
def test_one_weight_per_token_reaches_alpha_star_on_close_drafts_where_units_fall_short(noise, n):
    """alpha* = 1 on these V = 4096 pairs, so r must equal p token by token: the unit fit (at most MAX_UNITS
    units sharing r/q) stops 2e-5 to 1.2e-4 short (item_fit=False, the negative control), and the per-item
    fit that follows it reaches alpha* to 1e-12, with the marginal still a distribution whose classes carry
    their selection probabilities."""
    p, q = _close_pair(4096, noise)
    units = optimal_verifier(p, q, n, item_fit=False)
    assert units.shortfall > 1e-6
    v = optimal_verifier(p, q, n)
    assert v.alpha_star == pytest.approx(1.0, abs=1e-15) and v.shortfall <= 1e-12
    assert abs(v.acceptance - np.minimum(p, v.marginal).sum()) <= 1e-12
    assert np.all(v.marginal >= 0) and abs(v.marginal.sum() - 1.0) <= 1e-12


def test_bad_item_fit_is_rejected():
    with pytest.raises(ValueError, match="item_fit"):
        optimal_verifier([0.5, 0.5], [0.5, 0.5], 2, item_fit="no")


def test_the_per_item_fit_is_exact_by_enumeration(monkeypatch):
    """Forced on every class of two or more items (units of one item at most, every fit followed by a retry
    and the per-item fit), on 40 random pairs (V = 6, n = 2-4): the output law is p to 1e-12, the marginal is
    the enumerated selection marginal, the acceptance reaches alpha* to 1e-9, and the per-item fit ran."""
    calls = []
    by_item = module._fit_class_by_item
    monkeypatch.setattr(module, "MAX_OWN_UNITS", 1)
    monkeypatch.setattr(module, "RETRY_SHORTFALL", -1.0)
    monkeypatch.setattr(module, "_fit_class_by_item", lambda *a: (calls.append(a[2] - a[1]), by_item(*a))[1])
    rng = np.random.default_rng(8)
    for _ in range(40):
        p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(0.5 * np.ones(6))
        n = int(rng.integers(2, 5))
        v = optimal_verifier(p, q, n, group_below=0.0)
        output, selection, _ = enumerated(v, q, n)
        np.testing.assert_allclose(output, p, rtol=0, atol=1e-12)
        np.testing.assert_allclose(v.marginal, selection, rtol=0, atol=1e-12)
        assert v.shortfall <= 1e-9
    assert len(calls) >= 40 and max(calls) >= 2


# ---------------------------------------------------------------------------------------------------------
# Monte Carlo on real SmolLM2 pairs (top 24 tokens of p and q plus each side's rest; see experiments.real_pairs)

STEPS = 100_000
THRESHOLD = 1e-3  # p-values below this fail; 16 checks at fixed seeds


def real_pairs():
    data = np.load(DATA)
    return [(data["p"][i], data["q"][i]) for i in (1, 3, 5, 7)]


@pytest.mark.parametrize("pair_index", range(4))
@pytest.mark.parametrize("n", [2, 4])
def test_monte_carlo_selection_and_output_follow_r_and_p(pair_index, n):
    p, q = real_pairs()[pair_index]
    v = optimal_verifier(p, q, n)
    assert v.shortfall <= 1e-12
    rng = np.random.default_rng(1000 * pair_index + n)
    drafts = rng.choice(q.shape[-1], size=(STEPS, n), p=q)
    tokens, selected = v.sample(drafts, rng, return_selected=True)
    vocab = q.shape[-1]
    assert law_p_value(np.bincount(selected, minlength=vocab), v.marginal) > THRESHOLD
    assert law_p_value(np.bincount(tokens, minlength=vocab), p) > THRESHOLD
    accepted = np.any(drafts == tokens[:, None], axis=1).mean()
    assert abs(accepted - v.acceptance) < 5 * np.sqrt(v.acceptance * (1 - v.acceptance) / STEPS) + 1e-12


def test_monte_carlo_negative_control_detects_a_perturbed_law():
    """The same test rejects the counts when the law is off by 2e-2 on the most likely token."""
    p, q = real_pairs()[3]
    v = optimal_verifier(p, q, 2)
    rng = np.random.default_rng(7)
    drafts = rng.choice(q.shape[-1], size=(STEPS, 2), p=q)
    tokens, selected = v.sample(drafts, rng, return_selected=True)
    top = int(np.argmax(p))
    wrong_p = p.copy()
    wrong_p[top] -= 2e-2
    wrong_p[np.argsort(p)[-2]] += 2e-2
    wrong_r = v.marginal.copy()
    wrong_r[int(np.argmax(wrong_r))] -= 2e-2
    wrong_r[np.argsort(v.marginal)[-2]] += 2e-2
    assert law_p_value(np.bincount(tokens, minlength=p.shape[-1]), wrong_p) < 1e-6
    assert law_p_value(np.bincount(selected, minlength=p.shape[-1]), wrong_r) < 1e-6


def test_quadrature_matches_the_bradley_terry_closed_form():
    """n = 2 has the closed form; the quadrature (used for n >= 3) must agree with it to round-off."""
    race = importlib.import_module("theory._race")
    rng = np.random.default_rng(5)
    for _ in range(20):
        units = int(rng.integers(2, 40))
        masses = _normalised(rng.random(units) ** 4) * rng.uniform(0.1, 1.0)
        lower = float(rng.uniform(0.0, 1.0 - masses.sum()))
        log_weights = 10.0 * rng.standard_normal(units)
        closed = race.race_marginal(lower, masses, log_weights, 2)
        nodes = race._nodes(log_weights)[None, :]
        clock = np.exp(log_weights)[:, None] * nodes
        phi = lower + masses @ np.exp(-clock)
        quadrature = 2 * masses * race.STEP * (clock * np.exp(-clock) * phi[None, :]).sum(axis=1)
        np.testing.assert_allclose(quadrature, closed, rtol=1e-15, atol=1e-16)


def test_verifier_optimal_is_the_run_time_construction_and_the_lp_stays_an_oracle():
    from theory import verifier

    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    runtime, oracle = verifier("optimal"), verifier("optimal", method="lp")
    assert type(runtime).__name__ == "RuntimeOptimalVerifier" and runtime.draft == "iid"
    assert type(oracle).__name__ == "OptimalTransportVerifier"
    assert runtime.acceptance(p, q, 3) == pytest.approx(oracle.acceptance(p, q, 3), abs=1e-12)
    np.testing.assert_allclose(runtime.output_distribution(p, q, 3), p, atol=1e-12)
    drafts, token = runtime.sample(p, q, 2, np.random.default_rng(0))
    assert drafts.shape == (2,) and isinstance(token, int)
    assert np.ndim(optimal_verifier(p, q, 2).sample(np.array([0, 2]), np.random.default_rng(0))) == 0
