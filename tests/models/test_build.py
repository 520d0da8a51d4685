"""Models: parameter counts against the papers, output shapes, configuration errors."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from pydantic import ValidationError
from torch import nn
from typer.testing import CliRunner

from dpfair.cli.commands import app
from dpfair.config.params import parse_params
from dpfair.data import load_dataset
from dpfair.errors import ConfigError, PrivacyError
from dpfair.models import (
    EsipovaCNNConfig,
    ImportModelConfig,
    LogisticRegressionConfig,
    MLPConfig,
    ZhaoCNNConfig,
    build_model,
    n_params,
    parse_model_config,
    resolve_target,
)
from dpfair.training import train

PUBLISHED_YAML = Path(__file__).resolve().parents[3] / "shared" / "reference" / "published.yaml"

# Esipova et al. 2023, App. B.3 (published.yaml: esipova2023.settings.models), with the input
# shapes of her code's preprocessing: Adult one-hot d = 98, Dutch one-hot d = 59.
ESIPOVA = {
    "adult": (MLPConfig(hidden=[256, 256], activation="tanh"), (98,), 2, 91_650),
    "dutch": (LogisticRegressionConfig(), (59,), 2, 120),
    "celeba": (EsipovaCNNConfig(), (3, 64, 64), 2, 120_722),
}
ALLOWED_MODULES = (nn.Sequential, nn.Linear, nn.Conv2d, nn.Tanh, nn.ReLU, nn.MaxPool2d, nn.Flatten)


@pytest.mark.parametrize("dataset", sorted(ESIPOVA))
def test_esipova_parameter_counts(dataset: str) -> None:
    cfg, shape, n_classes, published = ESIPOVA[dataset]
    assert n_params(build_model(cfg, shape, n_classes)) == published


def test_counts_agree_with_published_yaml() -> None:
    if not PUBLISHED_YAML.exists():
        pytest.skip(f"{PUBLISHED_YAML} not present")
    yaml = pytest.importorskip("yaml")
    models = yaml.safe_load(PUBLISHED_YAML.read_text())["esipova2023"]["settings"]["models"]
    for dataset, (*_, published) in ESIPOVA.items():
        assert models[dataset]["n_params"] == published
    assert models["mnist"]["n_params"] == 80_522


def test_esipova_mnist_cnn_is_her_code_not_her_published_count() -> None:
    """Her code's CNN on 1x28x28 has 97,114 parameters; 80,522 is unreachable (see models)."""
    model = build_model(EsipovaCNNConfig(), (1, 28, 28), 10)
    assert n_params(model) == 97_114
    conv_params = sum(n_params(m) for m in model if isinstance(m, nn.Conv2d))
    assert conv_params == 4_944 and (80_522 - conv_params - 10) % 10 != 0


def test_zhao_cnn_structure() -> None:
    model = build_model(ZhaoCNNConfig(), (1, 28, 28), 10)
    convs = [m for m in model if isinstance(m, nn.Conv2d)]
    linears = [m for m in model if isinstance(m, nn.Linear)]
    assert [c.out_channels for c in convs] == [64, 64]
    assert sum(isinstance(m, nn.MaxPool2d) for m in model) == 2
    assert [lin.out_features for lin in linears] == [500, 500, 10]
    assert linears[0].in_features == 64 * 4 * 4
    assert n_params(model) == 805_578


CASES = [
    (LogisticRegressionConfig(), (7,)),
    (MLPConfig(hidden=[16, 8], activation="relu"), (7,)),
    (LogisticRegressionConfig(), (1, 8, 8)),
    (EsipovaCNNConfig(), (1, 8, 8)),
    (EsipovaCNNConfig(channels=[4, 4, 4]), (3, 12, 10)),
    (ZhaoCNNConfig(padding=1, hidden=[32, 32]), (1, 8, 8)),
    (ZhaoCNNConfig(channels=[8, 8], hidden=[16]), (1, 28, 28)),
]


