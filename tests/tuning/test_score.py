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


def _predictions(n_classes: int, n: int = 400, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    y, g = rng.integers(0, n_classes, n), rng.integers(0, 3, n)
    return {"y_true": y, "groups": g, "loss": rng.random(n),
            "y_pred": np.where(rng.random(n) < 0.3 + 0.2 * g, rng.integers(0, n_classes, n), y)}


@pytest.mark.parametrize("n_classes", [2, 3])
def test_fairness_scores_are_fairlearns_figures_without_noise(n_classes):
    from dpfair.fairness import rates

    pred = _predictions(n_classes)
    exact = rates.exact_rates(pred["y_true"], pred["y_pred"], pred["groups"], 3, n_classes)
    for score in rates.DISPARITIES:
        assert tuning.release_score(pred, score, n_classes, 3, None, 10.0) == pytest.approx(
            exact[score], abs=1e-12)
    ratio = exact["demographic_parity_ratio"]
    accuracy = tuning.release_score(pred, "accuracy", n_classes, 3, None, 10.0)
    met = tuning.TuningConfig(score="accuracy", constraint={
        "measure": "demographic_parity_ratio", "at_least": ratio - 0.01}).constraint
    missed = tuning.TuningConfig(score="accuracy", constraint={
        "measure": "demographic_parity_ratio", "at_least": ratio + 0.01}).constraint
    assert tuning.release_score(pred, "accuracy", n_classes, 3, None, 10.0, None,
                                met) == pytest.approx(accuracy)
    assert tuning.release_score(pred, "accuracy", n_classes, 3, None, 10.0, None,
                                missed) == pytest.approx(accuracy - 1)


@pytest.mark.parametrize("n_classes", [2, 4])
def test_the_fairness_scores_table_has_sensitivity_one_on_neighbouring_datasets(n_classes):
    """The table a fairness score (or a constraint) releases: adding any one example (every
    group, label and prediction) changes it by exactly 1 in one cell, an L2 distance of 1, the
    sensitivity its GaussianDpEvent(sigma_score) assumes."""
    from dpfair.tuning.score import contingency

    pred = _predictions(n_classes, n=60)
    y, yp, g = pred["y_true"], pred["y_pred"], pred["groups"]
    base = contingency(y, yp, g, 3, n_classes, by_prediction=True)
    for a in range(n_classes):
        for b in range(n_classes):
            for k in range(3):
                other = contingency(np.append(y, a), np.append(yp, b), np.append(g, k), 3,
                                    n_classes, by_prediction=True)
                assert np.linalg.norm(other - base) == 1.0
    # the accuracy it yields is the coarser table's (post-processing of the same release)
    coarse = contingency(y, yp, g, 3, n_classes)
    from dpfair.tuning.score import _by_correct

    assert np.array_equal(_by_correct(base), coarse)


def test_a_constraint_needs_an_accuracy_score_and_one_bound():
    with pytest.raises(ValueError, match="exactly one of at_least and at_most"):
        tuning.TuningConfig(constraint={"measure": "demographic_parity_ratio"})
    with pytest.raises(ValueError, match="accuracy score"):
        tuning.TuningConfig(score="loss", constraint={"measure": "demographic_parity_ratio",
                                                      "at_least": 0.8})
    assert tuning.TuningConfig(score="equalized_odds_difference").minimize
    assert not tuning.TuningConfig(score="demographic_parity_ratio").minimize
