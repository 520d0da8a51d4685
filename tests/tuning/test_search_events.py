"""Accounting of a search against closed forms (no dp_accounting tuning code) and the
combination of per-configuration run events."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from scipy import optimize

from dpfair import accounting, tuning
from tests.tuning.conftest import BASE, METHOD, TRAIN, cfg, fast_event, make_dataset

INTEGER_ORDERS = list(range(2, 64)) + [128, 256]

# ------------------------------------------------------------- closed-form oracles (no
# dp_accounting tuning code): Papernot & Steinke, ICLR 2022, Theorem 2 (TNB) and Theorem 6
# (Poisson), with dp_accounting's order optimisation (min over λ̂ on the same order grid,
# then monotonicity in λ) and the RDP -> (ε, δ) conversion of Canonne-Kamath-Steinke
# (Prop. 12) that the accountant uses.


def oracle_gamma(eta: float, mu: float) -> float:
    if eta == 1:
        return 1 / mu

    def mean(g: float) -> float:
        if eta == 0:
            return (1 / g - 1) / math.log(1 / g)
        return eta * (1 - g) / (g * (1 - g**eta))

    return optimize.brentq(
        lambda g: mean(g) - mu,
        1e-300 if eta > 0 else 1e-12,
        1 - 1e-15,
        xtol=1e-300,
        rtol=1e-15,
        maxiter=1000,
    )


def base_rdp(q, sigma, steps, sigma_score, orders):
    """(λ, ε)-RDP of one run ∘ score release: Opacus's subsampled Gaussian + α/(2σ²)."""
    from opacus.accountants.analysis.rdp import compute_rdp  # lazy: workers load this file

    orders = np.asarray(orders, dtype=float)
    rdp = compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=list(orders))
    return np.asarray(rdp) + orders / (2 * sigma_score**2)


def oracle_to_eps(orders, rdp, delta):
    orders, rdp = np.asarray(orders, float), np.asarray(rdp, float)
    eps = rdp + np.log1p(-1 / orders) - np.log(delta * orders) / (orders - 1)
    return max(0.0, float(np.min(eps)))


def monotone(orders, rdp):
    out = rdp.copy()
    for i in range(len(orders)):
        out[i] = min(rdp[j] for j in range(len(orders)) if orders[j] >= orders[i])
    return out


def oracle_tnb(orders, rdp, eta, mu, delta):
    orders = np.asarray(orders, float)
    gamma = oracle_gamma(eta, mu)
    # ε' = ε + (1+η)(1 - 1/λ̂)ε̂ + (1+η) log(1/γ)/λ̂ + log(E[K])/(λ-1), best λ̂ on the grid
    hat = min(
        (1 + eta) * ((1 - 1 / lh) * eh + math.log(1 / gamma) / lh)
        for lh, eh in zip(orders, rdp, strict=True)
    )
    out = np.array([e + hat + math.log(mu) / (lam - 1) for lam, e in zip(orders, rdp, strict=True)])
    return oracle_to_eps(orders, monotone(orders, out), delta)


def oracle_delta(orders, rdp, eps_hat):
    log_best = 0.0
    for a, r in zip(orders, rdp, strict=True):
        cand = 0.5 * math.log(-math.expm1(-r)) if r > 0 else -math.inf
        if a > 1.01:
            cand = min(cand, (a - 1) * (r - eps_hat + math.log1p(-1 / a)) - math.log(a))
        log_best = min(log_best, cand)
    return math.exp(log_best)


def oracle_poisson(orders, rdp, mu, delta):
    orders = np.asarray(orders, float)
    out = []
    for lam, e in zip(orders, rdp, strict=True):
        # Theorem 6 needs each run (ε̂, δ̂)-DP with e^ε̂ <= 1 + 1/(λ-1): take equality
        d_hat = oracle_delta(orders, rdp, math.log1p(1 / (lam - 1)))
        out.append(e + mu * d_hat + math.log(mu) / (lam - 1))
    return oracle_to_eps(orders, np.array(out), delta)


def search_eps(q, sigma, steps, sigma_score, mode, eta, mu, delta, orders):
    c = tuning.TuningConfig(mode=mode, eta=eta, mu=mu, sigma_score=sigma_score)
    event = tuning.search_event(c, accounting.run_event(dp_event.GaussianDpEvent(sigma), q, steps))
    return accounting.epsilon(event, delta, orders=orders)


