"""`dpfair run` validates everything before any work (issue 27): a wrong pair, a category
missing from a declaration, a BatchNorm model are each one clear user error (exit code 2, its
label, printed once, no traceback) before Prefect, MLflow or the tracking server is touched,
and before the data is split."""

from __future__ import annotations

import copy
import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.cli.conftest import CENSUS_PARAMS
from tests.conftest import cli_in_a_fresh_python
from tests.data.own_tables import census_frame

BN_MODULE = """
import torch.nn as nn


def make_net(input_shape, n_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], 8), nn.BatchNorm1d(8),
                         nn.Linear(8, n_classes))
"""


CASES = {
    "pair": (lambda p: p["experiment"].update(pair={"census": ["A", "Z"]}),
             "configuration error", "experiment.pair: 'Z' is not a group"),
    "categories": (lambda p: p["datasets"]["census"]["categories"].update(Activity=[1, 2]),
                   "data error", "holds '3'"),
    "batchnorm": (lambda p: p["experiment"].update(
        model={"name": "import", "target": "bn_models:make_net"}),
        "privacy error", "BatchNorm1d"),
}


def test_run_refuses_each_wrong_setting_once_before_any_heavy_work(tmp_path: Path) -> None:
    census_frame(600).to_csv(tmp_path / "census.csv", index=False)
    (tmp_path / "bn_models.py").write_text(BN_MODULE)
    for name, (edit, _, _) in CASES.items():
        params = copy.deepcopy(CENSUS_PARAMS)
        edit(params)
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(params))
    heavy = ("prefect", "mlflow", "optuna", "sklearn", "dp_accounting")
    # the settings and the data need no torch: a wrong pair or category is found without it
    found, loaded = cli_in_a_fresh_python(
        tmp_path, {name: ["run", "--params", f"{name}.yaml"] for name in ("pair", "categories")},
        (*heavy, "torch"))
    assert loaded == []
    # the model check needs torch, and nothing else heavy: neither Prefect nor the tracking
    # libraries, nor the split (scikit-learn) or the accounting; the model is checked on the
    # table's preview, before its split
    found_bn, loaded = cli_in_a_fresh_python(
        tmp_path, {"batchnorm": ["run", "--params", "batchnorm.yaml"]}, heavy)
    assert loaded == []
    found.update(found_bn)
    for name, (_, label, message) in CASES.items():
        code, output = found[name]
        assert code == 2, (name, output)
        assert output.count(f"{label}: ") == 1 and output.count(message) == 1, output
        assert "Traceback" not in output and "bug" not in output


def test_a_typo_is_refused_before_the_data_and_the_tracking_libraries_load(tmp_path: Path) -> None:
    """A misspelt key is refused when params.yaml loads, before `dpfair run` imports torch (the
    method and model settings load without it), what the checks of the data need (pandas,
    sklearn), the accounting (dp_accounting, scipy) or anything of Prefect, MLflow or Optuna."""
    params = copy.deepcopy(CENSUS_PARAMS)
    params["experiment"]["datset"] = params["experiment"].pop("dataset")
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(params))
    found, loaded = cli_in_a_fresh_python(
        tmp_path, {"typo": ["run", "--params", "typo.yaml"]},
        ("torch", "pandas", "sklearn", "dp_accounting", "scipy", "prefect", "mlflow", "optuna",
         "dvc"))
    [code, output] = found["typo"]
    assert code == 2 and loaded == [], (output, loaded)
    assert output.count("did you mean 'dataset'") == 1 and "Traceback" not in output


