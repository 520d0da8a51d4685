"""The `dpfair data` commands, and the CLI's clean errors (no parameters file, tuning budget)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dpfair.cli.commands import app
from dpfair.data import load_dataset, summarize

runner = CliRunner()


def prepare_synthetic(tmp_path, option: str):
    """``dpfair data prepare synthetic`` into ``tmp_path`` with ``option`` in its params.yaml."""
    params = tmp_path / "params.yaml"
    params.write_text(f"datasets:\n  synthetic:\n    {option}\n")
    return runner.invoke(
        app, ["data", "prepare", "synthetic", "--params", str(params), "--out", str(tmp_path)]
    )


def test_data_list():
    result = runner.invoke(app, ["data", "list"])
    assert result.exit_code == 0, result.output
    for name in ("adult", "dutch", "mnist", "fashion_mnist", "celeba", "digits", "synthetic"):
        assert name in result.output


def test_data_prepare_prints_summary(tmp_path):
    result = prepare_synthetic(tmp_path, "n: 400")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "synthetic" / "summary.json").read_text())
    assert summary["rows"]["total"] == 400
    assert "train" in result.output and f"{summary['rows']['train']:,}" in result.output
    assert "minority" in result.output  # group names are public
    assert "per_group" not in summary and "per_class" not in summary
    exact = summarize(load_dataset("synthetic", {"n": 400}), exact_counts=True)
    for split in ("train", "val", "test"):  # no exact count is printed
        for name, n in (*exact["per_group"][split].items(), *exact["per_class"][split].items()):
            assert f"{name}: {n:,}" not in result.output


def test_bad_params_exit_2_without_traceback(tmp_path):
    result = prepare_synthetic(tmp_path, "n_features: many")
    assert result.exit_code == 2
    assert "datasets.synthetic.n_features" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "synthetic").exists()


def test_unknown_dataset_and_missing_params(tmp_path):
    result = runner.invoke(app, ["data", "prepare", "dutc", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "did you mean 'dutch'" in result.output
    result = runner.invoke(
        app, ["data", "prepare", "digits", "--params", str(tmp_path / "nope.yaml")]
    )
    assert result.exit_code == 2 and "parameters file not found" in result.output


def test_data_error_exit_2(tmp_path, monkeypatch):
    monkeypatch.setenv("DPFAIR_DATA_MIRROR", str(tmp_path))
    monkeypatch.setenv("DPFAIR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DPFAIR_OFFLINE", "1")
    result = runner.invoke(app, ["data", "prepare", "adult", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "cannot find adult.data" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out" / "adult").exists()


def test_run_without_params_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no params.yaml here
    result = runner.invoke(app, ["run"])
    assert result.exit_code == 2
    assert "parameters file not found" in result.output


def test_tune_over_budget_is_a_clean_error_before_any_run(tmp_path, monkeypatch):
    """A budget refusal (BudgetExceededError) is one message, exit code 3, nothing trained."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(
        "experiment:\n  dataset: synthetic\n"
        "tuning:\n  budget_epsilon: 0.01\n  spaces:\n    dpsgd: {lr: [0.1, 0.2]}\n"
    )
    result = runner.invoke(app, ["tune", "--method", "dpsgd"])
    assert result.exit_code == 3, result.output
    assert "budget refused:" in result.output and "over the budget 0.01" in result.output
    assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_data_prepare_exact_counts_is_an_explicit_opt_in_marked_not_private(tmp_path):
    out = runner.invoke(
        app, ["data", "prepare", "digits", "--exact-counts", "--out", str(tmp_path)]
    )
    assert out.exit_code == 0, out.output
    assert "not private" in out.output
    summary = json.loads((tmp_path / "digits" / "summary.json").read_text())
    assert summary["privacy"].startswith("exact counts: not private")
    assert sum(summary["per_group"]["train"].values()) == summary["rows"]["train"]


def test_data_prepare_unwritable_out_names_the_path(tmp_path):
    (tmp_path / "afile").write_text("")
    for out, problem in ((tmp_path / "afile" / "sub", "Not a directory"),
                         (tmp_path / "afile", "File exists")):
        result = runner.invoke(app, ["data", "prepare", "synthetic", "--out", str(out)])
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())
        assert f"file error: cannot use {out}: {problem}" in text
        assert "fix: check that the path exists (or can be created)" in text
        assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_data_prepare_refuses_infinite_option(tmp_path):
    result = prepare_synthetic(tmp_path, "class_sep: .inf")
    assert result.exit_code == 2, result.output
    assert "datasets.synthetic.class_sep: Input should be a finite number (got inf)" in " ".join(
        result.output.split())
    assert not (tmp_path / "synthetic").exists()
