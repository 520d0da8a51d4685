"""dpfair.fairness.records: the canonical runs frame and its per-seed views (``runs`` fixture in
conftest.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dpfair.fairness.records import cost_by_seed, mean_se, runs_frame


def test_mean_se() -> None:
    mean, se = mean_se([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and se == pytest.approx(math.sqrt(5 / 3) / 2)  # std(ddof=1)/sqrt(4)
    assert mean_se([1.0, np.nan, 3.0]) == (2.0, pytest.approx(1.0))
    mean, se = mean_se([7.0])
    assert mean == 7.0 and math.isnan(se)


def test_runs_frame_validates() -> None:
    rec = {"method": "dpsgd", "seed": 0, "group": "M", "metric": "accuracy", "value": 0.9}
    with pytest.raises(ValueError, match="lack columns"):
        runs_frame([{"method": "dpsgd"}])
    with pytest.raises(ValueError, match="duplicate"):
        runs_frame([rec, rec])
    frame = runs_frame(pd.DataFrame([{**rec, "dataset": "adult"}]))
    assert frame["dataset"].iloc[0] == "adult" and frame["seed"].dtype == np.int64


def test_cost_by_seed(runs: pd.DataFrame) -> None:
    risk = cost_by_seed(runs, ["a", "b"], kind="R")
    assert list(risk.index) == [("dpsgd", 0), ("dpsgd", 1)]
    np.testing.assert_allclose(risk.to_numpy(), [[0.1, 0.3], [0.3, 0.5]])
    with pytest.raises(ValueError, match="no 'nonprivate' run for seeds \\[7\\]"):
        extra = {"method": "dpsgd", "seed": 7, "group": "a", "metric": "accuracy", "value": 0.5}
        cost_by_seed(
            runs_frame([*runs.to_dict("records"), extra]), ["a"], paired_reference=True
        )


def test_runs_frame_of_no_records_says_no_training_finished():
    with pytest.raises(ValueError, match="no training finished"):
        runs_frame([])
