"""`dpfair train` and `dpfair tune` print only what the reported ε covers, and say so; every
expected failure is one clear message (exit code 2), a bug a traceback and a report request."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import mlflow
import pytest
import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from typer.testing import CliRunner

from dpfair import __version__
from dpfair.accounting.accountant import ACCOUNTANTS
from dpfair.cli.commands import app, files_status, percent, score
from dpfair.cli.error_boundary import cli_errors, describe_failure
from dpfair.data import registry
from dpfair.data.dataset import Split
from dpfair.errors import ConfigError
from dpfair.release.labels import HEURISTIC, PRIVATE_LEDGER_STATUS, TEST_METRICS_NOTE
from dpfair.training import REPLAYABLE_NOISE

runner = CliRunner()


def _params(tmp_path, release: str = "selected", budget: dict | None = None,
            **train: object) -> None:
    params = {
        "budget": budget if budget is not None else {"allow_heuristic": True},
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
    # every ε names its accountant, in the console and on the search's MLflow run
    named = "|".join(re.escape(a) for a in ACCOUNTANTS)
    found = re.search(rf"epsilon: one training run [\d.]+ \(({named})\), whole search [\d.]+ "
                      rf"\(best of 3 runs[^;]*; ({named}); delta", text)
    assert found, text
    client = mlflow.MlflowClient("sqlite:///mlflow.db")
    [tuned] = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                 "tags.`dpfair.stage` = 'tuning'")
    assert tuned.data.tags["dpfair.accountant_search"] == found[2]
    assert tuned.data.tags["dpfair.accountant_training"] == found[1]
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
    assert re.search(r"epsilon \d+\.\d+ at delta 1e-05, protecting one row \(PLD "
                     r"\(dp_accounting, pessimistic\); \d+ steps", text)
    assert f"reproducible: {REPLAYABLE_NOISE}" in text


def test_train_prints_accuracies_in_percent_and_key_lines_unwrapped(tmp_path, monkeypatch):
    """Percent with one decimal (as the results tables), losses to 4 significant digits, and
    no line hard-wrapped at the console width (80 columns when not a terminal)."""
    monkeypatch.chdir(tmp_path)
    _params(tmp_path)
    out = runner.invoke(app, ["train", "--method", "dpsgd"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert TEST_METRICS_NOTE in lines and len(TEST_METRICS_NOTE) > 80  # one line, not wrapped
    [summary] = [line for line in lines if line.startswith("accuracy ")]
    assert re.fullmatch(r"accuracy \d+\.\d%  macro \d+\.\d%  worst group \d+\.\d%", summary)
    assert re.search(r"│ minority │ +\d+\.\d% │", out.output)  # the group table
    assert re.search(r"│ majority │ +\d+\.\d% │ +\d\.\d{3}\d* │", out.output)  # loss: 4 digits


def test_number_formats():
    assert percent(0.89144) == "89.1%" and percent(1.0) == "100.0%"
    assert score(0.1234567890123) == "0.1235" and score(12.3456) == "12.35"


def test_data_prepare_lines_are_not_wrapped(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("datasets:\n  synthetic:\n    n: 400\n")
    out = runner.invoke(app, ["data", "prepare", "synthetic", "--params", str(params),
                              "--out", str(tmp_path / ("a-rather-long-output-directory-" * 3))])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    [written] = [line for line in lines if line.startswith("written to ")]
    assert written.endswith("/synthetic") and len(written) > 80  # the path on one line
    assert any(line.startswith("summary.json: public facts only") and line.endswith("counts")
               for line in lines)
    assert any("synthetic  (input shape (10,), 10 features)" in line for line in lines)


def test_data_list_says_whether_files_were_found(tmp_path, monkeypatch):
    monkeypatch.setenv("DPFAIR_DATA_MIRROR", str(tmp_path / "mirror"))
    monkeypatch.setenv("DPFAIR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DPFAIR_OFFLINE", "1")
    assert files_status("adult") == "not found (DPFAIR_OFFLINE is set)"
    for name in ("adult.data", "adult.test"):
        (tmp_path / "mirror" / "adult").mkdir(parents=True, exist_ok=True)
        (tmp_path / "mirror" / "adult" / name).write_text("x")
    assert files_status("adult") == "found"
    assert files_status("celeba").startswith("not found: set datasets.celeba.root")
    out = runner.invoke(app, ["data", "list"])
    assert out.exit_code == 0, out.output
    assert re.search(r"│ digits +│ none needed", out.output)
    assert re.search(r"│ adult +│ found", out.output)
    assert re.search(r"│ mnist +│ not found", out.output)


def test_help_in_a_subprocess_loads_no_torch():
    """Benchmark note (no timed assertion; benchmarks/ holds measurements): the wall time of
    `python -m dpfair.cli --help` in a fresh interpreter is printed (pytest -s)."""
    code = ("import runpy, sys; sys.argv = ['dpfair', '--help']\n"
            "try:\n    runpy.run_module('dpfair.cli', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print('torch loaded:', 'torch' in sys.modules)")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "100"})
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    assert "torch loaded: False" in proc.stdout
    print(f"\nbenchmark note: `dpfair --help` took {elapsed:.2f} s wall in a subprocess")


# ------------------------------------------------------------------ the CLI's error boundary


def _fails_cleanly(out, *expected: str) -> str:
    """Exit code 2, one message holding every ``expected``, no traceback; the message."""
    text = " ".join(out.output.split())
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output
    for part in expected:
        assert part in text, text
    return text


@pytest.mark.parametrize("workers", ["0", "-2"])
def test_tune_workers_below_one_is_refused_before_anything_runs(tmp_path, monkeypatch, workers):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path)
    out = runner.invoke(app, ["tune", "--method", "dpsgd", "--workers", workers])
    _fails_cleanly(out, "Invalid value for '--workers'", "greater than or equal to 1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_train_negative_seed_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path)
    out = runner.invoke(app, ["train", "--method", "dpsgd", "--seed", "-1"])
    _fails_cleanly(out, "Invalid value for '--seed'", "greater than or equal to 0")


def test_tune_two_workers_on_sqlite_is_a_tuning_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path)
    out = runner.invoke(app, ["tune", "--method", "dpsgd", "--workers", "2",
                              "--storage", f"sqlite:///{tmp_path / 'x.db'}"])
    _fails_cleanly(out, "tuning error: several workers need storage 'journal:PATH'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_tune_journal_storage_without_a_path_names_the_flag(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path)
    out = runner.invoke(app, ["tune", "--method", "dpsgd", "--storage", "journal:"])
    _fails_cleanly(out, "configuration error: --storage 'journal:': tuning: storage "
                        "'journal:PATH' needs a path")


def test_tune_unknown_storage_scheme_is_a_storage_error_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path)
    out = runner.invoke(app, ["tune", "--method", "dpsgd", "--storage", "bogus://x"])
    _fails_cleanly(out, "--storage 'bogus://x'", "the storage 'bogus://x': the scheme 'bogus' "
                        "is not supported; give one of: sqlite:///FILE, journal:PATH, postgresql://")
    assert not list(tmp_path.glob("*.ledger*"))


def test_tune_storage_under_a_file_names_the_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path)
    (tmp_path / "afile").write_text("")
    out = runner.invoke(app, ["tune", "--method", "dpsgd", "--storage", "journal:afile/x.log"])
    _fails_cleanly(out, f"tuning error: storage 'journal:afile/x.log': the folder "
                        f"{tmp_path / 'afile'} is a file, not a folder")


def test_tune_sqlite_in_a_missing_folder_names_it_before_the_data_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path)
    monkeypatch.setattr("dpfair.data.load_dataset", _must_not_load)
    out = runner.invoke(app, ["tune", "--method", "dpsgd", "--storage", "sqlite:///no/x.db"])
    _fails_cleanly(out, f"tuning error: storage 'sqlite:///no/x.db': the folder {tmp_path / 'no'} "
                        "does not exist")


def _must_not_load(*args, **kwargs):
    raise AssertionError("the data was loaded before the storage was checked")


def test_every_command_goes_through_the_boundary():
    groups = [app, *(group.typer_instance for group in app.registered_groups)]
    commands = [c for group in groups for c in group.registered_commands]
    boundary = cli_errors(lambda: None).__code__
    assert len(commands) >= 7
    for command in commands:
        assert command.callback.__code__ is boundary, command.name


def _data_list_raising(monkeypatch, make_error) -> object:
    """``dpfair data list`` with the registry raising ``make_error()``."""
    monkeypatch.setattr(registry, "specs", make_error)
    return runner.invoke(app, ["data", "list"])


def test_a_bug_prints_its_traceback_and_asks_for_a_report(monkeypatch):
    def broken() -> None:
        raise ZeroDivisionError("division by zero")

    out = _data_list_raising(monkeypatch, broken)
    assert out.exit_code == 1, out.output
    assert "Traceback" in out.output and "ZeroDivisionError: division by zero" in out.output
    assert f"This is a bug in dpfair {__version__}" in out.output
    assert "please report it" in out.output


def test_value_error_is_known_only_when_dpfair_raised_it(monkeypatch):
    def ours() -> None:
        Split(torch.zeros(3, 2), torch.zeros(2, dtype=torch.long), torch.zeros(3, dtype=torch.long))

    text = _fails_cleanly(_data_list_raising(monkeypatch, ours), "error: split shapes disagree")
    assert "bug" not in text

    def theirs() -> None:
        int("x")  # a ValueError from outside dpfair's own checks: a bug

    assert _data_list_raising(monkeypatch, theirs).exit_code == 1


def test_known_message_is_printed_verbatim_not_as_markup(monkeypatch):
    def bad_key() -> None:
        raise ConfigError("tuning.spaces.dpsgd.lr: [bold]x[/bold] is not a list [0.1]")

    _fails_cleanly(_data_list_raising(monkeypatch, bad_key),
                   "configuration error: tuning.spaces.dpsgd.lr: [bold]x[/bold] is not a list "
                   "[0.1]")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int = Field(0, ge=0)


def test_describe_failure_of_foreign_errors(tmp_path):
    try:
        _Model(seed=-1)
    except ValidationError as exc:
        label, message = describe_failure(exc)
    assert label == "configuration error"
    assert message.startswith("_Model.seed: Input should be greater than or equal to 0 (got -1)")
    assert "fix: correct these values" in message
    label, message = describe_failure(PermissionError(13, "Permission denied", str(tmp_path)))
    assert (label, message.splitlines()[0]) == ("file error",
                                                f"cannot use {tmp_path}: Permission denied")
    assert describe_failure(ConnectionRefusedError("refused")) == ("system error", "refused")
    from mlflow.exceptions import MlflowException

    label, message = describe_failure(MlflowException("API request to http://127.0.0.1:9 failed"))
    assert label == "tracking error" and "fix: check tracking.uri" in message
    assert describe_failure(KeyError("x")) is None  # not raised by dpfair: a bug


def test_results_with_an_unusable_tracking_uri_is_a_tracking_error(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("tracking:\n  uri: bogus://x\n")
    out = runner.invoke(app, ["results", "--params", str(params)])
    _fails_cleanly(out, "configuration error:", "tracking.uri: the URL 'bogus://x': the "
                        "scheme 'bogus' is not supported; give one of: a folder path")


def test_results_of_an_empty_store_says_to_run_first(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(f"tracking:\n  uri: sqlite:///{tmp_path / 'mlflow.db'}\n")
    out = runner.invoke(app, ["results", "--params", str(params)])
    _fails_cleanly(out, "pipeline run", "run `dpfair run` first")


def test_data_list_loads_no_torch():
    """`dpfair data list` reads the registry only: no torch, pandas or sklearn (fast start)."""
    import subprocess
    import sys

    code = ("import sys; from typer.testing import CliRunner; from dpfair.cli.commands import app; "
            "out = CliRunner().invoke(app, ['data', 'list']); assert out.exit_code == 0, "
            "out.output; print(sorted(m for m in ('torch', 'pandas', 'sklearn') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(("flags", "resume"), [([], True), (["--no-resume"], False)])
def test_run_resumes_unless_told_not_to(tmp_path, monkeypatch, flags, resume):
    """`dpfair run` resumes a failed pipeline run by default; --no-resume starts a new one."""
    import flows.experiment

    monkeypatch.chdir(tmp_path)
    _params(tmp_path, budget={"allow_heuristic": True, "allow_nonprivate_reference": True})
    seen = []

    def fake_run(path, root, resume, checked):
        assert checked  # the command ran the validation pass itself
        seen.append(resume)
        (tmp_path / "results.csv").write_text("method,acc_a\ndpsgd,90.0 ± 1.0\n")
        return {"table": "| t |", "results_dir": str(tmp_path), "parent_run_id": "p",
                "tracking_url": "http://127.0.0.1:5000/#/experiments/1/runs/p"}

    monkeypatch.setattr(flows.experiment, "run_experiment", fake_run)
    monkeypatch.setattr("dpfair.pipeline.preflight.check_tracking", lambda tracking: None)
    out = runner.invoke(app, ["run", *flags])
    assert out.exit_code == 0, out.output
    assert seen == [resume]


def test_train_and_tune_are_recorded_in_the_privacy_ledger(tmp_path, monkeypatch):
    """`dpfair train` and `dpfair tune` spend privacy on the data source like a pipeline run:
    each is reserved in the ledger first (a resumed study once), and a lifetime budget that
    is spent refuses the next command before it logs or trains anything."""
    from mlflow import MlflowClient

    from dpfair.config.params import load_params
    from dpfair.data import load_dataset
    from dpfair.ledger import SourceLedger
    from dpfair.training import make_plan

    monkeypatch.chdir(tmp_path)
    _params(tmp_path, budget={}, progress=False)  # the default budget: no heuristic release
    out = runner.invoke(app, ["train", "--method", "fairlens"])
    assert out.exit_code != 0 and "budget.allow_heuristic" in out.output
    _params(tmp_path, progress=False)
    for command in (["train", "--method", "dpsgd"], ["train", "--method", "fairlens"],
                    ["tune", "--method", "dpsgd", "--study", "s1"],
                    ["tune", "--method", "dpsgd", "--study", "s1"]):  # resumes: same search
        out = runner.invoke(app, command)
        assert out.exit_code == 0, out.output
    params = load_params(tmp_path / "params.yaml")
    book = SourceLedger(params.budget.ledger, tmp_path)
    trained, heuristic, search = book.releases("synthetic")
    assert [r.context["command"] for r in (trained, heuristic, search)] == [
        "dpfair train", "dpfair train", "dpfair tune"]
    assert {r.status for r in (trained, heuristic, search)} == {"released"}
    dataset = load_dataset("synthetic", params.dataset("synthetic"))
    config = params.experiment.train_config("dpsgd", 0)
    assert trained.epsilon == pytest.approx(make_plan(config, len(dataset.train),
                                                      dataset.n_groups).epsilon, rel=1e-9)
    assert heuristic.epsilon == 0 and heuristic.without_guarantee[0].startswith("fairlens: ")
    assert "::s1::" in search.context["study"] and search.epsilon > trained.epsilon

    data = yaml.safe_load((tmp_path / "params.yaml").read_text())
    data["budget"] = {"lifetime_epsilon": 1.0}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(data))
    mlflow = MlflowClient(params.tracking.resolved_uri())
    before = len(mlflow.search_runs([e.experiment_id for e in mlflow.search_experiments()]))
    out = runner.invoke(app, ["train", "--method", "dpsgd"])
    assert out.exit_code == 3 and "budget.lifetime_epsilon" in _printed(out.output)
    assert len(mlflow.search_runs([e.experiment_id for e in mlflow.search_experiments()])
               ) == before
    assert len(book.releases("synthetic")) == 3


def test_version_quiet_verbose_and_the_exit_codes_in_help():
    from importlib.metadata import version

    out = runner.invoke(app, ["--version"])
    assert out.exit_code == 0 and out.output.strip() == f"dpfair {version('dpfair')}"
    out = runner.invoke(app, ["-q", "-v", "data", "list"])
    assert out.exit_code == 2 and "exclude each other" in out.output
    out = runner.invoke(app, ["--help"])
    text = _printed(out.output)
    assert out.exit_code == 0 and "3 a privacy budget refused" in text and "-q" in text


def test_train_register_makes_a_standalone_version_and_results_name_the_dataset(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path)
    out = runner.invoke(app, ["train", "--method", "dpsgd"])
    assert out.exit_code == 0 and "registered model" not in out.output, out.output
    assert "open the MLflow UI with:" in out.output
    from mlflow import MlflowClient

    mlflow = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert mlflow.search_registered_models() == []  # only pipeline runs register by default
    out = runner.invoke(app, ["train", "--method", "dpsgd", "--register"])
    assert out.exit_code == 0, out.output
    assert "dpfair-synthetic version 1 (@challenger, @champion)" in _printed(out.output)
    version = mlflow.get_model_version("dpfair-synthetic", "1")
    assert version.tags["standalone"] == "true" and 0 <= float(version.tags["accuracy"]) <= 1
    pld = "PLD (dp_accounting, pessimistic)"  # one run: its own ε is every figure
    assert json.loads(version.tags["epsilon_accountants"]) == {
        "training_run": pld, "method": pld, "pipeline_total": pld}
    assert mlflow.get_run(version.run_id).info.run_name.endswith(" · standalone")
    out = runner.invoke(app, ["results", "--dataset", "digits"])
    assert out.exit_code == 2 and "no finished pipeline run of dataset 'digits'" in _printed(
        out.output)


def test_sys_exit_in_user_code_is_an_error_and_sigterm_still_ends_the_command():
    """A command whose user code calls sys.exit(0) fails with exit code 2 and a message (it
    exited 0 silently); SIGTERM's ``Terminated`` passes through with its code."""
    import typer

    from dpfair.errors import Terminated

    demo = typer.Typer()

    @demo.command()
    @cli_errors
    def go(kind: str) -> None:
        raise Terminated(143) if kind == "term" else SystemExit(0)

    out = runner.invoke(demo, ["exit"])
    assert out.exit_code == 2
    assert "called sys.exit(0): your code may not end the process" in _printed(out.output)
    assert runner.invoke(demo, ["term"]).exit_code == 143


