"""fairness/noisy.py: the Gaussian release of test metrics, its sensitivity and its epsilon."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp
from scipy.stats import norm

from dpfair import accounting
from dpfair.fairness import rates
from dpfair.fairness.noisy import (
    COUNTS_SENSITIVITY,
    SENSITIVITY,
    calibrate,
    noisy_group_metrics,
    release_event,
)
from tests.conftest import epsilon_oracle


def _data(n: int = 400, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    pred = np.where(rng.random(n) < 0.8, y, 1 - y)
    g = rng.integers(0, 3, n)
    loss = rng.exponential(0.5, n)
    return y, pred, g, loss


def test_epsilon_is_the_composed_gaussian_of_dp_accounting():
    z, releases, delta = 4.0, 6, 1e-5
    ours = accounting.epsilon(release_event(z, releases), delta)
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z), releases)
    assert ours == pytest.approx(epsilon_oracle(release_event(z, releases), delta=delta),
                                 rel=1e-4)
    assert ours < acc.get_epsilon(delta)  # PLD, below RDP
    # closed form of the Gaussian's RDP: R * alpha / (2 z^2), converted at the best order
    orders = np.linspace(1.5, 200, 4000)
    closed = min(releases * a / (2 * z * z) + math.log1p(-1 / a)
                 - (math.log(delta) + math.log(a)) / (a - 1) for a in orders)
    assert ours < closed
    # exact: R Gaussians of noise z are one of noise z / sqrt(R) (Balle & Wang 2018, Thm. 8)
    s = z / math.sqrt(releases)

    def exact_delta(eps: float) -> float:
        return float(norm.cdf(0.5 / s - eps * s) - math.exp(eps) * norm.cdf(-0.5 / s - eps * s))

    assert exact_delta(ours) <= delta < exact_delta(ours * 0.99)


def test_calibrate_reaches_the_target():
    z = calibrate(1.0, 1e-5, releases=4)
    assert accounting.epsilon(release_event(z, 4), 1e-5) == pytest.approx(1.0, rel=1e-3)
    assert calibrate(1.0, 1e-5, releases=8) > z  # more releases need more noise


def test_neighbours_differ_by_at_most_the_sensitivity():
    """Remove one test example: the released sums (n_k, c_k, s_k / L) move by at most 1
    each, an L2 distance <= sqrt(3); the metric function is then a Gaussian mechanism."""
    y, pred, g, loss = _data()
    clip = 2.0

    def sums(keep):
        c = (pred[keep] == y[keep]).astype(float)
        s = np.clip(loss[keep], 0, clip) / clip
        return np.stack([np.bincount(g[keep], weights=w, minlength=3)
                         for w in (np.ones_like(c), c, s)])

    full = sums(np.ones(len(y), bool))
    for i in range(50):
        keep = np.ones(len(y), bool)
        keep[i] = False
        assert np.linalg.norm(full - sums(keep)) <= SENSITIVITY + 1e-12


def test_noise_has_the_calibrated_scale_and_is_centred():
    y, pred, g, loss = _data(n=3000)
    z = 0.5
    rng = np.random.default_rng(1)
    draws = np.array([noisy_group_metrics(y, pred, g, loss, 3, noise_multiplier=z,
                                          loss_clip=10.0, rng=rng)["group_accuracy"]
                      for _ in range(400)])
    exact = np.array([(pred[g == k] == y[g == k]).mean() for k in range(3)])
    assert np.abs(draws.mean(axis=0) - exact).max() < 0.01
    n_k = np.bincount(g, minlength=3)
    # ratio c/n with both noised: std ~ z*sqrt(3)*sqrt(1 + acc^2)/n
    expected = z * SENSITIVITY * np.sqrt(1 + exact**2) / n_k
    assert draws.std(axis=0) == pytest.approx(expected, rel=0.2)


def test_the_fairness_counts_add_the_accountants_figure_of_their_own_gaussian():
    """At a fixed noise multiplier z, the test ε grows from R Gaussians to R Gaussians and the
    counts' one, noise multiplier z (the same noise per coordinate over the same sensitivity
    of sqrt(3)); recomputed with dp_accounting's accountants directly."""
    z, releases, delta = 3.0, 5, 1e-5
    without = accounting.epsilon(release_event(z, releases), delta)
    with_counts = accounting.epsilon(release_event(z, releases, fairness=True), delta)
    oracle = epsilon_oracle(*[dp_accounting.GaussianDpEvent(z)] * releases,
                            dp_accounting.GaussianDpEvent(z),
                            delta=delta)
    assert with_counts == pytest.approx(oracle, rel=1e-4)
    assert with_counts > without * 1.05
    # calibrated to one target, the counts cost noise instead
    assert calibrate(1.0, 1e-5, 4, fairness=True) > calibrate(1.0, 1e-5, 4)
    z_fair = calibrate(1.0, 1e-5, 4, fairness=True)
    assert epsilon_oracle(*[dp_accounting.GaussianDpEvent(z_fair)] * 4,
                          dp_accounting.GaussianDpEvent(z_fair * SENSITIVITY / COUNTS_SENSITIVITY),
                          delta=1e-5) == pytest.approx(1.0, rel=1e-3)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_noisy_fairness_rates_are_centred_on_fairlearns(n_classes):
    rng = np.random.default_rng(2)
    n = 6000
    y, g = rng.integers(0, n_classes, n), rng.integers(0, 3, n)
    pred = np.where(rng.random(n) < 0.75, y, rng.integers(0, n_classes, n))
    loss = rng.exponential(0.5, n)
    prob = rng.dirichlet(np.ones(n_classes), size=n)
    exact = rates.exact_rates(y, pred, g, 3, n_classes, prob)
    draws = [noisy_group_metrics(y, pred, g, loss, 3, noise_multiplier=0.5, loss_clip=10.0,
                                 rng=rng, fairness_classes=n_classes, prob=prob)
             for _ in range(200)]
    assert draws[0].keys() >= exact.keys()
    for key in ("group_selection_rate" + rates.suffix(1, n_classes), "equalized_odds_difference",
                "demographic_parity_ratio", "group_calibration_error" + rates.suffix(1, n_classes)):
        mean = np.mean([d[key] for d in draws], axis=0)
        np.testing.assert_allclose(mean, exact[key], atol=0.01, err_msg=key)
    assert np.std([d["group_true_positive_rate" + rates.suffix(1, n_classes)][0]
                   for d in draws]) > 0  # noisy


def test_bad_arguments_are_refused():
    y, pred, g, loss = _data(n=20)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        noisy_group_metrics(y, pred, g, loss, 3, noise_multiplier=0.0, loss_clip=1, rng=rng)
    with pytest.raises(ValueError, match="loss_clip"):
        noisy_group_metrics(y, pred, g, loss, 3, noise_multiplier=1.0,
                            loss_clip=math.inf, rng=rng)
    with pytest.raises(ValueError, match="releases"):
        release_event(1.0, 0)
