"""Reliability round 3: every input that used to end in a traceback (some after ε was charged)
or be accepted silently is one clear refusal (exit 2, the problem and the fix), before any
work and before the privacy gate records anything. The five classes of input behind them each
have one validator: bounded training numbers (lr, σ, target ε; no booleans as numbers), a
model's parameters and float logits, supported URL schemes, one role per column, and outputs
that are not an input."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dpfair.cli.commands import app
from dpfair.ledger import SourceLedger
from tests.cli.conftest import CENSUS_TUNE_PARAMS, census_folder
from tests.conftest import cli_in_a_fresh_python


def _train(**values: Any):
    return lambda p: p["experiment"]["train"].update(values)


def _columns(**values: Any):
    return lambda p: p["datasets"]["census"].update(values)


def _target_epsilon(p: dict) -> None:
    p["experiment"]["train"].pop("sigma")
    p["experiment"]["train"]["target_epsilon"] = 1e9


TRAIN = ["train", "--method", "dpsgd"]
TUNE = ["tune", "--method", "dpsgd", "--study", "s"]
#: name: (edit of CENSUS_TUNE_PARAMS, command, what the message says)
CASES: dict[str, tuple[Any, list[str], str]] = {
    # numbers that overflow or underflow the training
    "lr_1e300": (_train(lr=1e300), TRAIN, "lr: 1e+300 is over the maximum 10000"),
    "lr_true": (_train(lr=True), TRAIN, "lr: True is a boolean where a number is expected"),
    "sigma_1e-300": (_train(sigma=1e-300), TRAIN, "below 1e-06 its square underflows"),
    "target_epsilon_1e9": (_target_epsilon, TRAIN, "1e+09 is over the maximum 1000"),
    "budget_delta_half": (lambda p: p.update(budget={"delta": 0.5}), TRAIN,
                          "budget.delta: 0.5 is not below 1/n_train"),
    "space_empty": (lambda p: p["tuning"]["spaces"].update(dpsgd={}), TUNE,
                    "spaces.dpsgd is empty"),
    "space_boolean": (lambda p: p["tuning"]["spaces"].update(dpsgd={"C": [True, 0.5]}), TUNE,
                      "tuning.spaces.dpsgd.C: the value True is a boolean"),
    "tuning_p_boolean": (lambda p: p["tuning"].update(mode="binomial", p=True), TUNE,
                         "p: a boolean (true/false) where a number is expected"),
    # a model's outputs and parameters
    "integer_logits": (lambda p: p["experiment"].update(
        model={"name": "import", "target": "own_models:integer_logits"}), TRAIN,
        "not floating-point logits"),
    "no_parameters": (lambda p: p["experiment"].update(
        model={"name": "import", "target": "own_models:no_parameters"}), TRAIN,
        "has no trainable parameters"),
    # URL schemes
    "storage_in_memory": (None, [*TUNE, "--storage", "sqlite:///:memory:"],
                          "is a database in memory"),
    "storage_mysql": (None, [*TUNE, "--storage", "mysql://bob:hunter2@127.0.0.1/db"],
                      "the scheme 'mysql' is not supported; give one of: sqlite:///FILE"),
    "tracking_ftp": (lambda p: p["tracking"].update(uri="ftp://host/x"), TRAIN,
                     "the scheme 'ftp' is not supported"),
    # one role per column
    "id_is_target": (_columns(id_columns=["Income"]), TRAIN,
                     "'Income' is both target and id_columns"),
    "id_is_protected": (_columns(id_columns=["Nationality"]), TRAIN,
                        "'Nationality' is both protected and id_columns"),
    "protected_is_target": (_columns(protected="Income"), TRAIN,
                            "'Income' is both target and protected"),
    "person_id_is_target": (_columns(id_column="Income"), TRAIN,
                            "'Income' is both target and id_columns or id_column"),
}
if importlib.util.find_spec("boto3") is None:
    CASES["s3_without_boto3"] = (lambda p: p["tracking"].update(artifact_root="s3://b/x"),
                                 TRAIN, "needs the Python module 'boto3'")


def _nothing_charged(folder: Path) -> None:
    assert SourceLedger(".dpfair/ledger.sqlite", folder).releases() == []


def test_each_case_is_one_clear_refusal_before_anything_is_charged(tmp_path: Path) -> None:
    folder = census_folder(tmp_path)
    commands = {}
    for name, (edit, command, _) in CASES.items():
        params = copy.deepcopy(CENSUS_TUNE_PARAMS)
        if edit is not None:
            edit(params)
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(params))
        commands[name] = [*command, "--params", f"{name}.yaml"]
    found, _ = cli_in_a_fresh_python(folder, commands, ())
    for name, (_, _, message) in CASES.items():
        code, output = found[name]
        text = " ".join(output.split())
        assert code == 2, (name, output)
        assert text.count(message) == 1, (name, output)
        assert "Traceback" not in output and "bug in dpfair" not in output, (name, output)
        assert "hunter2" not in output
    _nothing_charged(folder)
    assert not (folder / "art").exists()  # no model was logged


def test_predict_and_evaluate_never_overwrite_their_input(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(census_folder(tmp_path))
    before = Path("census.csv").read_bytes()
    for args in (["predict", "--model", "m", "--input", "census.csv", "--output",
                  "./census.csv"],
                 ["evaluate", "census.csv", "--out", "census.csv"]):
        out = CliRunner().invoke(app, args)
        assert out.exit_code == 2 and "it would be overwritten" in out.output, out.output
    assert Path("census.csv").read_bytes() == before
    Path("link.csv").symlink_to("census.csv")
    out = CliRunner().invoke(app, ["predict", "--model", "m", "--input", "census.csv",
                                   "--output", "link.csv"])
    assert out.exit_code == 2 and "--input file census.csv" in out.output, out.output


@pytest.mark.parametrize("content", [b"\x00\x01binary\xff\"open quote\na,b\nc",
                                     b"a,b\n1,2,3,4\n\"x"])
def test_evaluate_refuses_a_file_that_is_not_a_table(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "junk.csv").write_bytes(content)
    out = CliRunner().invoke(app, ["evaluate", str(tmp_path / "junk.csv"), "--out",
                                   str(tmp_path / "ev")])
    assert out.exit_code == 2 and "cannot read" in out.output, out.output
    assert "Traceback" not in out.output and not (tmp_path / "ev").exists()


def test_train_without_experiment_model_trains_the_default_model(tmp_path: Path,
                                                                   monkeypatch) -> None:
    """Regression: with no experiment.model (an empty params.yaml) the default model was a
    plain mapping, and the free-space check crashed on it ("not a model config")."""
    monkeypatch.chdir(tmp_path)
    params = {"datasets": {"synthetic": {"n": 400}},
              "experiment": {"dataset": "synthetic", "methods": {"dpsgd": {"C": 1.0}},
                             "train": {"epochs": 1, "batch_size": 50, "lr": 0.5, "sigma": 1.0,
                                       "delta": 1e-5, "progress": False}},
              "tracking": {"uri": f"sqlite:///{tmp_path / 'm.db'}", "artifact_root": "art"}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    out = CliRunner().invoke(app, ["train", "--method", "dpsgd"])
    assert out.exit_code == 0, out.output
    assert "epsilon" in out.output


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_database_is_exit_4_before_anything_is_charged(tmp_path: Path,
                                                                      monkeypatch) -> None:
    """`train` with a postgresql:// tracking store and `tune` with a postgresql:// storage that
    do not answer: exit 4 with the address (password masked), nothing recorded."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    folder = census_folder(tmp_path)
    url = f"postgresql://bob:hunter2@127.0.0.1:{_closed_port()}/db"
    params = copy.deepcopy(CENSUS_TUNE_PARAMS)
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    params["tracking"]["uri"] = url
    (folder / "pg.yaml").write_text(yaml.safe_dump(params))
    found, _ = cli_in_a_fresh_python(folder, {
        "train": [*TRAIN, "--params", "pg.yaml"],
        "tune": [*TUNE, "--storage", url, "--params", "params.yaml"]}, ())
    for name, what in (("train", "tracking server"), ("tune", "Optuna storage")):
        code, output = found[name]
        assert code == 4, (name, output)
        assert f"{what} postgresql://bob:***@127.0.0.1" in output, (name, output)
        assert "hunter2" not in output and "Traceback" not in output, (name, output)
    _nothing_charged(folder)


