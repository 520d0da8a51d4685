"""A real private search on Dutch (logistic regression), for dpsgd and bounded_adaptive."""

from __future__ import annotations

import math

import pytest
from dp_accounting import dp_event

from dpfair import accounting
from dpfair.data import load_dataset
from dpfair.training import TrainConfig
from dpfair.tuning import TuningConfig, tune
from tests.conftest import requires_dataset

pytestmark = [pytest.mark.slow, requires_dataset("dutch")]


@pytest.fixture(scope="module")
def dutch():
    return load_dataset("dutch", {"validation_fraction": 0.1, "seed": 0})


@pytest.mark.parametrize(
    ("method", "space"),
    [
        ({"name": "dpsgd", "normalize": True}, {"lr": [0.5, 2.0], "C": [0.1, 1.0]}),
        ({"name": "bounded_adaptive"}, {"lr": [0.5, 2.0], "C_LB": [0.001, 0.01]}),
    ],
)
def test_private_search_on_dutch(dutch, tmp_path, method, space):
    base = TrainConfig(
        method=method,
        model={"name": "logistic_regression"},
        epochs=1,
        batch_size=512,
        sigma=1.0,
        delta=1e-6,
        progress=False,
    )
    cfg = TuningConfig(
        mode="tnb",
        eta=1.0,
        mu=2.0,
        space=space,
        seed=3,
        storage=f"sqlite:///{tmp_path / 'study.db'}",
        study_name="dutch",
    )
    result = tune(base.method, base, dutch, cfg)
    runs = [t for t in result.trials if t["ledger"] == "run"]
    assert len(runs) == result.K >= 1
    assert all(t["state"] == "COMPLETE" for t in runs)
    assert result.best_params is not None and set(result.best_params) == set(space)
    assert 0.5 < result.best_score <= 1.0 + 5 * cfg.sigma_score / len(dutch.val)
    # epsilon of one training equals the accountant's; the search costs more
    steps = accounting.steps_for_epochs(1, len(dutch.train), 512)
    gradient = dp_event.GaussianDpEvent(1.0)
    step = (dp_event.ComposedDpEvent([gradient, dp_event.GaussianDpEvent(10.0)])
            if method["name"] == "bounded_adaptive" else gradient)
    event = accounting.run_event(step, 512 / len(dutch.train), steps)
    assert result.epsilon_training == pytest.approx(accounting.epsilon(event, 1e-6), rel=1e-9)
    assert math.isfinite(result.epsilon_search)
    assert result.epsilon_search > result.epsilon_training
    assert result.tuning_privacy == "tnb"