def test_error_messages_and_tracebacks_mask_url_passwords(capsys):
    """An adapter's error quoting a URL (SQLAlchemy, MLflow) never prints its password."""
    import typer

    demo = typer.Typer()

    @demo.command()
    @cli_errors
    def go(kind: str) -> None:
        if kind == "known":
            raise ConfigError("cannot connect to postgresql://bob:hunter2@db/optuna")
        raise RuntimeError("bug near http://ann:hunter2@tracking:5000")

    known = runner.invoke(demo, ["known"])
    assert known.exit_code == 2 and "postgresql://bob:***@db/optuna" in known.output
    bug = runner.invoke(demo, ["bug"])
    assert bug.exit_code == 1 and "http://ann:***@tracking:5000" in bug.output
    assert "hunter2" not in known.output + bug.output


def test_a_budget_too_small_for_one_run_is_a_budget_refusal(tmp_path, monkeypatch):
    """Issue 43: `budget.epsilon` below even one training run exits 3 (a privacy budget
    refused the release), as the README's table says, not 2."""
    monkeypatch.chdir(tmp_path)
    _params(tmp_path, budget={"epsilon": 0.01, "allow_heuristic": True})
    out = runner.invoke(app, ["run"])
    assert out.exit_code == 3, out.output
    assert "too small for even one training run" in _printed(out.output)
