"""The number of runs K: its distribution, the secret per-study draw and the seeded one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpfair import tuning


@pytest.mark.parametrize("reproducible", [False, True])
@pytest.mark.parametrize("eta, mu", [(0.0, 10.0), (1.0, 5.0), (-0.5, 20.0), (2.0, 3.0)])
def test_k_mean_matches_mu(eta, mu, reproducible):
    rng = np.random.default_rng(1234)
    ks = tuning.sample_tnb(eta, mu, rng, size=40_000)
    assert ks.min() >= 1
    se = ks.std(ddof=1) / math.sqrt(ks.size)
    assert abs(ks.mean() - mu) < 5 * se
    # draw_k over many studies (secret, or seeded over many seeds) has the same mean
    many = [
        tuning.draw_k(tuning.TuningConfig(eta=eta, mu=mu, seed=s, reproducible=reproducible), 1)
        for s in range(1500)
    ]
    assert abs(np.mean(many) - mu) < 5 * np.std(many, ddof=1) / math.sqrt(len(many))


def test_poisson_k_mean():
    many = [
        tuning.draw_k(tuning.TuningConfig(mode="poisson", mu=6.0, seed=s), 1) for s in range(3000)
    ]
    assert abs(np.mean(many) - 6.0) < 5 * math.sqrt(6.0 / len(many))


def test_secret_k_is_not_a_function_of_the_seed():
    """P(K = k) < 0.3 for TNB(0, mu=10) and Poisson(10): 20 equal draws have probability
    < 1e-10."""
    c = tuning.TuningConfig(mu=10.0, seed=0)
    assert len({tuning.draw_k(c, 1) for _ in range(20)}) > 1
    p = tuning.TuningConfig(mode="poisson", mu=10.0, seed=0)
    assert len({tuning.draw_k(p, 1) for _ in range(20)}) > 1


@pytest.mark.parametrize("seed", [0, 1, 18])
def test_reproducible_k_is_the_seeded_stream(seed):
    """K of SeedSequence([seed, 75]), as every study before the option drew it."""
    tnb = tuning.TuningConfig(eta=0.5, mu=7.0, seed=seed, reproducible=True)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 75]))
    assert tuning.draw_k(tnb, 1) == tuning.draw_k(tnb, 1) == tuning.sample_tnb(0.5, 7.0, rng)
    poisson = tuning.TuningConfig(mode="poisson", mu=6.0, seed=seed, reproducible=True)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 75]))
    assert tuning.draw_k(poisson, 1) == rng.poisson(6.0)


def test_binomial_k_is_secret_by_default_and_the_seeded_stream_when_reproducible():
    """K ~ Binomial(n_runs, p): its mean and range; 20 equal secret draws have probability
    < 1e-8 (P(K = k) <= 0.18 for Binomial(20, 0.5)); reproducible: SeedSequence([seed, 75])."""
    secret = tuning.TuningConfig(mode="binomial", n_runs=20, p=0.5, seed=0)
    many = [tuning.draw_k(secret, 1) for _ in range(2000)]
    assert 0 <= min(many) and max(many) <= 20
    assert abs(np.mean(many) - 10.0) < 5 * math.sqrt(5.0 / len(many))
    assert len(set(many[:20])) > 1
    seeded = secret.model_copy(update={"reproducible": True, "seed": 18})
    rng = np.random.default_rng(np.random.SeedSequence([18, 75]))
    assert tuning.draw_k(seeded, 1) == tuning.draw_k(seeded, 1) == rng.binomial(20, 0.5)