@pytest.mark.parametrize(("cfg", "shape"), CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_output_shape_and_layers(cfg, shape: tuple[int, ...]) -> None:
    model = build_model(cfg, shape, 3)
    assert model(torch.randn(5, *shape)).shape == (5, 3)
    assert model(torch.randn(0, *shape)).shape == (0, 3)
    assert all(isinstance(m, ALLOWED_MODULES) for m in model.modules())


def test_parse_and_round_trip() -> None:
    cfg = parse_model_config({"name": "mlp", "hidden": [3], "activation": "relu"})
    assert cfg == MLPConfig(hidden=[3], activation="relu")
    assert parse_model_config(cfg.model_dump()) == cfg


@pytest.mark.parametrize(
    "data",
    [
        {"name": "resnet"},
        {"name": "mlp", "hidden": []},
        {"name": "mlp", "hidden": [0]},
        {"name": "mlp", "activation": "sigmoid"},
        {"name": "esipova_cnn", "bias": False},
        {"name": "zhao_cnn", "padding": -1},
    ],
)
def test_bad_configs_are_validation_errors(data: dict) -> None:
    with pytest.raises(ValidationError):
        parse_model_config(data)


def test_bad_shapes_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="image inputs"):
        build_model(EsipovaCNNConfig(), (64,), 2)
    with pytest.raises(ValueError, match="too small"):
        build_model(ZhaoCNNConfig(), (1, 8, 8), 10)
    with pytest.raises(ValueError, match="at least 2 classes"):
        build_model(LogisticRegressionConfig(), (4,), 1)


# ---------------------------------------------------------------- own model by import path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BATCHNORM = "BatchNorm mixes samples in a batch; use GroupNorm or LayerNorm"


@pytest.fixture
def own_models(monkeypatch):
    """``tests/fixtures`` on ``sys.path``, so ``own_models:<factory>`` imports."""
    monkeypatch.syspath_prepend(str(FIXTURES))


def _import(target: str, **kwargs) -> ImportModelConfig:
    return parse_model_config({"name": "import", "target": target, "kwargs": kwargs})


def test_import_factory_gets_shape_and_classes(own_models) -> None:
    model = build_model(_import("own_models:residual_net", width=8), (1, 4, 5), 3)
    assert model(torch.randn(6, 1, 4, 5)).shape == (6, 3)
    assert any(isinstance(m, nn.LayerNorm) for m in model.modules())
    assert model[1].out_features == 8  # the kwarg reached the factory


def test_import_class_gets_only_what_its_signature_names(own_models) -> None:
    """``ResidualNet(n_classes, d_in, width)`` names no input_shape: it is not passed."""
    model = build_model(_import("own_models:ResidualNet", d_in=7), (7,), 4)
    assert model(torch.randn(2, 7)).shape == (2, 4)
    cfg = _import("own_models:ResidualNet", d_in=7)
    assert parse_model_config(cfg.model_dump()) == cfg


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("own_models.residual_net", "not 'package.module:factory'.*did you mean "
                                    "'own_models:residual_net'"),
        ("no_such_module_xyz:make", "cannot import module 'no_such_module_xyz'.*PYTHONPATH "
                                    r"\(sys.path: "),
        ("own_models:residul_net", "'own_models' has no attribute 'residul_net'; did you mean "
                                   "'residual_net'"),
        ("own_models:Residual.nope", "'own_models:Residual' has no attribute 'nope'"),
        ("own_models:NOT_CALLABLE", r"is not callable \(type int\): name a class"),
    ],
)
def test_bad_import_targets_are_clear_errors(own_models, target, message):
    """A ConfigError from the resolver; the same message from the config's validation."""
    with pytest.raises(ConfigError, match=message):
        resolve_target(target)
    with pytest.raises(ValidationError, match=message):
        _import(target)


def test_kwargs_cannot_override_what_the_data_gives(own_models) -> None:
    with pytest.raises(ValidationError, match="n_classes come.* from the dataset"):
        _import("own_models:residual_net", n_classes=2)


@pytest.mark.parametrize(
    ("target", "kwargs", "message"),
    [
        ("own_models:not_a_module", {}, "returned a str, not a torch.nn.Module"),
        ("own_models:wrong_width", {}, r"gave output \(2, 5\); expected logits of shape "
                                       r"\(2, 3\)"),
        ("own_models:residual_net", {"widht": 4}, "widht.*did you mean 'width'"),
        ("own_models:ResidualNet", {"d_in": 9}, r"forward pass failed on a dummy batch of "
                                                r"shape \(2, 6\)"),
    ],
)
def test_bad_import_models_fail_at_build(own_models, target, kwargs, message):
    cfg = _import(target, **kwargs)
    with pytest.raises(ConfigError, match=message):
        build_model(cfg, (6,), 3)


def test_import_errors_inside_the_users_module_are_not_called_missing(tmp_path, monkeypatch):
    (tmp_path / "broken_models_a.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "broken_models_b.py").write_text("import not_installed_dep_zz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="importing module 'broken_models_a' failed: "
                                          "RuntimeError: boom"):
        resolve_target("broken_models_a:f")
    with pytest.raises(ConfigError, match="importing module 'broken_models_b' failed: .*"
                                          "not_installed_dep_zz"):
        resolve_target("broken_models_b:f")