def test_no_training_starts_once_the_process_was_told_to_stop(tmp_path: Path,
                                                              monkeypatch) -> None:
    """A training queued (a Prefect task in a thread) before a SIGTERM: when it would start,
    the stop flag (set by the signal) ends it before any MLflow run opens or anything trains."""
    import threading

    from dpfair import processes
    from dpfair.data import load_dataset
    from dpfair.errors import Terminated
    from dpfair.pipeline.method_steps import train_logged
    from dpfair.release.plan import method_release
    from dpfair.settings import TrackingConfig
    from dpfair.training import TrainConfig, make_plan

    stopped = threading.Event()
    stopped.set()  # what the SIGTERM handler of sigterm_raises does
    monkeypatch.setattr(processes, "_STOP", stopped)
    dataset = load_dataset("synthetic", {"n": 200})
    config = TrainConfig(method={"name": "dpsgd", "C": 1.0}, model={"name": "logistic_regression"},
                         epochs=1, batch_size=20, lr=0.5, sigma=1.0, delta=1e-5, progress=False)
    plan = make_plan(config, len(dataset.train), dataset.n_groups)
    release = method_release("dpsgd", "proven", [0], [plan.event], None, False, 1e-5, [plan.test])
    tracking = TrackingConfig(uri=f"sqlite:///{tmp_path / 'm.db'}", artifact_root=str(tmp_path))
    with pytest.raises(Terminated):
        train_logged(config, "dpsgd", dataset, tracking, "0", None, {}, release)
    assert not (tmp_path / "m.db").exists()