@pytest.mark.parametrize("eta", [-0.5, 0.0, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("mu", [1.5, 10.0, 100.0])
@pytest.mark.parametrize("sigma, steps", [(0.8, 200), (1.5, 2000)])
def test_tnb_epsilon_matches_theorem_2(eta, mu, sigma, steps):
    q, sigma_score, delta = 0.01, 5.0, 1e-6
    rdp = base_rdp(q, sigma, steps, sigma_score, INTEGER_ORDERS)
    want = oracle_tnb(INTEGER_ORDERS, rdp, eta, mu, delta)
    got = search_eps(q, sigma, steps, sigma_score, "tnb", eta, mu, delta, INTEGER_ORDERS)
    assert got == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("mu", [1.0, 5.0, 30.0])
@pytest.mark.parametrize("sigma, steps", [(0.8, 200), (1.5, 2000)])
def test_poisson_epsilon_matches_theorem_6(mu, sigma, steps):
    q, sigma_score, delta = 0.01, 5.0, 1e-6
    rdp = base_rdp(q, sigma, steps, sigma_score, INTEGER_ORDERS)
    want = oracle_poisson(INTEGER_ORDERS, rdp, mu, delta)
    got = search_eps(q, sigma, steps, sigma_score, "poisson", 0.0, mu, delta, INTEGER_ORDERS)
    assert got == pytest.approx(want, rel=1e-6)


def test_default_orders_and_fixed_mode():
    q, sigma, steps, ss, delta = 0.02, 1.0, 500, 8.0, 1e-5
    orders = accounting.DEFAULT_ORDERS
    per_run = dp_event.ComposedDpEvent(
        [accounting.run_event(dp_event.GaussianDpEvent(sigma), q, steps),
         accounting.score_release_event(ss)]
    )
    rdp = accounting.rdp_curve(per_run, orders)  # plain RDP accountant, no tuning code
    want = oracle_tnb(orders, rdp, 1.0, 10.0, delta)
    assert search_eps(q, sigma, steps, ss, "tnb", 1.0, 10.0, delta, orders) == pytest.approx(
        want, rel=1e-6
    )
    # the default figure is the tightest valid one: the privacy profile's, below RDP's
    assert search_eps(q, sigma, steps, ss, "tnb", 1.0, 10.0, delta, None) < want
    c = tuning.TuningConfig(mode="fixed", n_runs=7, sigma_score=ss)
    ev = tuning.search_event(c, accounting.run_event(dp_event.GaussianDpEvent(sigma), q, steps))
    assert accounting.rdp_epsilon(ev, delta) == pytest.approx(
        oracle_to_eps(orders, 7 * rdp, delta))
    assert accounting.epsilon(ev, delta) < accounting.rdp_epsilon(ev, delta)  # PLD
    # grid: no guarantee
    assert tuning.search_event(tuning.TuningConfig(mode="grid"), per_run) is None


def test_varying_batch_size_uses_max_of_events(tmp_path):
    ds = make_dataset()
    c = cfg(
        tmp_path,
        mode="fixed",
        n_runs=2,
        study_name="b",
        space={"batch_size": [20, 80]},
        score_privacy="public_validation",
    )
    job = tuning.prepare(METHOD, BASE, ds, c, TRAIN, event_fn=fast_event)
    run = accounting.event_from_json(job.run_event_json)
    a, b = (fast_event({**BASE, "batch_size": bs}, ds) for bs in (20, 80))
    want = np.maximum(accounting.rdp_curve(a), accounting.rdp_curve(b))
    assert np.allclose(accounting.rdp_curve(run), want)


def test_a_nonprivate_run_gives_a_nonprivate_search_with_no_guarantee():
    from dpfair.data import load_dataset
    from dpfair.training import TrainConfig
    from dpfair.tuning import search_events

    data = load_dataset("synthetic")
    config = TrainConfig(method={"name": "nonprivate"}, model={"name": "logistic_regression"},
                         epochs=1, batch_size=32)
    run = tuning.planned_run_event(config, data)
    assert isinstance(run, dp_event.NonPrivateDpEvent)
    dpsgd = TrainConfig(method={"name": "dpsgd"}, model={"name": "logistic_regression"},
                        epochs=1, batch_size=32, sigma=1.0)
    private = tuning.planned_run_event(dpsgd, data)
    assert isinstance(private, dp_event.SelfComposedDpEvent)
    combined = search_events.combine_run_events([private, run])
    assert isinstance(combined, dp_event.NonPrivateDpEvent)
    assert tuning.search_event(tuning.TuningConfig(), combined) is None
    assert accounting.epsilon(combined, 1e-5) == math.inf
