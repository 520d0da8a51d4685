"""params.yaml models: every bad value is one ConfigError naming the key path."""

from __future__ import annotations

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dpfair.config.params import (
    ConfigError,
    Params,
    format_validation_error,
    load_params,
    parse_params,
)
from dpfair.data import available_datasets


def _error(data) -> str:
    with pytest.raises(ConfigError) as err:
        parse_params(data)
    return str(err.value)


def test_repo_params_are_the_defaults(repo_root):
    params = load_params(repo_root / "params.yaml")
    # one fact in one place: params.yaml restates the loaders' defaults, nothing else
    assert params.datasets == Params().datasets
    assert list(type(params.datasets).model_fields) == available_datasets()
    assert params.dataset("adult").balance_groups is True
    assert params.datasets.mnist.minority_fraction == 0.09


def test_partial_file_fills_defaults(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("datasets:\n  adult:\n    balance_groups: false\n")
    params = load_params(path)
    assert params.datasets.adult.balance_groups is False
    assert params.datasets.adult.samples_per_group == 14000
    assert params.datasets.dutch == Params().datasets.dutch
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_params(empty) == Params()


def test_unknown_key_did_you_mean():
    msg = _error({"datasets": {"adult": {"balance_group": True}}})
    assert msg.startswith("invalid params.yaml: ")
    assert "datasets.adult.balance_group: unknown key 'balance_group'" in msg
    assert "did you mean 'balance_groups'?" in msg


def test_unknown_dataset_and_section_did_you_mean():
    msg = _error({"datasets": {"adutl": {}}})
    assert "datasets.adutl: unknown dataset 'adutl'; did you mean 'adult'?" in msg
    msg = _error({"dataset": {}})
    assert "dataset: unknown section 'dataset'; did you mean 'datasets'?" in msg


def test_method_keys_inside_the_union_did_you_mean():
    """pydantic puts the method's tag into the location of a discriminated union's error; the
    message shows the path as written, and a case slip gets its suggestion."""
    msg = _error({"experiment": {"methods": {"dpsgd": {"c": 1.0}}}})
    assert "experiment.methods.dpsgd.c: unknown key 'c'; did you mean 'C'?" in msg
    assert "dpsgd.dpsgd" not in msg
    msg = _error({"experiment": {"methods": {"fair": {"name": "dpsgd_f", "C00": 1.0}}}})
    assert "experiment.methods.fair.C00: unknown key 'C00'; did you mean 'C0'?" in msg


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"adult": {"validation_fraction": 1.5}},
         "datasets.adult.validation_fraction: Input should be less than 1 (got 1.5)"),
        ({"mnist": {"minority_fraction": 0}},
         "datasets.mnist.minority_fraction: Input should be greater than 0 (got 0)"),
        ({"mnist": {"minority_fraction": 1.2}},
         "datasets.mnist.minority_fraction: Input should be less than or equal to 1 (got 1.2)"),
        ({"dutch": {"test_fraction": -0.1}},
         "datasets.dutch.test_fraction: Input should be greater than 0 (got -0.1)"),
        ({"adult": {"samples_per_group": -5}},
         "datasets.adult.samples_per_group: Input should be greater than 0 (got -5)"),
        ({"mnist": {"minority_count": -1}},
         "datasets.mnist.minority_count: Input should be greater than or equal to 1 (got -1)"),
        ({"synthetic": {"n": -1}},
         "datasets.synthetic.n: Input should be greater than or equal to 10 (got -1)"),
        ({"adult": {"balance_groups": "maybe"}},
         "datasets.adult.balance_groups: Input should be a valid boolean (got 'maybe')"),
        ({"adult": {"seed": "abc"}},
         "datasets.adult.seed: Input should be a valid integer (got 'abc')"),
        ({"adult": {"seed": 1.5}},
         "datasets.adult.seed: Input should be a valid integer (got 1.5)"),
        ({"dutch": {"test_fraction": "0.2"}},
         "datasets.dutch.test_fraction: Input should be a valid number (got '0.2')"),
        ({"adult": {"protected": "sx"}},
         "datasets.adult.protected: Input should be 'sex' or 'race' (got 'sx'); "
         "did you mean 'sex'?"),
        ({"mnist": {"minority_fraction": 0.1, "minority_count": 500}},
         "datasets.mnist: give exactly one of minority_fraction and minority_count, not both"),
        ({"adult": [1, 2]},
         "datasets.adult: expected a mapping of keys to values, got [1, 2]"),
    ],
)
def test_bad_values_are_one_clear_line(data, expected):
    msg = _error({"datasets": data})
    assert msg == f"invalid params.yaml: {expected}"


def test_several_errors_in_one_message():
    msg = _error({"datasets": {"adult": {"seed": -1}, "dutch": {"tset_fraction": 0.2}}})
    lines = msg.splitlines()
    assert lines[0] == "invalid params.yaml:"
    assert "  datasets.adult.seed: Input should be greater than or equal to 0 (got -1)" in lines
    assert any(line.startswith("  datasets.dutch.tset_fraction: unknown key") for line in lines)


def test_not_a_mapping_top_level_and_datasets():
    assert "the top level must be a mapping" in _error([1, 2])
    assert "datasets: expected a mapping of keys to values, got None" in _error({"datasets": None})


def test_missing_file_and_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="parameters file not found: .*nope.yaml"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("datasets:\n  adult: {seed: 1\n")
    with pytest.raises(ConfigError, match=r"invalid YAML in .*bad.yaml at line \d+, column \d+"):
        load_params(bad)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump({"datasets": {"adult": {"seed": "x"}}}))
    with pytest.raises(ConfigError, match=r"invalid .*wrong.yaml: datasets.adult.seed"):
        load_params(wrong)


