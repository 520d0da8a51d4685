"""Per-group selection and error rates and their disparities reproduce Fairlearn exactly."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from fairlearn import metrics as flm
from sklearn.metrics import precision_score

from dpfair.fairness import rates


def _predictions(n_classes: int, seed: int = 0, n: int = 2000, n_groups: int = 3):
    rng = np.random.default_rng(seed)
    g = rng.integers(0, n_groups, n)
    y = rng.integers(0, n_classes, n)
    wrong = rng.random(n) < 0.2 + 0.15 * g  # the groups differ in their error rates
    return y, np.where(wrong, rng.integers(0, n_classes, n), y), g


def _probabilities(n_classes: int, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.ones(n_classes), size=n)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_exact_rates_are_metricframe_and_fairlearns_disparity_functions(n_classes):
    y, pred, g = _predictions(n_classes)
    prob = _probabilities(n_classes, len(y))
    found = rates.exact_rates(y, pred, g, 3, n_classes, prob)
    for c in rates.positive_classes(n_classes):
        yt, yp, sfx = (y == c).astype(int), (pred == c).astype(int), rates.suffix(c, n_classes)
        frame = flm.MetricFrame(
            metrics={"selection_rate": flm.selection_rate,
                     "true_positive_rate": flm.true_positive_rate,
                     "false_positive_rate": flm.false_positive_rate,
                     "false_negative_rate": flm.false_negative_rate,
                     "precision": functools.partial(precision_score, zero_division=0.0)},
            y_true=yt, y_pred=yp, sensitive_features=g)
        for m in rates.MEASURES[:-1]:
            assert found[f"group_{m}{sfx}"] == frame.by_group[m].tolist()
        assert found[f"group_calibration_error{sfx}"] == pytest.approx(  # not Fairlearn's
            [abs(prob[g == k, c].mean() - yt[g == k].mean()) for k in range(3)], abs=1e-12)
        kw = {"sensitive_features": g}
        assert found[f"demographic_parity_difference{sfx}"] == \
            flm.demographic_parity_difference(yt, yp, **kw)
        assert found[f"demographic_parity_ratio{sfx}"] == flm.demographic_parity_ratio(yt, yp, **kw)
        assert found[f"equalized_odds_difference{sfx}"] == \
            flm.equalized_odds_difference(yt, yp, **kw)
        assert found[f"equal_opportunity_difference{sfx}"] == \
            flm.equal_opportunity_difference(yt, yp, **kw)
    if n_classes > 2:  # the headline: the worst class
        classes = rates.positive_classes(n_classes)
        assert found["demographic_parity_ratio"] == min(
            found[f"demographic_parity_ratio_class{c}"] for c in classes)
        assert found["equalized_odds_difference"] == max(
            found[f"equalized_odds_difference_class{c}"] for c in classes)


@pytest.mark.parametrize("n_classes", [2, 4])
def test_rates_from_exact_counts_equal_fairlearns(n_classes):
    y, pred, g = _predictions(n_classes, seed=1)
    prob = _probabilities(n_classes, len(y), seed=1)
    counts = rates.confusion_counts(y, pred, g, 3, n_classes, prob)
    from_counts = rates.rates_from_counts(np.bincount(g, minlength=3), counts, n_classes)
    exact = rates.exact_rates(y, pred, g, 3, n_classes, prob)
    assert "group_calibration_error" + rates.suffix(1, n_classes) in exact
    assert from_counts.keys() == exact.keys()
    for key, value in exact.items():
        np.testing.assert_allclose(from_counts[key], value, rtol=0, atol=1e-12, err_msg=key)


def test_a_group_absent_from_the_split_is_nan_and_ignored_by_the_disparities():
    y, pred, g = _predictions(2, n_groups=2)
    found = rates.exact_rates(y, pred, g, 3, 2)
    assert all(np.isnan(found[f"group_{m}"][2]) for m in rates.MEASURES[:-1])
    assert "group_calibration_error" not in found  # no probabilities given
    assert found["demographic_parity_difference"] == flm.demographic_parity_difference(
        y, pred, sensitive_features=g)


@pytest.mark.parametrize("n_classes", [2, 3, 5])
def test_one_row_changes_the_confusion_counts_by_at_most_sqrt_3(n_classes):
    """The sensitivity :mod:`dpfair.fairness.noisy` assumes for these counts and probability
    sums: every (label, prediction) pair of one added row, in every group, with a one-hot
    (the worst case) or a spread probability vector; sqrt(2) without the sums."""
    y, pred, g = _predictions(n_classes, n=50)
    prob = _probabilities(n_classes, 50)
    base = rates.confusion_counts(y, pred, g, 3, n_classes, prob)
    spread = _probabilities(n_classes, 1, seed=3)
    norms = [np.linalg.norm(rates.confusion_counts(
        np.append(y, a), np.append(pred, b), np.append(g, k), 3, n_classes,
        np.vstack([prob, p])) - base)
        for a in range(n_classes) for b in range(n_classes) for k in range(3)
        for p in (np.eye(n_classes)[[b]], spread)]
    assert max(norms) == pytest.approx(np.sqrt(3)) and max(norms) <= np.sqrt(3) + 1e-12
    plain = rates.confusion_counts(y, pred, g, 3, n_classes)
    assert max(np.linalg.norm(rates.confusion_counts(
        np.append(y, a), np.append(pred, b), np.append(g, 0), 3, n_classes) - plain)
        for a in range(n_classes) for b in range(n_classes)) == pytest.approx(np.sqrt(2))


def test_privacy_cost_of_a_disparity_is_positive_when_dp_training_makes_it_less_fair():
    from dpfair.fairness import rate_tables, runs_frame

    values = {("nonprivate", 0): (0.10, 0.90), ("nonprivate", 1): (0.20, 0.80),
              ("dpsgd", 0): (0.30, 0.60), ("dpsgd", 1): (0.40, 0.70)}
    frame = runs_frame([
        {"method": m, "seed": s, "group": "all", "metric": metric, "value": v}
        for (m, s), pair in values.items()
        for metric, v in zip(("equalized_odds_difference", "demographic_parity_ratio"), pair,
                             strict=True)])
    stats = rate_tables.disparity_stats(frame, "nonprivate")
    assert stats["dpsgd"]["equalized_odds_difference_privacy_cost"] == pytest.approx(0.2)
    assert stats["dpsgd"]["demographic_parity_ratio_privacy_cost"] == pytest.approx(0.2)
    assert "equalized_odds_difference_privacy_cost" not in stats["nonprivate"]
    table = rate_tables.disparity_table(frame, "nonprivate")
    assert list(table.index) == ["nonprivate", "dpsgd"]
    assert table.loc["dpsgd", "Δ eo_diff"] == "0.200 ± 0.050"  # per seed 0.15, 0.25
    assert table.loc["dpsgd", "dp_ratio"] == "0.650 ± 0.050"
    long = rate_tables.long_summary(frame, "nonprivate")
    cost = long[(long["measure"] == "demographic_parity_ratio_privacy_cost")]
    assert cost["mean"].tolist() == pytest.approx([0.2])
    import pandas as pd

    results = pd.DataFrame({"acc_a": ["90.0", "80.0"]}, index=["nonprivate", "dpsgd"])
    shown = rate_tables.with_shown(results, frame, ["eo_diff"], "nonprivate")
    assert list(shown.columns) == ["acc_a", "eo_diff", "Δ eo_diff"]
    assert shown.loc["nonprivate", "Δ eo_diff"] == "-"
    assert shown.loc["dpsgd", "Δ eo_diff"] == table.loc["dpsgd", "Δ eo_diff"]
