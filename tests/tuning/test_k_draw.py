"""The number of runs K: its distribution and the per-study seeded draw."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpfair import tuning


@pytest.mark.parametrize("eta, mu", [(0.0, 10.0), (1.0, 5.0), (-0.5, 20.0), (2.0, 3.0)])
def test_k_mean_matches_mu(eta, mu):
    rng = np.random.default_rng(1234)
    ks = tuning.sample_tnb(eta, mu, rng, size=40_000)
    assert ks.min() >= 1
    se = ks.std(ddof=1) / math.sqrt(ks.size)
    assert abs(ks.mean() - mu) < 5 * se
    # draw_k over many seeds (the per-study draw) has the same mean
    many = [tuning.draw_k(tuning.TuningConfig(eta=eta, mu=mu, seed=s), 1) for s in range(1500)]
    assert abs(np.mean(many) - mu) < 5 * np.std(many, ddof=1) / math.sqrt(len(many))


def test_poisson_k_mean():
    many = [
        tuning.draw_k(tuning.TuningConfig(mode="poisson", mu=6.0, seed=s), 1) for s in range(3000)
    ]
    assert abs(np.mean(many) - 6.0) < 5 * math.sqrt(6.0 / len(many))
