"""Every door of the privacy gate (dpfair/ledger/gate.py): `dpfair train`, `dpfair tune`,
`dpfair audit` and `dpfair.api.fit` obey `budget.*` exactly as `dpfair run` does, refusals
come before anything trains or is recorded, and what they release is charged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from mlflow import MlflowClient
from typer.testing import CliRunner

from dpfair.cli.commands import app
from dpfair.errors import PrivacyError
from dpfair.ledger import SourceLedger
from dpfair.workspace import open_racing

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
runner = CliRunner()


def _params(tmp_path: Path, budget: dict, model: dict | None = None, **train: object) -> None:
    params = {
        "datasets": {"synthetic": {"n": 400}},
        "experiment": {
            "dataset": "synthetic", "model": model or {"name": "logistic_regression"},
            "train": {"epochs": 1, "batch_size": 50, "lr": 0.5, "sigma": 1.0, "delta": 1e-5,
                      "progress": False, **train},
            "methods": {"dpsgd": {"C": 1.0}}, "seeds": [0],
        },
        "tuning": {"mode": "fixed", "n_runs": 3, "spaces": {"dpsgd": {"lr": [0.1, 0.5]}}},
        "budget": budget,
        "tracking": {"uri": f"sqlite:///{tmp_path / 'm.db'}",
                     "artifact_root": str(tmp_path / "art")},
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))


def _nothing_happened(tmp_path: Path) -> None:
    """No release recorded, no MLflow run opened."""
    assert SourceLedger(".dpfair/ledger.sqlite", tmp_path).releases() == []
    if (tmp_path / "m.db").exists():
        client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
        assert not [r for e in client.search_experiments()
                    for r in client.search_runs([e.experiment_id])]


@pytest.mark.parametrize("command", [["train", "--method", "dpsgd"],
                                     ["tune", "--method", "dpsgd", "--study", "s"]])
def test_train_and_tune_over_the_budget_are_refused_before_anything_runs(tmp_path, monkeypatch,
                                                                         command):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path, {"epsilon": 0.5})
    out = runner.invoke(app, command)
    assert out.exit_code != 0
    text = " ".join(out.output.split())
    assert "exceeds budget.epsilon 0.5" in text and "nothing was trained" in text
    _nothing_happened(tmp_path)


def test_a_nonprivate_training_needs_the_budgets_allowance(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path, {})
    out = runner.invoke(app, ["train", "--method", "nonprivate"])
    assert out.exit_code != 0 and "budget.allow_nonprivate_reference" in out.output
    _nothing_happened(tmp_path)


def test_a_model_the_check_refuses_is_refused_before_the_reservation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(FIXTURES))
    _params(tmp_path, {}, model={"name": "import", "target": "own_models:batchnorm_net"})
    for command in (["train", "--method", "dpsgd"], ["tune", "--method", "dpsgd"],
                    ["audit", "--method", "dpsgd", "--no-track"]):
        out = runner.invoke(app, command)
        assert out.exit_code != 0 and "BatchNorm" in out.output, out.output
    _nothing_happened(tmp_path)


def test_the_audit_is_charged_and_its_sigma_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path, {"epsilon": 5.0}, reproducible=True)
    out = runner.invoke(app, ["audit", "--method", "dpsgd", "--sigma", "0.3", "--no-track",
                              "--canaries", "20"])
    assert out.exit_code != 0 and "exceeds budget.epsilon 5" in " ".join(out.output.split())
    _nothing_happened(tmp_path)
    out = runner.invoke(app, ["audit", "--method", "dpsgd", "--sigma", "2", "--no-track",
                              "--canaries", "20"])
    assert out.exit_code == 0, out.output
    [charged] = SourceLedger(".dpfair/ledger.sqlite", tmp_path).releases("synthetic")
    assert charged.context["command"] == "dpfair audit" and charged.status == "released"
    assert 0 < charged.epsilon <= 5.0


def test_fit_goes_through_the_gate(tmp_path):
    from dpfair.api import fit

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(300, 4)).astype(np.float32), rng.integers(0, 2, 300)
    net = torch.nn.Linear(4, 2)
    where = str(tmp_path / "ledger.sqlite")
    with pytest.raises(PrivacyError, match="budget.allow_nonprivate_reference"):
        fit(net, (x, y), method="nonprivate", epochs=1, batch_size=50, budget={"ledger": where})
    with pytest.raises(PrivacyError, match="exceeds budget.epsilon"):
        fit(net, (x, y), sigma=0.2, epochs=1, batch_size=50,
            budget={"ledger": where, "epsilon": 1.0})
    assert SourceLedger(where).releases() == []
    result = fit(net, (x, y), sigma=1.0, epochs=1, batch_size=50, budget={"ledger": where})
    # the same arrays under another source name: the same people, their spend composes
    again = fit(net, (x, y), sigma=1.0, epochs=1, batch_size=50, budget={"ledger": where},
                source="copy")
    first, second = SourceLedger(where).releases()
    assert first.epsilon == pytest.approx(result.epsilon) and second.source == "copy"
    assert first.accounts == second.accounts and again.epsilon == pytest.approx(result.epsilon)


def test_sigterm_ends_train_with_its_run_failed_and_its_release_settled(tmp_path):
    """`dpfair train` handles SIGTERM like `dpfair run`: the MLflow run ends FAILED (not
    RUNNING forever) and its ledger release is settled (`failed`: it may have released
    per-epoch metrics), not left pending."""
    import signal
    import subprocess
    import sys
    import time

    _params(tmp_path, {}, epochs=5000)
    proc = subprocess.Popen([sys.executable, "-m", "dpfair.cli", "train", "--method", "dpsgd"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    deadline = time.monotonic() + 180
    running = []
    while not running and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(1.0)
        if (tmp_path / "m.db").exists():  # under dpfair's lock: the schema may be in the making
            running = open_racing(lambda: [r for e in client.search_experiments()
                                           for r in client.search_runs([e.experiment_id])],
                                  f"sqlite:///{tmp_path / 'm.db'}")
    assert running, proc.communicate()[0]
    time.sleep(2.0)  # inside the training loop
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, output
    [run] = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert run.info.status == "FAILED", output
    [release] = SourceLedger(".dpfair/ledger.sqlite", tmp_path).releases()
    assert release.status == "failed"


def test_searches_are_recorded_by_the_studys_identity_not_its_name(tmp_path, monkeypatch):
    """`dpfair tune --study s` resumed is one search; the same name after its storage was
    deleted is another search, and is charged again."""
    monkeypatch.chdir(tmp_path)
    _params(tmp_path, {})
    for _ in range(2):  # the second call resumes the same study: nothing new is charged
        out = runner.invoke(app, ["tune", "--method", "dpsgd", "--study", "s"])
        assert out.exit_code == 0, out.output
    ledger = SourceLedger(".dpfair/ledger.sqlite", tmp_path)
    assert len(ledger.releases()) == 1
    (tmp_path / "optuna.db").unlink()  # a new study under the same name
    out = runner.invoke(app, ["tune", "--method", "dpsgd", "--study", "s"])
    assert out.exit_code == 0, out.output
    first, second = ledger.releases()
    assert first.context["study"] != second.context["study"]
    assert "::s::" in first.context["study"] and "::s::" in second.context["study"]
