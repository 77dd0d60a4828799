"""theory._token_race: the race with one weight per item, against theory._race's dense forms.

Oracles: :func:`theory._race.race_marginal` and its Jacobian (the same quadrature for n >= 3, the closed
Bradley--Terry form for n = 2), the block size (any gives the same numbers), and the fit's own target.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import optimal_acceptance
from theory._race import race_marginal

token_race = importlib.import_module("theory._token_race")


@st.composite
def races(draw):
    """A class of 1-40 units: masses over four decades, log-weights spread up to 60, a lower mass, n."""
    size = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    masses = 10.0 ** rng.uniform(-4, 0, size) / size
    log_weights = draw(st.sampled_from([1.0, 10.0, 60.0])) * rng.uniform(-1, 1, size)
    lower = draw(st.sampled_from([0.0, 0.05, 0.7]))
    return lower, masses, log_weights, draw(st.integers(2, 8))


@settings(max_examples=200, deadline=None)
@given(races())
def test_item_marginal_and_its_slope_are_the_dense_race_and_its_jacobian_diagonal(race):
    lower, masses, log_weights, n = race
    r, slopes = token_race.item_marginal(lower, masses, log_weights, n, derivative=True)
    dense, jacobian = race_marginal(lower, masses, log_weights, n, jacobian=True)
    # n = 2: the integral against the closed form (the quadrature's own error, 1e-15 of the scale).
    np.testing.assert_allclose(r, dense, rtol=1e-13 if n == 2 else 1e-15, atol=1e-300)
    scale = max(np.abs(np.diag(jacobian)).max(), dense.max())  # one unit alone: its slope is 0
    np.testing.assert_allclose(slopes, np.diag(jacobian), rtol=1e-9, atol=1e-12 * scale)


def test_blocks_of_any_size_give_the_same_marginal(monkeypatch):
    rng = np.random.default_rng(4)
    masses, log_weights = rng.dirichlet(np.ones(500)) * 0.6, 5.0 * rng.standard_normal(500)
    whole = token_race.item_marginal(0.2, masses, log_weights, 4)
    monkeypatch.setattr(token_race, "CHUNK", 7)
    np.testing.assert_allclose(token_race.item_marginal(0.2, masses, log_weights, 4), whole, rtol=1e-14)


def _close_pair(vocab, noise, seed=0):
    rng = np.random.default_rng(seed)
    logits = 3.0 * rng.standard_normal(vocab)
    draft = logits + noise * rng.standard_normal(vocab)
    p, q = np.exp(logits - logits.max()), np.exp(draft - draft.max())
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize(("noise", "n"), [(0.05, 2), (0.05, 8), (0.3, 8)])
def test_the_fit_reaches_a_per_token_target_units_cannot(noise, n):
    """One class of 2,048 tokens, no lower class, target r = p (a close draft with alpha* = 1: every
    prefix's gap p(H) - q(H)^n is >= 0, so r = p is a race marginal and the construction asks for it): from
    the naive start log(p/q) the sweeps reach sum |r - p| <= 1e-13, and the marginal returned is the exact
    one of the weights returned. (At noise 0.3 and n = 2, alpha* < 1 and r = p is not reachable.)"""
    p, q = _close_pair(2048, noise)
    assert optimal_acceptance(p, q, n) == pytest.approx(1.0, abs=1e-15)
    log_weights, r = token_race.fit_item_log_weights(0.0, q, p, n, np.log(p / q))
    assert np.abs(r - p).sum() <= 1e-13
    np.testing.assert_array_equal(r, token_race.item_marginal(0.0, q, log_weights, n))
    assert log_weights.max() == 0.0 and log_weights.min() >= -token_race.FLOOR


def test_a_target_out_of_reach_stops_at_the_best_point():
    """A zero target on one unit (its weight can only sink to -FLOOR): the fit stops when no step helps and
    returns finite weights whose marginal is exact and closer to the target than the start's."""
    masses = np.array([0.5, 0.3, 0.2])
    target = np.array([0.6, 0.4, 0.0])  # sums to the class's mass (0 + 1)^3 - 0^3
    start = np.zeros(3)
    log_weights, r = token_race.fit_item_log_weights(0.0, masses, target, 3, start)
    assert np.all(np.isfinite(log_weights))
    before = np.abs(token_race.item_marginal(0.0, masses, start, 3) - target).sum()
    assert np.abs(r - target).sum() < before
    np.testing.assert_array_equal(r, token_race.item_marginal(0.0, masses, log_weights, 3))
