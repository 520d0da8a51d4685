"""dpfair.fit: the user's own module and data on the CLI's training path (same config, plan,
model check and accounting)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import dpfair
from dpfair.api import fit
from dpfair.data import load_dataset
from dpfair.data.synthetic import SyntheticOptions, generate
from dpfair.data.tabular_frame import dataset_from_frame
from dpfair.errors import ConfigError, DataError, PrivacyError
from dpfair.methods import registered_methods
from dpfair.training import TrainConfig

BATCHNORM = "BatchNorm mixes samples in a batch; use GroupNorm or LayerNorm"
FAST = {"epochs": 2, "batch_size": 64, "lr": 0.5, "progress": False}


class Residual(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(self.norm(x)))


def _net(d: int = 6, n_classes: int = 2, norm: nn.Module | None = None) -> nn.Module:
    torch.manual_seed(0)
    middle = norm if norm is not None else Residual(8)
    return nn.Sequential(nn.Linear(d, 8), middle, nn.Linear(8, n_classes))


@pytest.fixture(autouse=True)
def _own_project(tmp_path, monkeypatch):
    """fit() charges the privacy ledger of the working directory's project: a temp one."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return generate(SyntheticOptions(n=500, n_features=6))


def test_fit_on_tensors_reaches_the_target_epsilon(arrays) -> None:
    x, y, g = (torch.from_numpy(a) for a in arrays)
    net = _net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    result = fit(net, (x, y, g), target_epsilon=2.0, delta=1e-4, C=1.0, **FAST)
    assert 1.98 < result.epsilon <= 2.0  # calibrated σ: the target, reached from below
    assert result.method == "dpsgd" and result.delta == 1e-4 and result.sigma > 0
    assert result.n_train == 400 - int(0.1 * 400)  # HoldoutOptions: 20% test, 10% validation
    assert result.group_names == ["0", "1"] and len(result.test_metrics["group_accuracy"]) == 2
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())  # untouched
    trained = result.load_model()
    assert not torch.equal(trained[0].weight, net[0].weight)
    assert result.test_metrics["accuracy"] > 0.7  # chance is 0.5


def test_fit_on_arrays_names_classes_and_groups_by_value(arrays) -> None:
    x, y, g = arrays
    labels = np.array(["no", "yes"])[y]
    groups = np.array(["a", "b"])[g]
    result = fit(_net(), (x, labels, groups), sigma=1.0, test_fraction=0.3,
                 validation_fraction=0.2, C=1.0, **FAST)
    assert result.n_train == 500 - int(0.3 * 500) - int(0.2 * (500 - int(0.3 * 500)))
    assert result.class_names == ["no", "yes"] and result.group_names == ["a", "b"]
    assert result.val_metrics is not None and np.isfinite(result.epsilon)


def test_fit_on_a_grouped_dataset_with_the_nonprivate_method_allows_batchnorm() -> None:
    """Plain SGD has no per-sample clipping to break: BatchNorm is accepted there."""
    ds = load_dataset("synthetic", {"n": 300, "n_features": 5})
    result = fit(_net(5, norm=nn.BatchNorm1d(8)), ds, method="nonprivate",
                 budget={"allow_nonprivate_reference": True}, **FAST)
    assert result.privacy_guarantee == "none" and result.epsilon == float("inf")


