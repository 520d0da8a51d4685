"""`dpfair run --copy-results` deletes nothing dpfair did not write (issue 33.1)."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from dpfair.cli.commands import app
from dpfair.errors import ConfigError
from dpfair.owned_dir import MARKER, check_replaceable, replace_with_copy


def _results(tmp_path, text: str):
    src = tmp_path / f"results-{text}"
    (src / "figures").mkdir(parents=True)
    (src / "results.csv").write_text(text)
    (src / "figures" / "a.png").write_text(text)
    return src


def test_a_new_folder_is_written_and_replaced_only_while_dpfair_owns_it(tmp_path):
    target = tmp_path / "out" / "pipeline"
    replace_with_copy(_results(tmp_path, "one"), target)
    assert (target / "results.csv").read_text() == "one"
    assert (target / MARKER).is_file()
    replace_with_copy(_results(tmp_path, "two"), target)  # dpfair's own: replaced
    assert (target / "results.csv").read_text() == "two"
    assert (target / "figures" / "a.png").read_text() == "two"
    (target / "notes.txt").write_text("mine")  # the user's file: never deleted
    with pytest.raises(ConfigError, match=r"notes\.txt.*new or empty folder"):
        replace_with_copy(_results(tmp_path, "three"), target)
    assert (target / "notes.txt").read_text() == "mine"
    assert (target / "results.csv").read_text() == "two"


def test_an_empty_folder_is_used_and_a_file_is_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    replace_with_copy(_results(tmp_path, "one"), empty)
    assert (empty / "results.csv").read_text() == "one"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        check_replaceable(tmp_path / "file")


def _project(tmp_path):
    """A project folder as `dpfair run` leaves it: ledger, stores, params, a user's file."""
    (tmp_path / ".dpfair").mkdir()
    (tmp_path / ".dpfair" / "privacy_ledger.json").write_text("{}")
    for name in ("mlflow.db", "optuna.db", "unrelated.txt"):
        (tmp_path / name).write_text(name)
    (tmp_path / "mlartifacts").mkdir()
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "datasets": {"synthetic": {"n": 400}},
        "experiment": {"dataset": "synthetic", "model": {"name": "logistic_regression"},
                       "methods": {"dpsgd": {"C": 1.0}}, "seeds": [0]}}))
    return sorted(p.name for p in tmp_path.iterdir())


@pytest.mark.parametrize("where", [".", "ROOT"])
def test_run_refuses_to_copy_results_over_the_project_before_running(tmp_path, monkeypatch,
                                                                     where):
    """`--copy-results .` (and the project root by its path) is refused before the flow
    starts, and every file of the project is still there."""
    import flows.experiment

    before = _project(tmp_path)
    monkeypatch.chdir(tmp_path)
    ran = []
    monkeypatch.setattr(flows.experiment, "run_experiment",
                        lambda *a, **k: ran.append(1) or {"results_dir": str(tmp_path)})
    monkeypatch.setattr("dpfair.pipeline.preflight.check_tracking", lambda tracking: None)
    target = str(tmp_path) if where == "ROOT" else where
    out = CliRunner().invoke(app, ["run", "--copy-results", target])
    assert out.exit_code == 2, out.output
    assert "dpfair did not write" in out.output and "nothing ran" in out.output
    assert ran == []
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / ".dpfair" / "privacy_ledger.json").read_text() == "{}"
