"""dpfair.fairness.costs (privacy cost, excess risk, gaps, equal cost) against hand-computed numbers
and Xu et al. 2021's Table 1."""

from __future__ import annotations

import numpy as np
import pytest

from dpfair.fairness.costs import (
    equal_cost_of_privacy,
    excess_risk,
    max_gap,
    pair_gap,
    privacy_cost,
)


def test_privacy_cost_excess_risk_and_gaps() -> None:
    ref_acc = [[0.90, 0.80], [0.92, 0.78]]  # seed means 0.91, 0.79
    priv_acc = [[0.85, 0.60], [0.87, 0.50], [0.83, 0.55]]  # 0.85, 0.55
    pi = privacy_cost(ref_acc, priv_acc)
    np.testing.assert_allclose(pi, [0.06, 0.24])
    assert pair_gap(pi, 0, 1) == pytest.approx(0.18)
    risk = excess_risk([[0.2, 0.5]], [[0.3, 0.9], [0.5, 1.1]])
    np.testing.assert_allclose(risk, [0.2, 0.5])  # (0.4 - 0.2, 1.0 - 0.5)


def test_max_gap_ties_and_nan() -> None:
    assert max_gap([0.1, 0.5, 0.3]) == (pytest.approx(0.4), (0, 1))
    assert max_gap([0.0, 0.2, 0.0, 0.2]) == (pytest.approx(0.2), (0, 1))  # first pair
    assert max_gap([np.nan, 0.1, 0.4]) == (pytest.approx(0.3), (1, 2))
    with pytest.raises(ValueError, match="two groups"):
        max_gap([0.1, np.nan])


def test_equal_cost_of_privacy_on_xu_table1_mnist() -> None:
    sgd = [0.9903, 0.9292]  # Xu et al. 2021 Table 1: class 2, class 8
    dpsgd_f = equal_cost_of_privacy(sgd, [0.9903 - 0.0281, 0.9292 - 0.0432])
    np.testing.assert_allclose(dpsgd_f.deltas, [-0.0281, -0.0432])
    assert dpsgd_f.max_gap == pytest.approx(0.0151) and dpsgd_f.equal
    dpsgd = equal_cost_of_privacy(sgd, [0.9903 - 0.0707, 0.9292 - 0.6807])
    assert dpsgd.max_gap == pytest.approx(0.61) and not dpsgd.equal
    assert dpsgd.tau == 0.05 and dpsgd.pair == (0, 1)
