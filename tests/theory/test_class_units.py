"""Units of a class of the optimal verifier (``theory._class_units``): the cap on their number.

Oracles: direct sums over the items (masses and targets are conserved by merging), the ratio order (only
neighbours in target ratio merge), and, on whole builds with a tiny cap, the class selection masses
:math:`q_{hi}^n - q_{lo}^n` summed from the marginal by class and alpha* from ``optimal_acceptance``.
"""

from __future__ import annotations

import importlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import optimal_acceptance, optimal_verifier

units = importlib.import_module("theory._class_units")
module = importlib.import_module("theory.optimal_verifier")


@settings(max_examples=200)
@given(
    st.integers(1, 60).flatmap(
        lambda size: st.tuples(
            st.lists(st.integers(0, 40), min_size=size, max_size=size),
            st.lists(st.floats(1e-12, 1.0), min_size=size, max_size=size),
            st.lists(st.floats(0.0, 1e3), min_size=size, max_size=size),
        )
    ),
    st.integers(1, 50),
)
def test_capped_units_never_exceed_the_cap_and_conserve_masses_and_targets(data, cap):
    raw_labels, qs, ratios = data
    labels = units._compact(np.array(raw_labels))
    qs = np.array(qs)
    unit_q = np.bincount(labels, weights=qs)
    unit_target = unit_q * np.array(ratios)[: unit_q.shape[0]]
    new_labels, new_q, new_target = units._cap_units(labels, qs, unit_q, unit_target, cap)
    assert new_q.shape[0] <= max(cap, 1) and new_q.shape[0] == new_target.shape[0]
    assert new_q.shape[0] == min(cap, unit_q.shape[0])
    np.testing.assert_allclose(
        new_q, np.bincount(new_labels, weights=qs, minlength=new_q.shape[0]), rtol=1e-12
    )
    assert abs(new_q.sum() - qs.sum()) <= 1e-12 * qs.sum()
    assert abs(new_target.sum() - unit_target.sum()) <= 1e-12 * max(unit_target.sum(), 1e-300)
    # Each old unit lands in exactly one new unit, and new units are intervals of the target-ratio order.
    merged = np.zeros(unit_q.shape[0], dtype=np.int64)
    merged[labels] = new_labels
    assert np.array_equal(merged[labels], new_labels)
    ratio = unit_target / unit_q
    order = np.argsort(ratio, kind="stable")
    runs = merged[order]
    assert np.all(np.diff(runs) >= 0) if cap < unit_q.shape[0] else True


def _gaussian_pair(rng, vocab, scale, noise, temperature):
    logits = scale * rng.standard_normal(vocab)
    draft = logits + noise * rng.standard_normal(vocab)
    p = np.exp((logits - logits.max()) / temperature)
    q = np.exp((draft - draft.max()) / temperature)
    return p / p.sum(), q / q.sum()


def _check_exact(v, p, q, n):
    """alpha* of the sort-based reference, r sums to 1, every class selected with q_hi^n - q_lo^n, and
    acceptance = sum min(p, r)."""
    assert abs(v.alpha_star - optimal_acceptance(p, q, n)) <= 1e-12
    r = v.marginal
    assert np.all(r >= 0) and abs(r.sum() - 1.0) <= 1e-12
    classes = v.class_id
    lower = 0.0
    for c in np.unique(classes[classes >= 0]):
        mass = q[classes == c].sum()
        expected = (lower + mass) ** n - lower**n
        assert abs(r[classes == c].sum() - expected) <= 1e-12, (c, r[classes == c].sum(), expected)
        lower += mass
    assert abs(v.acceptance - np.minimum(p, r).sum()) <= 1e-12


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([1.0, 3.0, 12.0]),
    st.sampled_from([0.3, 1.5]),
    st.sampled_from([0.3, 1.5]),
    st.sampled_from([2, 4, 8]),
    st.integers(1, 12),
)
def test_no_class_fit_exceeds_the_unit_cap_and_the_build_stays_exact(seed, scale, noise, temperature, n, cap):
    p, q = _gaussian_pair(np.random.default_rng(seed), 400, scale, noise, temperature)
    seen = []
    fit, limit = module.fit_log_weights, module.MAX_UNITS
    module.fit_log_weights = lambda lower, masses, target, n: (
        seen.append(masses.shape[0]),
        fit(lower, masses, target, n),
    )[1]
    module.MAX_UNITS = cap
    try:
        v = optimal_verifier(p, q, n, group_below=0.0)  # token by token: classes of up to 400 items
    finally:
        module.fit_log_weights, module.MAX_UNITS = fit, limit
    # Classes of at most MAX_OWN_UNITS items keep one unit per item; larger ones are capped.
    assert all(count <= max(cap, units.MAX_OWN_UNITS) for count in seen)
    _check_exact(v, p, q, n)