def test_the_current_directory_is_searched(tmp_path, monkeypatch):
    """A module next to params.yaml imports even when the console script left the current
    directory off ``sys.path``."""
    (tmp_path / "cwd_models_c.py").write_text("def make():\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert resolve_target("cwd_models_c:make").__name__ == "make"
    assert sys.path[-1] == str(tmp_path)


def test_bad_import_target_in_params_names_the_key(own_models) -> None:
    data = {"experiment": {"model": {"name": "import", "target": "own_models:residul_net"}}}
    with pytest.raises(ConfigError, match=r"experiment\.model\.import\.target: .*did you mean "
                                          "'residual_net'"):
        parse_params(data)


def _params(target: str, **train) -> dict:
    return {
        "datasets": {"synthetic": {"n": 600, "n_features": 6}},
        "experiment": {
            "dataset": "synthetic",
            "model": {"name": "import", "target": target, "kwargs": {"width": 8}},
            "train": {"epochs": 2, "batch_size": 64, "lr": 0.5, "sigma": 1.0, "delta": 1e-5,
                      "progress": False, "reproducible": True, **train},
            "methods": {"dpsgd": {"C": 1.0}}, "seeds": [0],
        },
    }


def _train_from(params: dict, **overrides):
    p = parse_params(params)
    dataset = load_dataset("synthetic", p.dataset("synthetic"))
    return train(p.experiment.train_config("dpsgd", 0, **overrides), dataset), dataset


def test_import_model_with_layernorm_and_residual_trains_through_config(own_models) -> None:
    result, dataset = _train_from(_params("own_models:residual_net"))
    assert result.test_metrics["accuracy"] > 0.75  # chance is 0.5
    assert 0 < result.epsilon < float("inf")
    model = result.load_model()  # rebuilt from the import path
    initial = build_model(result.config.model, dataset.input_shape, dataset.n_classes)
    norm = next(m for m in model.modules() if isinstance(m, nn.LayerNorm))
    assert not torch.equal(norm.weight, torch.ones_like(norm.weight))  # LayerNorm was trained
    assert not torch.equal(model[1].weight, initial[1].weight)
    with torch.no_grad():
        logits = model(dataset.test.x)
    assert np.array_equal(logits.argmax(1).numpy(), result.test_predictions.y_pred)


def test_fast_and_materialised_engines_agree_on_the_import_model(own_models) -> None:
    """Same seed, replayable noise: the two per-sample gradient paths train the same model."""
    fast, _ = _train_from(_params("own_models:residual_net"), engine="fast", epochs=1)
    slow, _ = _train_from(_params("own_models:residual_net"), engine="materialized", epochs=1)
    for name, value in fast.model_state.items():
        torch.testing.assert_close(value, slow.model_state[name], rtol=1e-4, atol=1e-5)


def test_batchnorm_import_model_is_refused_before_training(own_models) -> None:
    params = _params("own_models:batchnorm_net")
    params["experiment"]["model"]["kwargs"] = {}
    with pytest.raises(PrivacyError, match=f"  2: BatchNorm1d: {BATCHNORM}"):
        _train_from(params)


def test_cli_train_refuses_a_batchnorm_model_beside_params_yaml(tmp_path, monkeypatch) -> None:
    """params.yaml edits only: the module sits in the working directory, the CLI imports it
    and prints one clear message (exit code 2) instead of functorch's in-place error."""
    (tmp_path / "cli_bn_models.py").write_text((FIXTURES / "own_models.py").read_text())
    params = _params("cli_bn_models:batchnorm_net")
    params["experiment"]["model"]["kwargs"] = {}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    out = CliRunner().invoke(app, ["train", "--method", "dpsgd"])
    assert out.exit_code == 2, out.output
    text = " ".join(out.output.split())
    assert f"2: BatchNorm1d: {' '.join(BATCHNORM.split())}" in text
    assert "in-place" not in text and "Traceback" not in text


def test_a_model_calling_sys_exit_is_an_error_not_a_silent_exit(tmp_path, monkeypatch):
    """`sys.exit(0)` in a factory or a forward pass made `train` exit 0 with no output."""
    (tmp_path / "exiting_models.py").write_text(
        "import sys\nfrom torch import nn\n"
        "def leaves():\n    sys.exit(0)\n"
        "class Quits(nn.Linear):\n    def forward(self, x):\n        sys.exit(3)\n"
        "def quits(input_shape, n_classes):\n    return Quits(input_shape[0], n_classes)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"model exiting_models:leaves called sys.exit\(0\): "
                                          "your code may not end the process"):
        build_model(_import("exiting_models:leaves"), (6,), 3)
    with pytest.raises(ConfigError, match=r"the forward pass called sys.exit\(3\)"):
        build_model(_import("exiting_models:quits"), (6,), 3)
