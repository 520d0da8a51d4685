"""dpfair.fairness.metrics (one model's metrics per group and class) against numbers computed by
hand (in the comments)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from dpfair.fairness.metrics import RECORD_COLUMNS, group_metrics, intersect_groups, per_sample_nll
from dpfair.fairness.records import runs_frame

# Six test points, two groups. correct = [1, 1, 0, 1, 0, 0].
Y_TRUE = [0, 1, 1, 0, 1, 0]
Y_PRED = [0, 1, 0, 0, 0, 1]
GROUPS = [0, 0, 0, 1, 1, 1]
LOSSES = [0.1, 0.2, 0.9, 0.3, 1.2, 1.5]


def test_group_metrics_hand_computed() -> None:
    m = group_metrics(Y_TRUE, Y_PRED, GROUPS, 2, losses=LOSSES)
    # group 0: samples 0,1,2 -> 2 of 3 correct; group 1: samples 3,4,5 -> 1 of 3
    np.testing.assert_allclose(m.group_accuracy, [2 / 3, 1 / 3])
    # group losses: (0.1+0.2+0.9)/3 = 0.4, (0.3+1.2+1.5)/3 = 1.0
    np.testing.assert_allclose(m.group_loss, [0.4, 1.0])
    np.testing.assert_array_equal(m.group_count, [3, 3])
    # class 0: samples 0,3,5 -> 1,1,0; class 1: samples 1,2,4 -> 1,0,0
    np.testing.assert_allclose(m.class_accuracy, [2 / 3, 1 / 3])
    np.testing.assert_allclose(m.class_loss, [1.9 / 3, 2.3 / 3])
    assert m.accuracy == pytest.approx(0.5)
    assert m.loss == pytest.approx(0.7)  # 4.2 / 6
    assert m.macro_accuracy == pytest.approx(0.5)  # (2/3 + 1/3) / 2
    assert (m.worst_group, m.worst_group_accuracy) == (1, pytest.approx(1 / 3))
    assert (m.worst_class, m.worst_class_accuracy) == (1, pytest.approx(1 / 3))


def test_group_metrics_macro_differs_from_accuracy() -> None:
    # class 0: 3 samples all correct; class 1: 1 sample wrong -> acc 3/4, macro (1 + 0)/2
    m = group_metrics([0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 1, 1], 2)
    assert m.accuracy == pytest.approx(0.75)
    assert m.macro_accuracy == pytest.approx(0.5)
    assert np.isnan(m.group_loss).all() and math.isnan(m.loss)  # no losses given


def test_group_metrics_from_binary_probs() -> None:
    p1 = [0.2, 0.9, 0.4, 0.1, 0.3, 0.6]  # P(y=1); threshold 0.5 gives Y_PRED
    m = group_metrics(Y_TRUE, None, GROUPS, 2, probs=p1)
    np.testing.assert_allclose(m.group_accuracy, [2 / 3, 1 / 3])
    # NLL of the true class: group 0 -> -log 0.8, -log 0.9, -log 0.4
    g0 = -(math.log(0.8) + math.log(0.9) + math.log(0.4)) / 3
    g1 = -(math.log(0.9) + math.log(0.3) + math.log(0.4)) / 3
    np.testing.assert_allclose(m.group_loss, [g0, g1])


def test_per_sample_nll_multiclass_floor_and_argmax_tie() -> None:
    probs = np.array([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    np.testing.assert_allclose(per_sample_nll([2, 2], probs), [-math.log(1e-12), 0.0])
    with pytest.warns(RuntimeWarning, match="class '1'"):
        m = group_metrics([0, 2], None, [0, 0], 1, probs=probs)
    assert m.accuracy == 1.0  # argmax tie [0.5, 0.5] -> class 0, the lowest
    assert len(m.class_accuracy) == 3


def test_absent_group_is_nan_warned_and_ignored() -> None:
    with pytest.warns(RuntimeWarning, match="group 'other'.*no samples"):
        m = group_metrics(
            Y_TRUE, Y_PRED, GROUPS, 3, losses=LOSSES, group_names=["M", "F", "other"]
        )
    assert np.isnan(m.group_accuracy[2]) and np.isnan(m.group_loss[2])
    assert m.group_count[2] == 0
    assert (m.worst_group, m.worst_group_accuracy) == (1, pytest.approx(1 / 3))


def test_absent_class_is_nan_and_ignored_by_macro() -> None:
    with pytest.warns(RuntimeWarning, match="class '2'"):
        m = group_metrics([0, 1], [0, 0], [0, 0], 1, n_classes=3)
    np.testing.assert_array_equal(m.class_accuracy[:2], [1.0, 0.0])
    assert np.isnan(m.class_accuracy[2])
    assert m.macro_accuracy == pytest.approx(0.5)
    assert m.worst_class == 1


def test_ties_pick_the_first_group() -> None:
    # both groups 1 of 2 correct
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = group_metrics([0, 1, 0, 1], [0, 0, 0, 0], [0, 0, 1, 1], 2)
    assert m.worst_group == 0 and m.worst_group_accuracy == 0.5


def test_group_metrics_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        group_metrics([], [], [], 2)
    with pytest.raises(ValueError, match="group ids"):
        group_metrics([0], [0], [2], 2)
    with pytest.raises(ValueError, match="lengths disagree"):
        group_metrics([0, 1], [0], [0, 0], 1)
    with pytest.raises(ValueError, match="not both"):
        group_metrics([0], [0], [0], 1, losses=[0.1], probs=[0.2])


def test_to_records_canonical_format() -> None:
    m = group_metrics(Y_TRUE, Y_PRED, GROUPS, 2, losses=LOSSES)
    recs = m.to_records("dpsgd", 3, ["M", "F"], class_names=["neg", "pos"])
    runs = runs_frame(recs)
    assert list(runs.columns) == list(RECORD_COLUMNS)
    got = runs.set_index(["group", "metric"])["value"]
    assert got[("F", "accuracy")] == pytest.approx(1 / 3)
    assert got[("M", "loss")] == pytest.approx(0.4)
    assert got[("all", "macro_accuracy")] == pytest.approx(0.5)
    assert got[("all", "worst_group_accuracy")] == pytest.approx(1 / 3)
    assert got[("class:pos", "count")] == 3
    assert set(runs["method"]) == {"dpsgd"} and set(runs["seed"]) == {3}


def test_intersect_groups() -> None:
    sex, race = [0, 1, 1, 0], [1, 1, 0, 0]
    ids, names = intersect_groups(sex, race, names=(["M", "F"], ["white", "non-white"]))
    np.testing.assert_array_equal(ids, [1, 3, 2, 0])  # sex * 2 + race
    assert names == ["M & white", "M & non-white", "F & white", "F & non-white"]
    with pytest.raises(ValueError, match="differ in length"):
        intersect_groups([0, 1], [0], names=(["a", "b"], ["c"]))
    with pytest.raises(ValueError, match="attribute ids"):
        intersect_groups([0, 2], names=(["a", "b"],))
