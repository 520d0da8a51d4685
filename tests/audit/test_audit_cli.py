"""``dpfair audit``: params.yaml's ``audit:`` section, the CLI's overrides, the MLflow run."""

from __future__ import annotations

import torch
import yaml
from mlflow import MlflowClient
from PIL import Image
from typer.testing import CliRunner

from dpfair.audit import VIOLATION
from dpfair.cli.commands import app
from dpfair.cli.error_boundary import EXIT_VIOLATION
from dpfair.config.params import parse_params
from dpfair.ledger import SourceLedger
from dpfair.methods import Dpsgd, DpsgdConfig

runner = CliRunner()


def _params(tmp_path, train: dict | None = None, **audit: object) -> None:
    params = {
        "datasets": {"synthetic": {"n": 600, "minority_fraction": 0.3}},
        "experiment": {
            "dataset": "synthetic", "model": {"name": "mlp", "hidden": [8]},
            "train": {"epochs": 1, "batch_size": 50, "lr": 0.5, "sigma": 1.0, "delta": 1e-5,
                      **(train or {})},
            "methods": {"dpsgd": {"C": 1.0}, "fairlens": {"C": 1.0}}, "seeds": [0],
        },
        "tracking": {"uri": f"sqlite:///{tmp_path / 'm.db'}",
                     "artifact_root": str(tmp_path / "art")},
        "audit": {"canaries": 30, "kind": "ood", **audit},
        "budget": {"allow_heuristic": True},  # the fairlens audit: released without an ε
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))


def _printed(output: str) -> str:
    return " ".join(" ".join(line for line in output.splitlines()
                             if not line.startswith("WARNING:")).split())


def test_audit_logs_a_tagged_run_with_bounds_plot_and_no_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path, train={"reproducible": True})  # a fixed seed: the bound's 5 % can't flake
    out = runner.invoke(app, ["audit", "--method", "dpsgd", "--canaries", "40", "--sigma", "2"])
    assert out.exit_code == 0, out.output
    text = _printed(out.output)
    assert "majority" in text and "minority" in text and "proven" in text
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("dpfair-synthetic")
                                   .experiment_id])
    tags, metrics = found.data.tags, found.data.metrics
    assert tags["dpfair.stage"] == "audit" and tags["dpfair.release"] == "audit"
    assert "charged" in tags["mlflow.note.content"]  # what the audit release means
    assert metrics["audit/canaries/minority"] == 40 and metrics["audit/confidence"] == 0.95
    assert metrics["audit/epsilon_lower_bound/minority"] < metrics[
        "audit/epsilon_claimed/minority"]
    assert found.data.params["train.sigma"] == "2.0"
    for group in ("majority", "minority"):  # the printed verdict, word for word
        assert tags[f"audit/verdict/{group}"].startswith(("consistent", "cannot decide"))
        assert f"{group}: {tags[f'audit/verdict/{group}']}" in text
        assert 0 <= metrics[f"audit/joint_power/{group}"] <= metrics[f"audit/power/{group}"]
    assert f"jointly over the 2 groups (Bonferroni, β/2 each), confidence 95%: " \
           f"{tags['audit/verdict']}" in text
    files = {f.path for f in client.list_artifacts(found.info.run_id, "audit")}
    assert files == {"audit/audit.json", "audit/scores.png"}
    assert {f.path for f in client.list_artifacts(found.info.run_id)} == {"audit"}  # no model
    png = client.download_artifacts(found.info.run_id, "audit/scores.png", str(tmp_path))
    assert Image.open(png).width <= 1600
    # the audit is charged the event of its training run (bounds and scores come from it)
    [recorded] = SourceLedger(tmp_path / ".dpfair" / "ledger.sqlite").releases("synthetic")
    assert recorded.context["command"] == "dpfair audit" and recorded.status == "released"
    assert recorded.epsilon > 0 and not recorded.without_guarantee


class NoClipping(Dpsgd):
    """The deliberate bug: claims sensitivity C but never clips (weights 1)."""

    def _weights(self, norms, groups):
        return torch.ones_like(norms), self.C


def test_a_leaking_method_is_a_violation_with_its_own_exit_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(DpsgdConfig, "build", lambda self, ctx: NoClipping(self.C))
    _params(tmp_path, train={"reproducible": True, "sigma": None, "target_epsilon": 1.0,
                             "epochs": 3}, canaries=None, kind="gradient")
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["experiment"]["model"]["hidden"] = [64]  # parameters for the planned canaries
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    out = runner.invoke(app, ["audit"])
    assert out.exit_code == EXIT_VIOLATION == 5, out.output
    text = _printed(out.output)
    assert f"majority: {VIOLATION}" in text and f"minority: {VIOLATION}" in text
    assert f"confidence 95%: {VIOLATION}" in text  # jointly
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("dpfair-synthetic")
                                   .experiment_id])
    assert found.data.tags["audit/verdict"] == VIOLATION
    assert found.data.tags["audit/verdict/minority"] == VIOLATION


def test_fairlens_audit_shows_no_epsilon(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path, method="fairlens", groups=["minority"], track=False)
    out = runner.invoke(app, ["audit"])
    assert out.exit_code == 0, out.output
    text = _printed(out.output)
    assert "heuristic — no DP guarantee" in text and "—" in text
    assert not (tmp_path / "m.db").exists()


def test_bad_audit_values_are_one_message(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path, canaris=3)
    out = runner.invoke(app, ["audit"])
    assert out.exit_code == 2 and "did you mean 'canaries'" in _printed(out.output)
    _params(tmp_path, method="dpsgf")
    out = runner.invoke(app, ["audit"])
    assert out.exit_code == 2 and "did you mean 'dpsgd'" in _printed(out.output)
    _params(tmp_path)
    out = runner.invoke(app, ["audit", "--beta", "2", "--no-track"])
    assert out.exit_code == 2 and "audit.beta" in _printed(out.output)


def test_params_yaml_has_a_valid_audit_section(repo_root):
    params = parse_params(yaml.safe_load((repo_root / "params.yaml").read_text()))
    assert params.audit.method in params.experiment.methods