def test_train_tune_and_audit_refuse_a_batchnorm_model_before_the_split(tmp_path: Path) -> None:
    """The single-method commands check their model on the dataset's preview too: a refused
    model never reaches the split (scikit-learn), nor what the run would need (the gate's
    accounting, Optuna, MLflow)."""
    census_frame(600).to_csv(tmp_path / "census.csv", index=False)
    (tmp_path / "bn_models.py").write_text(BN_MODULE)
    params = copy.deepcopy(CENSUS_PARAMS)
    CASES["batchnorm"][0](params)
    params["tuning"] = {"spaces": {"dpsgd": {"lr": [0.1, 0.5]}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    found, loaded = cli_in_a_fresh_python(
        tmp_path, {command: [command, "--method", "dpsgd", "--params", "params.yaml"]
                   for command in ("train", "tune", "audit")},
        ("sklearn", "dp_accounting", "scipy", "optuna", "mlflow", "prefect"))
    assert loaded == []
    for command, (code, output) in found.items():
        assert code == 2 and output.count("BatchNorm1d") == 1, (command, output)
        assert "Traceback" not in output, (command, output)


def test_the_benchmark_times_each_case_to_its_error(tmp_path: Path) -> None:
    """benchmarks/fail_fast.py runs the cases above (each must end in its error, exit code 2)
    and the floors they need; here one case and its floor, once."""
    from tests.conftest import load_benchmark

    bench = load_benchmark("fail_fast")
    commands = bench._workspace(tmp_path)
    floors = {*bench.FLOORS, bench.LOOKUP}
    assert set(commands) == floors | set(bench.NEEDS)
    assert {"typo", *CASES} <= set(bench.NEEDS) and set(bench.NEEDS.values()) <= floors
    for name in ("floor: python + pandas", bench.LOOKUP, "typo", "batchnorm, dpfair audit"):
        wall, cpu = bench._timed(commands[name], tmp_path, 2 if name in bench.NEEDS else 0)
        assert wall > 0 and cpu > 0
    with pytest.raises(SystemExit, match="exit code 0"):  # a case that does not fail
        bench._timed([sys.executable, "-c", "import sys"], tmp_path, 2)


def test_a_dataset_whose_preview_was_checked_is_not_checked_again(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """check_run builds each method's model once on the preview; the loaded dataset shows the
    same names and shape (a built-in dataset; a table whose categories are all in training), so
    the model is not built and checked a second time (only once more, for its size)."""
    from dpfair.config.params import parse_params
    from dpfair.pipeline.check_step import check_run

    (tmp_path / "counted.py").write_text(textwrap.dedent("""
        from pathlib import Path
        import torch.nn as nn

        def make_net(input_shape, n_classes):
            with open(Path(__file__).with_name("builds.txt"), "a") as out:
                out.write("x")
            return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], n_classes))
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    census_frame(600).to_csv(tmp_path / "census.csv", index=False)
    for dataset in ("synthetic", "census"):
        params = copy.deepcopy(CENSUS_PARAMS)
        params["experiment"].update(
            dataset=dataset, model={"name": "import", "target": "counted:make_net"},
            methods={"dpsgd": {"C": 1.0}, "dpsgd_f": {}})
        params["tracking"] = {"uri": "sqlite:///m.db"}
        (tmp_path / "builds.txt").write_text("")
        check_run(parse_params(params))
        assert (tmp_path / "builds.txt").read_text() == "xxx", dataset  # 2 methods + size


def test_the_collector_is_paused_only_while_a_command_checks() -> None:
    from dpfair.cli.console import checking

    assert gc.isenabled()
    with checking():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), checking():
        raise ValueError("a refused setting")
    assert gc.isenabled()
    gc.disable()
    try:
        with checking():
            pass
        assert not gc.isenabled()  # left as it was
    finally:
        gc.enable()


def test_a_refused_check_freezes_its_objects_only_in_the_commands_own_process(
        monkeypatch) -> None:
    """In `dpfair`'s own process a refusal freezes what the checks loaded (its exit then skips
    scanning them); where app() is called from Python, or the checks pass, nothing is frozen."""
    from dpfair.cli import console

    assert gc.get_freeze_count() == 0
    with pytest.raises(ValueError), console.checking():
        raise ValueError("a refused setting")
    assert gc.get_freeze_count() == 0  # this process goes on
    monkeypatch.setattr(console, "_ends_with_command", True)
    with console.checking():
        pass
    assert gc.get_freeze_count() == 0  # the checks passed: the work goes on
    try:
        with pytest.raises(ValueError), console.checking():
            raise ValueError("a refused setting")
        assert gc.get_freeze_count() > 0 and gc.isenabled()
    finally:
        gc.unfreeze()


def test_the_dpfair_command_ends_its_process_with_a_refusal_frozen(tmp_path: Path) -> None:
    """`python -m dpfair.cli` and the `dpfair` script run dpfair.cli.main, which marks the
    process as the command's own: a refusal there ends with the objects frozen and every exit
    handler run; app() called from Python freezes nothing."""
    from importlib.metadata import entry_points

    assert entry_points(group="console_scripts")["dpfair"].value == "dpfair.cli:main"
    params = copy.deepcopy(CENSUS_PARAMS)
    params["experiment"]["datset"] = params["experiment"].pop("dataset")
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(params))
    probe = ("import atexit, gc, sys; "
             "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0)); "
             "sys.argv = ['dpfair', 'run', '--params', 'typo.yaml']; "
             "from dpfair.cli import {}; {}()")
    for entry, frozen in (("main", True), ("app", False)):
        done = subprocess.run([sys.executable, "-c", probe.format(entry, entry)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "did you mean 'dataset'" in done.stdout + done.stderr
        assert f"frozen at exit: {frozen}" in done.stdout, (entry, done.stdout, done.stderr)


def test_a_command_works_with_the_collector_running(tmp_path: Path, monkeypatch) -> None:
    """`dpfair train` checks with the collector paused, then trains with it running."""
    from typer.testing import CliRunner

    import dpfair.pipeline.standalone as standalone
    from dpfair.cli import app

    census_frame(600).to_csv(tmp_path / "census.csv", index=False)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(CENSUS_PARAMS))
    monkeypatch.chdir(tmp_path)
    seen: list[bool] = []

    def train_standalone(*args, **kwargs):
        seen.append(gc.isenabled())
        raise RuntimeError("stop here")

    monkeypatch.setattr(standalone, "train_standalone", train_standalone)
    CliRunner().invoke(app, ["train", "--method", "dpsgd", "--params", "params.yaml"])
    assert seen == [True] and gc.isenabled()
