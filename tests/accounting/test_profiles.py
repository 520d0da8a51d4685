"""The privacy-profile bound of private selection (Koskela, Redberg & Wang 2024) on a Gaussian
base run, whose selection has an exact profile by quadrature: never below it, below RDP
(Papernot & Steinke), and the search's ε through ``accounting`` names its accountant."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from scipy import stats

from dpfair.accounting import accountant as acc
from dpfair.accounting.profiles import Rounds, selection_profile
from dpfair.tuning import TuningConfig, search_event


def gaussian_profile(sigma: float):
    """Exact δ(ε) of the Gaussian mechanism, sensitivity 1 (Balle & Wang 2018, Theorem 8)."""
    a = 1 / (2 * sigma)

    def delta(eps: np.ndarray) -> np.ndarray:
        return stats.norm.cdf(a - eps * sigma) - np.exp(eps) * stats.norm.cdf(-a - eps * sigma)

    return delta


def exact_selection_delta(sigma: float, rounds: Rounds, eps: np.ndarray) -> np.ndarray:
    """δ(ε) of the best of K draws of N(x, σ²), x ∈ {0, 1}, ranked by the draw (both
    directions; ranking by the smallest draw is the mirror image, the other direction)."""
    dphi = rounds.pgf_derivative()
    y = np.linspace(-10 * sigma - 30, 10 * sigma + 31, 200_001)
    dy = y[1] - y[0]
    a0 = stats.norm.pdf(y, 0, sigma) * dphi(stats.norm.cdf(y, 0, sigma))
    a1 = stats.norm.pdf(y, 1, sigma) * dphi(stats.norm.cdf(y, 1, sigma))
    out = []
    for e in eps:
        out.append(max(np.sum(np.maximum(a0 - math.exp(e) * a1, 0)),
                       np.sum(np.maximum(a1 - math.exp(e) * a0, 0))) * dy)
    return np.array(out)


def epsilon_at(eps: np.ndarray, delta: np.ndarray, target: float) -> float:
    return float(eps[int(np.argmax(delta <= target))])


ROUNDS = [
    Rounds("tnb", mean=10.0, eta=1.0),
    Rounds("tnb", mean=10.0, eta=0.0),
    Rounds("tnb", mean=5.0, eta=-0.5),
    Rounds("poisson", mean=10.0),
    Rounds("binomial", n=20, p=0.5),
]


@pytest.mark.parametrize("rounds", ROUNDS, ids=lambda r: f"{r.kind}-{r.mean}-{r.eta}-{r.n}")
@pytest.mark.parametrize("sigma", [0.7, 2.0])
def test_bound_is_never_below_the_exact_profile(rounds, sigma):
    eps, bound = selection_profile(gaussian_profile(sigma), rounds, 0.01, 30.0)
    check = np.arange(0, len(eps), 25)
    exact = exact_selection_delta(sigma, rounds, eps[check])
    assert np.all(bound[check] >= exact * (1 - 1e-6) - 1e-12)


def selection_event(rounds: Rounds, sigma: float) -> dp_event.DpEvent:
    base = dp_event.GaussianDpEvent(sigma)
    if rounds.kind == "binomial":
        return acc.BinomialSelectDpEvent(base, rounds.n, rounds.p)
    shape = math.inf if rounds.kind == "poisson" else rounds.eta
    return dp_event.RepeatAndSelectDpEvent(base, rounds.mean, shape)


@pytest.mark.parametrize("rounds", ROUNDS, ids=lambda r: f"{r.kind}-{r.mean}-{r.eta}-{r.n}")
@pytest.mark.parametrize("sigma", [0.7, 2.0, 5.0])
def test_bound_beats_renyi_dp(rounds, sigma):
    """Papernot & Steinke's RDP bound (dp_accounting; η < 0 through dpfair's own walk); for a
    binomial K, where no such bound exists, RDP of the n runs composed (K <= n)."""
    delta = 1e-6
    eps, bound = selection_profile(gaussian_profile(sigma), rounds, 0.01, 40.0)
    event = selection_event(rounds, sigma)
    if rounds.kind == "binomial":
        n_runs = dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(sigma), rounds.n)
        assert acc.rdp_epsilon(event, delta) == pytest.approx(acc.rdp_epsilon(n_runs, delta))
    assert epsilon_at(eps, bound, delta) < acc.rdp_epsilon(event, delta)
    if sigma != 2.0:
        return
    # through the accountant (the bound turned into a PLD): the same figure, named
    spend = acc.spend(event, delta)
    assert spend.accountant == acc.ACCOUNTANT_PROFILE
    assert epsilon_at(eps, bound, delta) - 0.02 <= spend.epsilon <= epsilon_at(eps, bound, delta)


def test_pgf_derivative_at_one_is_the_mean():
    for rounds in ROUNDS:
        assert rounds.pgf_derivative()(np.array([1.0]))[0] == pytest.approx(rounds.expected)
    # the TNB pgf: φ'(1) = Σ k P(K = k) with Papernot & Steinke's probabilities (η = 0.5)
    eta, mean = 0.5, 4.0
    gamma = acc.tnb_gamma(eta, mean)
    p = eta * (1 - gamma) / math.expm1(-eta * math.log(gamma))
    total, k, z = 0.0, 1, 0.3
    while p > 1e-18:
        total += k * p * z ** (k - 1)
        p *= (1 - gamma) * (k + eta) / (k + 1)
        k += 1
    assert Rounds("tnb", mean, eta).pgf_derivative()(np.array([z]))[0] == pytest.approx(total)


@pytest.mark.parametrize("law", [{"mode": "tnb", "eta": 1.0}, {"mode": "tnb", "eta": 0.0},
                                 {"mode": "poisson"}, {"mode": "binomial", "n_runs": 20, "p": 0.5}])
def test_search_epsilon_uses_the_profile_and_beats_rdp(law):
    run = acc.run_event(dp_event.GaussianDpEvent(1.0), 256 / 36_000, 2820)
    event = search_event(TuningConfig(**law, mu=10.0, sigma_score=10.0), run)
    assert acc.event_from_json(acc.event_to_json(event)) == event
    spend = acc.spend(event, 1e-6)
    assert spend.accountant == acc.ACCOUNTANT_PROFILE
    assert acc.epsilon(run, 1e-6) < spend.epsilon < acc.rdp_epsilon(event, 1e-6)
