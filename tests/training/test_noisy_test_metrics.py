"""Noisy release of test metrics in training (``TrainConfig.test_metrics``): the plan
calibrates the noise for the evaluations the loop makes, the result holds only the noisy
release, the noise is secret unless reproducible, and bad options are refused."""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from pydantic import ValidationError

from dpfair.data import GroupedDataset, load_dataset
from dpfair.errors import ConfigError
from dpfair.fairness import noisy, rates
from dpfair.training import EXACT_TEST_METRICS, TrainConfig, evaluate, make_plan, train
from dpfair.training.evaluation import predict
from tests.conftest import epsilon_oracle

NOISY_KEYS = {"group_accuracy", "group_loss", "accuracy", "loss", "worst_group",
              "worst_group_accuracy"}


@cache
def _data() -> GroupedDataset:
    return load_dataset("synthetic", {"n": 400})  # 288 train, 80 test, 2 groups


def _config(test: dict[str, Any] | None = None, **kw: Any) -> TrainConfig:
    """Non-private with one full batch a step (q = 1): the model does not depend on the
    training generator, so two runs differ only by the test-metric noise."""
    base: dict[str, Any] = {"method": {"name": "nonprivate"},
                            "model": {"name": "logistic_regression"}, "epochs": 2,
                            "batch_size": len(_data().train), "lr": 0.5, "progress": False,
                            "device": "cpu"}
    if test is not None:
        base["test_metrics"] = test
    return TrainConfig.model_validate({**base, **kw})


NOISY = {"release": "noisy", "epsilon": 1.0}


@pytest.mark.parametrize(("epochs", "eval_every", "evaluated"),
                         [(5, 2, (2, 4, 5)), (3, 1, (1, 2, 3)), (4, 4, (4,))])
def test_the_plan_calibrates_the_noise_for_the_evaluations_the_loop_releases(
        epochs: int, eval_every: int, evaluated: tuple[int, ...]) -> None:
    ds = _data()
    cfg = _config(NOISY, epochs=epochs, eval_every=eval_every, delta=1e-5)
    plan = make_plan(cfg, len(ds.train), ds.n_groups, len(ds.test))
    assert plan.eval_epochs == evaluated and plan.test.releases == len(evaluated)
    z = plan.test.noise_multiplier
    assert z == pytest.approx(noisy.calibrate(1.0, 1e-5, len(evaluated), fairness=True))
    # independently: R Gaussian mechanisms of noise multiplier z and the fairness counts' one
    # (test_metrics.fairness, the default) reach the target epsilon
    gaussians = [dp_event.GaussianDpEvent(z)] * len(evaluated) + [
        dp_event.GaussianDpEvent(z * noisy.SENSITIVITY / noisy.COUNTS_SENSITIVITY)]
    assert epsilon_oracle(*gaussians, delta=1e-5) == pytest.approx(1.0, rel=1e-3)
    assert plan.test.epsilon == pytest.approx(1.0, rel=1e-3) and plan.test.delta == 1e-5
    assert "noisy" in plan.test.label and EXACT_TEST_METRICS not in plan.test.label
    if epochs == 3:  # the loop evaluates exactly the planned epochs
        assert [h["epoch"] for h in train(cfg, ds).history] == list(evaluated)


def test_exact_is_the_default_and_is_labelled_not_covered() -> None:
    ds = _data()
    plan = make_plan(_config(), len(ds.train), ds.n_groups, len(ds.test))
    assert not plan.test.noisy and plan.test.epsilon is None
    assert plan.test.label == EXACT_TEST_METRICS
    result = train(_config(), ds)
    assert result.test_predictions is not None and "class_accuracy" in result.test_metrics


