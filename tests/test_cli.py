"""`dpfair train` and `dpfair tune` print only what the reported ε covers, and say so."""

from __future__ import annotations

import json
import re

import yaml
from typer.testing import CliRunner

from dpfair.cli import app
from dpfair.release import HEURISTIC, PRIVATE_LEDGER_STATUS, TEST_METRICS_NOTE
from dpfair.training import REPLAYABLE_NOISE

runner = CliRunner()


def _params(tmp_path, release: str = "selected", **train: object) -> None:
    params = {
        "datasets": {"synthetic": {"n": 400}},
        "experiment": {
            "dataset": "synthetic", "model": {"name": "logistic_regression"},
            "train": {"epochs": 1, "batch_size": 50, "lr": 0.5, "sigma": 1.0, "delta": 1e-5,
                      **train},
            "methods": {"dpsgd": {"C": 1.0}, "fairlens": {"C": 1.0}}, "seeds": [0],
        },
        "tuning": {"release": release, "mode": "fixed", "n_runs": 3,
                   "spaces": {"dpsgd": {"lr": [0.1, 0.5]}}},
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))


def _printed(output: str) -> str:
    """What the command printed (not the accountant's log warnings), on one line: rich wraps
    long lines."""
    return " ".join(" ".join(line for line in output.splitlines()
                             if not line.startswith("WARNING:")).split())


def test_tune_prints_the_selection_and_epsilons_but_neither_k_nor_scores(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path)
    out = runner.invoke(app, ["tune", "--method", "dpsgd"])
    assert out.exit_code == 0, out.output
    text = _printed(out.output)
    assert "selected (macro_accuracy, fixed search): {'lr':" in text
    assert re.search(r"epsilon: one training run [\d.]+, whole search [\d.]+", text)
    [ledger] = tmp_path.glob("*.ledger.PRIVATE.json")
    squeezed = "".join(text.split())  # rich breaks a long path anywhere
    assert "".join(f"private ledger (K, every trial and score: not for release): {ledger}"
                   .split()) in squeezed
    private = json.loads(ledger.read_text())
    assert private["status"] == PRIVATE_LEDGER_STATUS and private["K"] == 3
    assert "K =" not in text and "best macro_accuracy" not in text
    for trial in private["trials"]:
        assert str(trial["score"]) not in text


def test_tune_all_trials_prints_k_and_the_composition(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path, release="all_trials")
    out = runner.invoke(app, ["tune", "--method", "dpsgd"])
    assert out.exit_code == 0, out.output
    text = _printed(out.output)
    assert "all 3 trials released: composition of the 3 runs" in text
    assert "K = 3 runs, best macro_accuracy =" in text
    assert not list(tmp_path.glob("*.PRIVATE.json"))
    assert list(tmp_path.glob("*.ledger.json"))


def test_train_heuristic_method_shows_no_epsilon(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path, progress=False)
    out = runner.invoke(app, ["train", "--method", "fairlens"])
    assert out.exit_code == 0, out.output
    text = _printed(out.output)
    assert f"epsilon: {HEURISTIC}" in text
    assert not re.search(r"epsilon \d", text)
    assert TEST_METRICS_NOTE in text
    assert REPLAYABLE_NOISE not in text


def test_train_reproducible_says_the_noise_is_replayable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path, progress=False, reproducible=True)
    out = runner.invoke(app, ["train", "--method", "dpsgd"])
    assert out.exit_code == 0, out.output
    text = _printed(out.output)
    assert re.search(r"epsilon \d+\.\d+ at delta 1e-05", text)
    assert f"reproducible: {REPLAYABLE_NOISE}" in text
