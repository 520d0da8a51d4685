"""A non-private run's released fairness measures are Fairlearn's MetricFrame figures exactly,
and its records and tables carry those same figures."""

from __future__ import annotations

import numpy as np
import pytest
from fairlearn import metrics as flm
from sklearn.metrics import precision_score

from dpfair.data import load_dataset
from dpfair.fairness import metric_records, rate_tables, rates, runs_frame
from dpfair.training import TrainConfig, train


def _config(**kw):
    return TrainConfig.model_validate({
        "method": {"name": "nonprivate"}, "model": {"name": "mlp", "hidden": [16]},
        "epochs": 3, "batch_size": 64, "lr": 0.5, "progress": False, "device": "cpu", **kw})


@pytest.mark.parametrize("dataset", [
    ("synthetic", {"n": 600}),
    ("synthetic", {"n": 600, "n_classes": 3}),
])
def test_a_nonprivate_run_releases_metricframes_figures(dataset):
    ds = load_dataset(*dataset)
    result = train(_config(), ds)
    pred = result.test_predictions
    assert pred is not None
    released = result.test_metrics
    names = np.asarray(ds.group_names)[pred.groups]  # as a practitioner calls it: by name
    for c in rates.positive_classes(ds.n_classes):
        yt, yp = (pred.y_true == c).astype(int), (pred.y_pred == c).astype(int)
        frame = flm.MetricFrame(
            metrics={"selection_rate": flm.selection_rate,
                     "true_positive_rate": flm.true_positive_rate,
                     "false_positive_rate": flm.false_positive_rate,
                     "false_negative_rate": flm.false_negative_rate,
                     "precision": lambda t, p: precision_score(t, p, zero_division=0.0)},
            y_true=yt, y_pred=yp, sensitive_features=names)
        sfx = rates.suffix(c, ds.n_classes)
        for m in rates.MEASURES[:-1]:
            assert released[f"group_{m}{sfx}"] == frame.by_group[m][ds.group_names].tolist()
        calibration = [abs(pred.prob[pred.groups == k, c].mean() - yt[pred.groups == k].mean())
                       for k in range(ds.n_groups)]
        assert released[f"group_calibration_error{sfx}"] == pytest.approx(calibration, abs=1e-12)
        assert released[f"demographic_parity_ratio{sfx}"] == flm.demographic_parity_ratio(
            yt, yp, sensitive_features=names)
        assert released[f"equalized_odds_difference{sfx}"] == flm.equalized_odds_difference(
            yt, yp, sensitive_features=names)
    # only the last evaluation carries them
    assert all("demographic_parity_ratio" not in h["test"] for h in result.history[:-1])
    # the records and the table show the same figures
    frame = runs_frame(metric_records(released, "nonprivate", 0, ds.group_names))
    [selection] = frame[(frame["group"] == ds.group_names[0])
                        & (frame["metric"] == "selection_rate" + rates.suffix(1, ds.n_classes))
                        ]["value"]
    assert selection == released["group_selection_rate" + rates.suffix(1, ds.n_classes)][0]
    table = rate_tables.group_rate_table(frame, ds.group_names, rates.suffix(1, ds.n_classes))
    assert table.loc[f"nonprivate · {ds.group_names[0]}", "selection_rate"] == f"{selection:.3f}"


def test_fairness_false_releases_no_rate():
    ds = load_dataset("synthetic", {"n": 400})
    result = train(_config(epochs=1, test_metrics={"fairness": False}), ds)
    assert not rates.disparity_keys(result.test_metrics)
    assert not rates.rate_keys(result.test_metrics)