def test_noisy_mode_releases_no_exact_test_value_and_its_noise_is_secret() -> None:
    ds = _data()
    cfg = _config(NOISY, lr=1e-3, epochs=1)  # barely trained: exact accuracies inside (0, 1)
    first, second = train(cfg, ds), train(cfg, ds)
    # the same model (q = 1, no gradient noise) ...
    assert all(torch.equal(first.model_state[k], second.model_state[k])
               for k in first.model_state)
    exact = evaluate(first.load_model(), ds.test, ds.n_classes, ds.n_groups)
    assert all(0 < a < 1 for a in exact["group_accuracy"])  # else clipping could meet them
    found = predict(first.load_model(), ds.test)
    exact_rates = rates.exact_rates(found.y_true, found.y_pred, found.groups, ds.n_groups,
                                        ds.n_classes, found.prob)
    for result in (first, second):
        assert result.test_predictions is None and result.test_release.noisy
        for entry in result.history:  # no count, no per-class, no macro; the last: the rates
            assert set(entry["test"]) == NOISY_KEYS | set(exact_rates)
        released = result.test_metrics
        inside = [k for k, v in exact_rates.items() if 0 < np.min(v) and np.max(v) < 1]
        assert inside and all(released[k] != exact_rates[k] for k in inside)
        assert released["accuracy"] != exact["accuracy"]
        assert not set(released["group_accuracy"]) & set(exact["group_accuracy"])
        assert not set(released["group_loss"]) & set(exact["group_loss"])
    # ... released with different (secret) noise
    assert first.test_metrics["group_accuracy"] != second.test_metrics["group_accuracy"]


def test_reproducible_mode_repeats_the_noisy_release() -> None:
    ds = _data()
    runs = [train(_config(NOISY, reproducible=True, seed=3), ds) for _ in range(2)]
    assert runs[0].history == runs[1].history
    other = train(_config(NOISY, reproducible=True, seed=4), ds)
    assert other.test_metrics != runs[0].test_metrics


def test_noise_is_centred_on_the_exact_metrics() -> None:
    """The released accuracy is the exact one plus noise of the planned scale (a large ε:
    small noise), not something else."""
    ds = _data()
    result = train(_config({"release": "noisy", "epsilon": 200.0}), ds)
    exact = evaluate(result.load_model(), ds.test, ds.n_classes, ds.n_groups)
    z = result.test_release.noise_multiplier
    # c/n with both noised at std z*sqrt(3): a loose 6-sigma bound on the overall accuracy
    bound = 6 * z * noisy.SENSITIVITY * math.sqrt(2) / len(ds.test)
    assert abs(result.test_metrics["accuracy"] - exact["accuracy"]) < bound


@pytest.mark.parametrize(("options", "match"), [
    ({"release": "noisy"}, "needs epsilon"),
    ({"release": "exact", "epsilon": 1.0}, "release: noisy only"),
    ({"release": "noisy", "epsilon": 0.0}, "greater than 0"),
    ({"release": "noisy", "epsilon": math.inf}, "finite"),
    ({"release": "noisy", "epsilon": 1.0, "delta": 1.0}, "less than 1"),
    ({"release": "noisy", "epsilon": 1.0, "loss_clip": 0.0}, "greater than 0"),
    ({"release": "noisy", "epsilon": 1.0, "loss_clip": math.nan}, "finite"),
    ({"release": "loud", "epsilon": 1.0}, "'exact' or 'noisy'"),
    ({"release": "noisy", "epsilom": 1.0}, "epsilom"),
])
def test_bad_options_are_refused(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        _config(options)


def test_a_delta_not_below_one_over_n_test_is_refused_before_training() -> None:
    ds = _data()  # 80 test rows: 1/80 = 0.0125
    cfg = _config({"release": "noisy", "epsilon": 1.0, "delta": 0.02})
    with pytest.raises(ConfigError, match=r"test_metrics\.delta.*1/80"):
        train(cfg, ds)
    # the training delta is the default, and is checked against the test split too
    with pytest.raises(ConfigError, match=r"test_metrics\.delta"):
        make_plan(_config(NOISY, delta=0.015, allow_large_delta=False), 10_000, 2, 80)
    assert np.isfinite(make_plan(cfg, len(ds.train), ds.n_groups).test.epsilon)  # n unknown