def test_config_error_is_value_error():
    assert issubclass(ConfigError, ValueError)


def test_format_validation_error_is_reusable():
    """Future sections (experiment, methods, ...) get the same messages."""

    class Method(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        lr: float = Field(0.1, gt=0)

    class Methods(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        methods: dict[str, Method] = Field(default_factory=dict)

    with pytest.raises(ValidationError) as err:
        Methods.model_validate({"methods": {"dpsgd": {"lrr": 1.0, "lr": -1.0}}})
    text = format_validation_error(err.value, Methods, prefix=("experiment",))
    assert "experiment.methods.dpsgd.lrr: unknown key 'lrr'; did you mean 'lr'?" in text
    assert "experiment.methods.dpsgd.lr: Input should be greater than 0 (got -1.0)" in text


def test_budget_and_release_sections():
    """``budget`` refuses releases without guarantee by default; ``tuning.release`` picks what
    a search publishes; the repo's params.yaml is a demo that allows both, with a budget."""
    default = Params()
    assert default.budget.epsilon is None and default.budget.delta is None
    assert not default.budget.allow_heuristic and not default.budget.allow_nonprivate_reference
    assert default.tuning.release == "selected" and default.experiment.nonprivate_reference
    params = parse_params({"tuning": {"release": "all_trials", "mode": "fixed", "n_runs": 2},
                           "budget": {"epsilon": 3, "delta": 1e-6}})
    assert params.tuning.release == "all_trials" and "release" not in params.tuning.settings
    assert params.tuning.settings == {"mode": "fixed", "n_runs": 2}
    assert (params.budget.epsilon, params.budget.delta) == (3.0, 1e-6)
    assert "tuning.release: Input should be 'selected' or 'all_trials' (got 'every')" in _error(
        {"tuning": {"release": "every"}})
    assert "budget.epsilon: Input should be greater than 0" in _error({"budget": {"epsilon": 0}})
    assert "budget.allow_heuristc: unknown key" in _error({"budget": {"allow_heuristc": True}})


def test_repo_params_budget_covers_the_demo(repo_root):
    params = load_params(repo_root / "params.yaml")
    assert params.budget.epsilon is not None
    assert params.budget.allow_nonprivate_reference and params.budget.allow_heuristic
    assert params.tuning.release == "selected"


def test_a_key_given_twice_is_refused_not_the_last_kept(tmp_path):
    """Duplicate YAML keys: the second would silently win (σ 1 -> 0.3, a different ε)."""
    path = tmp_path / "p.yaml"
    path.write_text("experiment:\n  train:\n    sigma: 1.0\n    epochs: 2\n    sigma: 0.3\n")
    with pytest.raises(ConfigError, match=r"line 5.*'sigma' is given twice \(first at line 3"):
        load_params(path)
    path.write_text("experiment: {seeds: [0]}\nexperiment: {seeds: [1]}\n")
    with pytest.raises(ConfigError, match="'experiment' is given twice"):
        load_params(path)


@pytest.mark.parametrize(("data", "key"), [
    ({"experiment": {"train": {"epochs": True, "sigma": 1.0}}}, "experiment.train.epochs"),
    ({"experiment": {"seeds": [0, True]}}, r"experiment.seeds\[1\]"),
    ({"experiment": {"methods": {"dpsgd": {"C": True}}}}, "experiment.methods.dpsgd.C"),
    ({"experiment": {"train": {"epochs": 2, "batch_size": True, "sigma": 1.0}}},
     "experiment.train.batch_size"),
])
def test_a_boolean_where_a_number_is_expected_is_refused(data, key):
    with pytest.raises(ConfigError, match=rf"{key}: a boolean \(true/false\) where a number"):
        parse_params(data)


def test_booleans_where_booleans_are_expected_still_load():
    p = parse_params({"datasets": {"adult": {"balance_groups": True}},
                      "experiment": {"train": {"reproducible": True, "sigma": 1.0,
                                                      "epochs": 2}}})
    assert p.experiment.train.reproducible is True


def test_an_infinite_clip_bound_is_refused():
    """C = inf bounds no one's contribution: the sensitivity would be infinite."""
    msg = _error({"experiment": {"methods": {"dpsgd": {"C": float("inf")}}}})
    assert "experiment.methods.dpsgd.C: Input should be a finite number (got inf)" in msg


def test_a_folder_given_as_the_parameters_file_says_so(tmp_path):
    with pytest.raises(ConfigError, match=r"is a folder: give the YAML file in it"):
        load_params(tmp_path)


def test_an_empty_kind_and_unsafe_dataset_names_get_clear_messages():
    msg = _error({"datasets": {"mine": {"kind": None, "path": "x.csv"}}})
    assert "datasets.mine: kind is empty; give one of: " in msg and "Assertion" not in msg
    for name in (".", "..", "a/b"):
        msg = _error({"datasets": {name: {"kind": "table", "path": "x.csv", "target": "y",
                                          "protected": "g"}}})
        assert f"the dataset name {name!r} cannot name a folder of prepared data" in msg
        with pytest.raises(ConfigError, match="is no dataset name .* a name has letters"):
            parse_params({}).dataset(name)


@pytest.mark.parametrize("value", ["12GB", -1, 0, 1.5])
def test_max_engine_memory_is_a_whole_number_of_mib(value):
    train = {"epochs": 2, "sigma": 1.0, "max_engine_memory": value}
    msg = _error({"experiment": {"train": train}})
    assert msg.startswith("invalid params.yaml: experiment.train.max_engine_memory: ")
    assert f"whole number of MiB between 1 and 1073741824, got {value!r}: write e.g. 12288" in msg
    train["max_engine_memory"] = 12288
    params = parse_params({"experiment": {"train": train}})
    assert params.experiment.train.max_engine_memory == 12288
