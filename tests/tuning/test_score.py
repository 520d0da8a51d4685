"""The released selection score: exact values, the noise of the contingency table and where
that noise comes from."""

from __future__ import annotations

import numpy as np
import pytest

from dpfair import tuning
from dpfair.tuning.score import score_rng


def test_release_score_noise_and_sensitivity():
    y = np.array([0, 0, 1, 1, 1, 0])
    pred = {
        "y_true": y,
        "y_pred": np.array([0, 1, 1, 1, 0, 0]),
        "groups": np.array([0, 0, 0, 1, 1, 1]),
        "loss": np.array([0.1, 50, 0.2, 0.3, 2, 1]),
    }
    exact = {
        s: tuning.release_score(pred, s, 2, 2, None, 10.0)
        for s in ["accuracy", "macro_accuracy", "worst_group_accuracy", "loss"]
    }
    assert exact["accuracy"] == pytest.approx(4 / 6)
    assert exact["macro_accuracy"] == pytest.approx((2 / 3 + 2 / 3) / 2)
    assert exact["worst_group_accuracy"] == pytest.approx(2 / 3)
    assert exact["loss"] == pytest.approx((0.1 + 10 + 0.2 + 0.3 + 2 + 1) / 6)  # clipped at 10
    rng = np.random.default_rng(0)
    noisy = [tuning.release_score(pred, "accuracy", 2, 2, 0.01, 10.0, rng) for _ in range(50)]
    assert np.mean(noisy) == pytest.approx(4 / 6, abs=0.01) and np.std(noisy) > 0


def test_score_noise_is_secret_unless_reproducible():
    secret = tuning.TuningConfig(seed=3)
    assert not np.array_equal(
        score_rng(secret, 5).normal(size=4), score_rng(secret, 5).normal(size=4)
    )
    seeded = tuning.TuningConfig(seed=3, reproducible=True)
    want = np.random.default_rng(np.random.SeedSequence([3, 78, 5])).normal(size=4)
    assert np.array_equal(score_rng(seeded, 5).normal(size=4), want)
