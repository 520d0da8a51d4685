"""Every bad input of issue 15's audit is a clear error that names the key, the value and the
fix, raised before anything trains (and, where the rule does not need the data, before any
data is loaded)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from dpfair.config.params import parse_params
from dpfair.errors import ConfigError
from dpfair.training import TrainConfig, make_plan

BASE: dict[str, Any] = {
    "method": {"name": "dpsgd"},
    "model": {"name": "logistic_regression"},
    "epochs": 1,
    "batch_size": 50,
    "sigma": 1.0,
}


def _params(**train: Any) -> dict[str, Any]:
    return {"experiment": {"dataset": "synthetic", "model": {"name": "logistic_regression"},
                           "train": {"epochs": 1, "batch_size": 50, "sigma": 1.0, **train},
                           "seeds": [0]}}


# ---------------------------------------------------------------- case 1: sigma, lr, floats


@pytest.mark.parametrize("sigma", [0.0, 1e-300, math.inf])
def test_private_method_needs_finite_positive_sigma(sigma: float) -> None:
    with pytest.raises(ConfigError) as err:
        parse_params(_params(sigma=sigma))
    message = str(err.value)
    assert "train.sigma" in message and f"{sigma} is not a noise multiplier" in message
    assert "set 1e-06 <= sigma < inf" in message and "'dpsgd'" in message


def test_nonprivate_still_ignores_sigma() -> None:
    config = TrainConfig(**{**BASE, "method": {"name": "nonprivate"}, "sigma": 0.0})
    assert make_plan(config, 100, 2).sigma == 0.0


@pytest.mark.parametrize("key", ["lr", "weight_decay", "target_epsilon"])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_float_fields_must_be_finite(key: str, value: float) -> None:
    data = {**BASE, key: value, **({"sigma": None} if key == "target_epsilon" else {})}
    with pytest.raises(ValidationError) as err:
        TrainConfig(**data)
    assert err.value.errors()[0]["loc"] == (key,)
    assert "finite number" in str(err.value)


def test_infinite_lr_in_params_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"experiment\.train\.lr: .*finite number \(got inf\)"):
        parse_params(_params(lr=math.inf))


# ------------------------------------------------------------------- case 2: delta < 1/n


def test_delta_not_below_one_over_n_is_refused_with_its_opt_out() -> None:
    config = TrainConfig(**BASE, delta=0.5)
    with pytest.raises(ConfigError) as err:
        make_plan(config, 1205, 2)
    message = str(err.value)
    assert "delta: 0.5 is not below 1/n_train = 1/1205" in message
    assert "set delta below 0.00083" in message and "e.g. 1e-05" in message
    assert "allow_large_delta: true" in message and "recorded" in message


def test_delta_just_at_one_over_n_is_refused_and_below_accepted() -> None:
    with pytest.raises(ConfigError, match="not below 1/n_train = 1/100"):
        make_plan(TrainConfig(**BASE, delta=0.01), 100, 2)
    assert make_plan(TrainConfig(**BASE, delta=0.0099), 100, 2).delta == 0.0099


def test_large_delta_opt_out_is_recorded_in_the_config() -> None:
    config = TrainConfig(**BASE, delta=0.5, allow_large_delta=True)
    assert make_plan(config, 1205, 2).delta == 0.5
    assert config.model_dump()["allow_large_delta"] is True


def test_nonprivate_reference_has_no_delta_to_check() -> None:
    config = TrainConfig(**{**BASE, "method": {"name": "nonprivate"}}, delta=0.5)
    assert math.isinf(make_plan(config, 100, 2).epsilon)


# ------------------------------------------ cases 4 and 6: search spaces, at load_params time


def _with_space(space: dict[str, Any], label: str = "dpsgd") -> dict[str, Any]:
    return {**_params(), "tuning": {"spaces": {label: space}}}


@pytest.mark.parametrize(
    "space, label, expected",
    [
        ({"learning_rate": [0.1]}, "dpsgd",
         "tuning.spaces.dpsgd.learning_rate: 'learning_rate' is not a hyperparameter of method "
         "'dpsgd' or of training; did you mean 'lr'? (allowed: C, "),
        ({"lr": ["fast"]}, "dpsgd",
         "tuning.spaces.dpsgd.lr: the value 'fast' is invalid (Input should be a valid number"),
        ({"C": [1.0, -1]}, "dpsgd",
         "tuning.spaces.dpsgd.C: the value -1 is invalid (Input should be greater than 0); "
         "list only values that C accepts"),
        ({"batch_size": [-1]}, "dpsgd", "tuning.spaces.dpsgd.batch_size: the value -1 is invalid"),
        ({"sigma": [0.0]}, "dpsgd",
         "tuning.spaces.dpsgd.sigma: the value 0.0 is invalid (0.0 is not a noise multiplier"),
        ({"C": [1.0]}, "dpsdg",
         "tuning.spaces.dpsdg: no method 'dpsdg' in experiment.methods; did you mean 'dpsgd'?"),
    ],
)
def test_search_space_is_checked_when_params_load(
    monkeypatch: pytest.MonkeyPatch, space: dict[str, Any], label: str, expected: str
) -> None:
    import dpfair.data

    def no_data(*args: object, **kwargs: object) -> None:
        raise AssertionError("data was loaded before the search space was checked")

    monkeypatch.setattr(dpfair.data, "load_dataset", no_data)
    monkeypatch.setattr(dpfair.data, "load_prepared", no_data)
    with pytest.raises(ConfigError) as err:
        parse_params(_with_space(space, label))
    assert expected in str(err.value)
    assert "training Allowed" not in str(err.value)


def test_valid_search_space_loads() -> None:
    params = parse_params(_with_space({"lr": [0.1, 0.5], "C": [0.5, 1.0]}))
    assert params.tuning.spaces["dpsgd"] == {"lr": [0.1, 0.5], "C": [0.5, 1.0]}


# ------------------------------- cases 2-5 that need the data: right after loading, before all


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any training (final runs or a search's) fails the test."""
    import dpfair.pipeline.method_steps
    import dpfair.training

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("something trained before the settings were checked")

    monkeypatch.setattr(dpfair.training, "train", refuse)
    monkeypatch.setattr(dpfair.pipeline.method_steps, "train", refuse)
    monkeypatch.setattr(dpfair.pipeline.method_steps, "tune", refuse)