def test_fit_refuses_batchnorm_for_a_private_method(arrays) -> None:
    with pytest.raises(PrivacyError, match=f"  1: BatchNorm1d: {BATCHNORM}"):
        fit(_net(norm=nn.BatchNorm1d(8)), arrays, sigma=1.0, **FAST)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sigma": 1.0, "target_epsilon": 1.0}, "exactly one of sigma and target_epsilon"),
        ({"sigma": 1.0, "CC": 1.0}, "unknown option 'CC'; did you mean 'C'"),
        ({"sigma": 1.0, "method": "dpsdg"}, "unknown method 'dpsdg'; did you mean 'dpsgd'"),
        ({"sigma": 1.0, "momentun": 0.9}, "unknown option 'momentun'; did you mean 'momentum'"),
        ({"sigma": 1.0, "test_fraction": 1.5}, "test_fraction: Input should be less than 1"),
        ({"sigma": 1.0, "batch_size": 10_000}, "batch_size: 10000 exceeds the 360 training"),
    ],
)
def test_bad_options_are_config_errors_naming_the_key(arrays, kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        fit(_net(), arrays, **{**FAST, **kwargs})


def test_bad_data_is_a_clear_error(arrays) -> None:
    x, y, g = arrays
    with pytest.raises(ConfigError, match="data must be a GroupedDataset, a tuple"):
        fit(_net(), {"x": x}, sigma=1.0, **FAST)
    with pytest.raises(DataError, match="one n"):
        fit(_net(), (x, y[:-1], g), sigma=1.0, **FAST)
    with pytest.raises(DataError, match="one class"):
        fit(_net(), (x, np.zeros_like(y)), sigma=1.0, **FAST)
    bad = x.copy()
    bad[3, 2] = np.nan
    with pytest.raises(DataError, match="NaN"):
        fit(_net(), (bad, y, g), sigma=1.0, **FAST)
    with pytest.raises(ConfigError, match=r"output \(2, 2\); expected logits of shape \(2, 3\)"):
        fit(_net(n_classes=2), (x, np.arange(len(x)) % 3, g), sigma=1.0, **FAST)


def test_method_options_never_shadow_train_options() -> None:
    """fit routes a keyword to TrainConfig when it names a field there, else to the method."""
    train_fields = set(TrainConfig.model_fields)
    for name, spec in registered_methods().items():
        assert not (set(spec.model_fields) - {"name"}) & train_fields, name


def test_import_dpfair_stays_light_and_fit_is_the_api() -> None:
    code = "import sys, dpfair; print('torch' in sys.modules, dpfair.__all__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False ['NO_TELEMETRY', 'fit']"
    assert dpfair.fit is fit


def test_fit_on_a_dataframe_uses_the_tabular_loader(arrays) -> None:
    """Columns by name, the same splits and options as dataset_from_frame, its transform
    returned for raw rows."""
    pd = pytest.importorskip("pandas")
    x, y, g = arrays
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])])
    frame["label"], frame["sex"] = np.array(["no", "yes"])[y], np.array(["m", "f"])[g]
    frame["colour"] = np.array(["red", "green", "blue"])[np.arange(len(frame)) % 3]
    options = {"target": "label", "protected": "sex", "test_fraction": 0.25, "split_seed": 3}
    ds = dataset_from_frame(frame, target="label", protected="sex", test_fraction=0.25, seed=3)
    assert ds.input_shape == (9,)  # 6 numbers and 3 one-hot colours
    with pytest.raises(PrivacyError, match="budget.allow_fitted_preprocessing"):
        fit(_net(9), frame, sigma=1.0, C=1.0, **options, **FAST)  # as dpfair train refuses
    result = fit(_net(9), frame, sigma=1.0, C=1.0, **options, **FAST,
                 budget={"allow_fitted_preprocessing": True})
    assert result.n_train == len(ds.train) and result.group_names == ds.group_names
    assert result.class_names == ["no", "yes"]
    raw = frame.drop(columns=["label", "sex"]).head(4)
    with torch.no_grad():
        logits = result.load_model()(torch.from_numpy(result.preprocessor.transform(raw)))
    assert logits.shape == (4, 2)
    with pytest.raises(ConfigError, match="needs target= and protected="):
        fit(_net(9), frame, sigma=1.0, **FAST)


def test_tune_takes_the_mappings_its_types_allow_and_writes_no_file(tmp_path, monkeypatch):
    """`tune()` with plain dicts (MethodSpec, RunConfig, TuningConfig are Mappings too) trains
    with dpfair's training; without a storage named, the study stays in memory."""
    from dpfair.tuning import tune
    from dpfair.tuning.study import IN_MEMORY

    monkeypatch.chdir(tmp_path)
    dataset = load_dataset("synthetic", {"n": 300})
    base = {"epochs": 1, "batch_size": 32, "lr": 0.5, "sigma": 1.0, "progress": False,
            "model": {"name": "logistic_regression"}}
    result = tune({"name": "dpsgd", "C": 1.0}, base, dataset,
                  {"mode": "fixed", "n_runs": 1, "space": {"lr": [0.2, 0.5]}})
    assert result.best_params is not None and result.best_params["lr"] in (0.2, 0.5)
    assert result.storage == IN_MEMORY and list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="batch_size"):
        tune({"name": "dpsgd"}, {**base, "batch_size": -1}, dataset,
             {"mode": "fixed", "n_runs": 1, "space": {"lr": [0.2]}})
