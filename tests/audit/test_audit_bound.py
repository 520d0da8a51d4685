"""The one-run bound (Steinke, Nasr & Jagielski 2023) against closed forms and simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from dpfair.audit import bound


def test_pure_epsilon_p_value_is_the_binomial_tail():
    # all r guesses right: P[Bin(r, q) >= r] = q^r
    q = special.expit(1.3)
    assert bound.p_value(100, 20, 20, 1.3, 0.0) == pytest.approx(q**20)
    # the δ term only adds
    assert bound.p_value(100, 20, 15, 1.3, 1e-4) > bound.p_value(100, 20, 15, 1.3, 0.0)


@pytest.mark.parametrize("r, beta", [(10, 0.05), (50, 0.05), (200, 0.01)])
def test_all_correct_gives_the_closed_form_bound(r, beta):
    # q^r = beta  <=>  eps = logit(beta^(1/r))
    expected = special.logit(beta ** (1 / r))
    assert expected - 1e-6 <= bound.epsilon_lower_bound(r, r, r, beta, 0.0) <= expected


@pytest.mark.parametrize("m, r, v, delta", [(100, 20, 16, 0.0), (1000, 200, 150, 1e-6),
                                            (1000, 500, 420, 1e-5), (50, 50, 41, 1e-6),
                                            (5000, 2500, 1800, 1e-6)])
def test_the_bound_is_rounded_down(m, r, v, delta):
    """The reported ε is itself rejected (p-value <= β) and lies within 1e-6 of the first ε
    that is not: a lower bound must never be rounded up."""
    eps = bound.epsilon_lower_bound(m, r, v, 0.05, delta)
    assert 0 < eps < 50
    assert bound.p_value(m, r, v, eps, delta) <= 0.05 < bound.p_value(m, r, v, eps + 1e-6, delta)
    if delta > 0:
        mu = bound.mu_lower_bound(eps, delta)
        assert bound.gdp_delta(mu, eps) <= delta < bound.gdp_delta(mu + 1e-6, eps)


def test_the_ceiling_of_an_audit_and_the_canaries_that_give_it_power():
    fractions = [0.1, 0.25, 0.5]
    # 20 canaries: 10 guesses all right at beta / 3, closed form logit((beta / 3)^(1/10))
    assert bound.max_certifiable(20, fractions, 0.05, 0.0) == pytest.approx(
        special.logit((0.05 / 3) ** (1 / 10)), abs=1e-6)
    assert bound.max_certifiable(20, fractions, 0.05, 1e-6) < 0.7
    assert bound.max_certifiable(1000, fractions, 0.05, 1e-6) > 4.7
    m = bound.canaries_for_power(3.0, 1.0, 0.8, fractions, 0.05, 1e-6, 100_000)
    assert bound.detection_power(m, 3.0, 1.0, fractions, 0.05, 1e-6) >= 0.8
    assert bound.detection_power(m // 2, 3.0, 1.0, fractions, 0.05, 1e-6) < 0.8
    assert bound.max_certifiable(m, fractions, 0.05, 1e-6) > 3.0  # power needs more than that
    assert bound.canaries_for_power(30.0, 1.0, 0.8, fractions, 0.05, 1e-6, 500) is None


def test_chance_level_guesses_bound_nothing_and_more_correct_bound_more():
    assert bound.epsilon_lower_bound(1000, 200, 100, 0.05, 1e-6) == 0.0
    bounds = [bound.epsilon_lower_bound(1000, 200, v, 0.05, 1e-6) for v in (120, 150, 180)]
    assert 0 < bounds[0] < bounds[1] < bounds[2]


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="v <= r <= m"):
        bound.p_value(10, 20, 5, 1.0, 0.0)
    with pytest.raises(ValueError, match="beta"):
        bound.epsilon_lower_bound(10, 10, 5, 1.5, 0.0)


def test_the_bound_holds_for_randomised_response():
    """Canaries behind ε-randomised response (a guess is right w.p. e^ε/(1+e^ε), the worst
    case of ε-DP): the lower bound exceeds ε in at most about β of the audits."""
    rng = np.random.default_rng(0)
    eps, m, beta, audits = 1.0, 400, 0.1, 200
    above = 0
    for _ in range(audits):
        included = rng.random(m) < 0.5
        truthful = rng.random(m) < special.expit(eps)
        scores = np.where(truthful == included, 1.0, -1.0) + rng.normal(0, 1e-3, m)
        found = bound.best_guesses(scores, included, [1.0], beta, 0.0)
        above += found.epsilon > eps
    assert above <= beta * audits + 3 * math.sqrt(beta * (1 - beta) * audits)
    # and the audit is not vacuous: it finds a good share of ε
    assert found.epsilon > 0.3


def test_guesses_split_top_and_bottom_and_pay_for_each_fraction():
    scores = np.arange(10.0)
    included = scores >= 5  # perfectly separated
    assert bound.guess(scores, included, 4) == (4, 4)
    assert bound.guess(scores, ~included, 4) == (4, 0)
    one = bound.best_guesses(scores, included, [1.0], 0.05, 0.0)
    three = bound.best_guesses(scores, included, [1.0, 0.5, 0.2], 0.05, 0.0)
    assert (one.r, one.v) == (10, 10)
    assert three.epsilon < one.epsilon  # Bonferroni: beta / 3


def test_gaussian_view_inverts_the_gdp_curve():
    mu = bound.mu_lower_bound(1.0, 1e-5)
    assert bound.gdp_delta(mu, 1.0) == pytest.approx(1e-5, rel=1e-3)
    assert bound.mu_lower_bound(0.0, 1e-5) == 0.0
    assert bound.mu_lower_bound(2.0, 1e-5) > mu
