"""`dpfair train --nproc N`: the option overrides experiment.train.nproc and is checked like it,
before anything is charged."""

from __future__ import annotations

import os

import pytest
import yaml
from typer.testing import CliRunner

from dpfair.cli import app
from dpfair.ledger import SourceLedger

runner = CliRunner()


def _params(folder) -> None:
    params = {
        "budget": {"allow_heuristic": True},
        "datasets": {"synthetic": {"n": 400}},
        "experiment": {
            "dataset": "synthetic", "model": {"name": "logistic_regression"},
            "train": {"epochs": 1, "batch_size": 50, "lr": 0.5, "sigma": 1.0, "delta": 1e-5,
                      "progress": False, "device": "cpu"},
            "methods": {"dpsgd": {"C": 1.0}, "fairlens": {"C": 1.0}}, "seeds": [0],
        },
        "tracking": {"uri": f"sqlite:///{folder / 'mlflow.db'}",
                     "artifact_root": str(folder / "art")},
    }
    (folder / "params.yaml").write_text(yaml.safe_dump(params))


def test_more_processes_than_cores_is_one_clear_refusal(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _params(tmp_path)
    cores = os.cpu_count() or 1
    out = runner.invoke(app, ["train", "--method", "dpsgd", "--nproc", str(cores + 1)])
    assert out.exit_code == 2, out.output
    text = " ".join(out.output.split())
    assert f"--nproc {cores + 1}" in text and f"set nproc to at most {cores}" in text
    assert "Traceback" not in out.output
    assert SourceLedger(".dpfair/ledger.sqlite", tmp_path).releases() == []


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 CPU cores")
def test_a_method_with_batch_terms_is_refused_over_processes(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _params(tmp_path)
    out = runner.invoke(app, ["train", "--method", "fairlens", "--nproc", "2"])
    assert out.exit_code == 2, out.output
    assert "cannot be split over processes: set nproc to 1" in " ".join(out.output.split())
    assert SourceLedger(".dpfair/ledger.sqlite", tmp_path).releases() == []
