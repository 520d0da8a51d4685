"""Resource bounds (issue 33.4): plans are O(1) in epochs and steps, every count has a
documented maximum refused before any work, and the artifact folder must have room for the
models a run logs."""

from __future__ import annotations

import time

import pytest

from dpfair.config.params import parse_params
from dpfair.data import load_dataset
from dpfair.errors import ConfigError, UnreachableError
from dpfair.training import TrainConfig, make_plan
from dpfair.training.config import MAX_EPOCHS, MAX_STEPS
from dpfair.training.run_plan import EvalEpochs, evaluated_epochs
from dpfair.tuning.config import MAX_RUNS


@pytest.mark.parametrize(("n", "every"), [(1, 1), (5, 2), (4, 4), (7, 3), (10, 1), (3, 5)])
def test_evaluated_epochs_are_every_nth_and_the_last(n, every):
    expected = tuple(e for e in range(1, n + 1) if e % every == 0 or e == n)
    got = evaluated_epochs(n, every)
    assert got == expected and tuple(got) == expected and len(got) == len(expected)
    assert [e for e in range(0, n + 3) if e in got] == list(expected)


def test_a_plan_holds_no_per_epoch_tuple():
    """10^12 epochs made plan.py build a tuple of every epoch (22.8 GB); now two numbers."""
    huge = evaluated_epochs(10**12, 1)
    assert isinstance(huge, EvalEpochs) and len(huge) == 10**12 and 10**12 in huge
    start = time.perf_counter()
    cfg = TrainConfig(method={"name": "dpsgd", "C": 1.0}, epochs=MAX_EPOCHS, batch_size=1000,
                      sigma=1.0, delta=1e-6)
    plan = make_plan(cfg, 100_000, 2)
    assert plan.steps == MAX_EPOCHS * 100 and len(plan.eval_epochs) == MAX_EPOCHS
    assert time.perf_counter() - start < 60  # a guard against a hang, not a timing


@pytest.mark.parametrize(("train", "message"), [
    ({"epochs": 10**12}, f"epochs: Input should be less than or equal to {MAX_EPOCHS}"),
    ({"steps": 10**12}, f"steps: Input should be less than or equal to {MAX_STEPS}"),
])
def test_counts_over_their_maximum_are_refused_when_params_load(train, message):
    with pytest.raises(ConfigError, match=message):
        parse_params({"experiment": {"train": {"sigma": 1.0, **train}}})


def test_epochs_times_steps_per_epoch_over_the_maximum_is_refused_before_planning():
    cfg = TrainConfig(method={"name": "dpsgd", "C": 1.0}, epochs=MAX_EPOCHS, batch_size=1,
                      sigma=1.0, delta=1e-6)
    with pytest.raises(ConfigError, match=rf"over the maximum of {MAX_STEPS} for one run"):
        make_plan(cfg, 10_000, 2)


@pytest.mark.parametrize(("tuning", "message"), [
    ({"mu": 1e9}, f"must be between 1 and {MAX_RUNS}"),
    ({"mode": "fixed", "n_runs": 10**6}, f"less than or equal to {MAX_RUNS}"),
    ({"workers": 10**5}, "less than or equal to 256"),
])
def test_tuning_counts_have_a_maximum(tuning, message):
    with pytest.raises(ConfigError, match=message):
        parse_params({"tuning": tuning})


def test_a_full_artifact_folder_is_refused_before_anything_trains(tmp_path):
    from dpfair.pipeline.check_step import check_model_space

    params = parse_params({
        "tracking": {"uri": f"sqlite:///{tmp_path / 'm.db'}",
                     "artifact_root": str(tmp_path / "art")},
        "datasets": {"synthetic": {"n": 200}},
        "experiment": {"dataset": "synthetic", "model": {"name": "mlp", "hidden": [64]},
                       "train": {"sigma": 1.0, "epochs": 1}}})
    dataset = load_dataset("synthetic", params.dataset("synthetic"))
    check_model_space(params, dataset, 2)  # room for two small models
    with pytest.raises(UnreachableError, match=r"artifact folder .*art: .* MiB needed, .* MiB "
                                               "free; free space there"):
        check_model_space(params, dataset, 10**9)
