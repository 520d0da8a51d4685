"""The released selection score: exact values and the noise of the contingency table."""

from __future__ import annotations

import numpy as np
import pytest

from dpfair import tuning


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