def _plan(tmp_path: Any, data: dict[str, Any], n: int = 400, **options: Any) -> None:
    """Load params and data as the flow does, then plan the release."""
    from dpfair.data import load_dataset
    from dpfair.pipeline.release_step import plan_release

    spaces = data.get("tuning", {}).get("spaces", {})
    data = {**data, "datasets": {"synthetic": {"n": n, **options}},
            "budget": {"allow_nonprivate_reference": True, **data.get("budget", {})}}
    if spaces:
        data["tuning"] = {**data["tuning"], "storage": f"journal:{tmp_path}/study.log"}
    params = parse_params(data)
    dataset = load_dataset("synthetic", params.dataset("synthetic"))
    plan_release(params, dataset, {label: f"study-{label}" for label in params.experiment.methods
                                   if label in spaces})  # as flows/experiment.py does


def _nothing_opened(tmp_path: Any) -> None:
    assert not (tmp_path / "study.log").exists()  # no search opened a study


@pytest.mark.parametrize(
    "pair, expected",
    [
        (["2", "99"], "experiment.pair: '2' is not a group of dataset 'synthetic' (its groups: "
                      "majority, minority); name two of them"),
        (["majority", "minortiy"], "'minortiy' is not a group of dataset 'synthetic'; did you "
                                   "mean 'minority'?"),
    ],
)
def test_unknown_pair_is_refused_before_training(
    tmp_path: Any, no_training: None, pair: list[str], expected: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _plan(tmp_path, {**_params(), "experiment": {**_params()["experiment"], "pair": pair}})
    assert expected in str(err.value)


def test_batch_larger_than_the_data_is_refused_before_training(
    tmp_path: Any, no_training: None
) -> None:
    with pytest.raises(ConfigError) as err:
        _plan(tmp_path, _params(batch_size=100000))
    assert str(err.value).startswith("experiment.train.batch_size: 100000 exceeds the 288")
    assert "set experiment.train.batch_size to at most 288" in str(err.value)


def test_searched_batch_larger_than_the_data_is_refused_before_any_study(
    tmp_path: Any, no_training: None
) -> None:
    with pytest.raises(ConfigError, match=r"tuning\.spaces\.dpsgd\.batch_size: 100000 exceeds"):
        _plan(tmp_path, _with_space({"batch_size": [50, 100000]}))
    _nothing_opened(tmp_path)


def test_training_delta_not_below_one_over_n_names_its_key_and_opt_out(
    tmp_path: Any, no_training: None
) -> None:
    with pytest.raises(ConfigError) as err:
        _plan(tmp_path, _params(delta=0.01))
    message = str(err.value)
    assert message.startswith("experiment.train.delta: 0.01 is not below 1/n_train = 1/288")
    assert "experiment.train.allow_large_delta: true" in message


def test_budget_delta_not_below_one_over_n_is_refused_unless_allowed(
    tmp_path: Any, no_training: None
) -> None:
    with pytest.raises(ConfigError) as err:
        _plan(tmp_path, {**_params(), "budget": {"delta": 0.5}})
    assert str(err.value).startswith("budget.delta: 0.5 is not below 1/n_train")
    assert "budget.allow_large_delta: true" in str(err.value)
    _plan(tmp_path, {**_params(), "budget": {"delta": 0.5, "allow_large_delta": True}})


def test_budget_too_small_for_one_run_is_refused_before_training(
    tmp_path: Any, no_training: None
) -> None:
    from dpfair.errors import PrivacyError

    with pytest.raises(PrivacyError) as err:
        _plan(tmp_path, {**_params(), "budget": {"epsilon": 0.01}})
    message = str(err.value)
    assert message.startswith("budget.epsilon: 0.01 is too small for even one training run of "
                              "'dpsgd'")
    assert "raise budget.epsilon or raise experiment.train.sigma" in message


def test_search_budget_too_small_for_one_run_is_refused_before_any_study(
    tmp_path: Any, no_training: None
) -> None:
    from dpfair.errors import BudgetExceededError

    data = _with_space({"lr": [0.1, 0.5]})
    data["tuning"]["budget_epsilon"] = 0.01
    with pytest.raises(BudgetExceededError) as err:
        _plan(tmp_path, data)
    assert str(err.value).startswith("tuning.budget_epsilon: 0.01 is too small for even one "
                                     "training run of the search of 'dpsgd'")
    assert "search a cheaper space" in str(err.value)
    _nothing_opened(tmp_path)


def test_search_on_an_empty_validation_split_is_refused(tmp_path: Any, no_training: None) -> None:
    from dpfair.errors import TuningError

    with pytest.raises(TuningError) as err:
        _plan(tmp_path, _with_space({"lr": [0.1, 0.5]}), validation_fraction=0.0)
    assert "set datasets.synthetic.validation_fraction above 0" in str(err.value)
    _nothing_opened(tmp_path)


@pytest.mark.parametrize("key", ["sigma_score", "loss_clip"])
def test_score_release_settings_must_be_finite(key: str) -> None:
    with pytest.raises(ConfigError, match=rf"tuning: {key}: .*finite number \(got inf\)"):
        parse_params({"tuning": {key: math.inf}})


def test_pipeline_refuses_a_space_it_would_not_tune(tmp_path: Any, no_training: None) -> None:
    data = {**_params(), "tuning": {"spaces": {"nonprivate": {"lr": [0.1, 0.5]}}}}
    with pytest.raises(ConfigError, match=r"tuning\.spaces\.nonprivate: the pipeline tunes only"):
        _plan(tmp_path, data)


def test_search_delta_not_below_one_over_n_is_refused_before_any_study(
    tmp_path: Any, no_training: None
) -> None:
    data = _with_space({"lr": [0.1, 0.5]})
    data["tuning"]["delta"] = 0.5
    with pytest.raises(ConfigError) as err:
        _plan(tmp_path, data)
    assert str(err.value).startswith("tuning.delta: 0.5 is not below 1/n_train = 1/288")
    assert "experiment.train.allow_large_delta: true" in str(err.value)
    _nothing_opened(tmp_path)
