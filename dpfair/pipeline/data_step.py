"""The pipeline's data step: run the dataset's DVC ``prepare``
stage (or prepare it directly without DVC), load what it wrote, and log a pipeline run's
inputs (settings, ``params.yaml``, the dataset with its version) on its MLflow run."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from dpfair.config.params import Params
from dpfair.data import GroupedDataset, data_version, load_prepared, prepare
from dpfair.data.prepared import file_md5
from dpfair.errors import DataError
from dpfair.settings import verbose
from dpfair.tracking.run_log import log_data_input
from dpfair.tracking.runs import TrackingConfig, log_params, log_text
from dpfair.urls import mask_text

__all__ = ["PreparedData", "dvc_prepare_stages", "load_data", "log_pipeline_inputs",
           "prepare_data"]


@dataclass(frozen=True)
class PreparedData:
    """A prepared dataset: its ``name``, the folder ``path`` of its arrays and its data
    ``version`` (DVC's out hash, or the md5 of its arrays without DVC)."""

    name: str
    path: str
    version: str


def dvc_prepare_stages(root: str | Path) -> tuple[str, ...]:
    """The datasets that have a ``prepare@<name>`` stage: the ``foreach`` of ``dvc.yaml``, a
    list or a params.yaml key (``${datasets}``: the datasets declared there). No ``dvc.yaml``
    under ``root``: none."""
    path = Path(root) / "dvc.yaml"
    if not path.is_file():
        return ()
    stages = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("stages", {})
    foreach = stages.get("prepare", {}).get("foreach", [])
    if isinstance(foreach, str) and foreach.startswith("${") and foreach.endswith("}"):
        params_file = Path(root) / "params.yaml"
        foreach = (yaml.safe_load(params_file.read_text(encoding="utf-8")) or {}
                   ) if params_file.is_file() else {}
        for key in stages["prepare"]["foreach"][2:-1].split("."):
            foreach = foreach.get(key) or {}
    return tuple(str(name) for name in foreach)


def prepare_data(params: Params, root: str | Path, params_path: str | Path) -> PreparedData:
    """Run the dataset's DVC ``prepare`` stage and return where it wrote and its version.

    The version is the out hash DVC records in ``dvc.lock``. Without DVC (``pipeline.use_dvc``
    false, a dataset with no stage, or a params file other than the stage's) the dataset is
    prepared directly and the version is the md5 of its arrays, the same hash DVC would record.
    """
    root = Path(root).resolve()
    name = params.experiment.dataset
    out_dir = root / params.pipeline.data_dir
    uses_stage_params = Path(params_path).resolve() == root / "params.yaml"
    if params.pipeline.use_dvc and name in dvc_prepare_stages(root) and uses_stage_params:
        if os.environ.get("DVC_STAGE"):
            # inside `dvc repro`'s `run` stage: DVC ran prepare@name first (a dependency of
            # `run`) and holds a lock on it, so a nested reproduce would fail; read its lock
            version = data_version(name, root / "dvc.lock")
            if version is None:
                raise DataError(f"dvc.lock has no prepare@{name} output: run `dvc repro` (it "
                                f"prepares {name} before the run stage)")
        else:
            from dvc.repo import Repo

            # the stage's command is `python -m dpfair.cli ...`: run it with this interpreter
            os.environ["PATH"] = (f"{Path(sys.executable).parent}{os.pathsep}"
                                  f"{os.environ['PATH']}")
            with _stage_output(), Repo(str(root)) as repo:
                repo.reproduce(f"prepare@{name}")
            version = data_version(name, root / "dvc.lock")
        path = root / "data" / "prepared" / name
    else:
        prepare(name, params.dataset(name), out_dir)
        path = out_dir / name
        version = None
    version = version or file_md5(path / "arrays.npz")
    return PreparedData(name=name, path=str(path), version=version)


@contextmanager
def _stage_output() -> Iterator[None]:
    """What DVC and the stage's command print (the stage's name and command, the data's
    table) kept back unless ``dpfair -v``, and shown on stderr if the stage fails. The file
    descriptor itself: the command is another process."""
    if verbose():
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as kept:
        os.dup2(kept.fileno(), 1)
        try:
            yield
        except BaseException:
            sys.stdout.flush()
            os.dup2(saved, 1)
            kept.seek(0)
            sys.stderr.write(kept.read().decode(errors="replace"))
            raise
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)


def load_data(prepared: PreparedData) -> GroupedDataset:
    """The prepared dataset, its arrays checked against their recorded version first (a file
    changed or planted after preparing is refused, before anything reads it)."""
    return load_prepared(prepared.path, md5=prepared.version)


def log_pipeline_inputs(params: Params, params_path: str | Path, prepared: PreparedData,
                        dataset: GroupedDataset, tracking: TrackingConfig, run_id: str) -> None:
    """What a pipeline run was asked to do, on its run: the settings as params (compare page,
    parallel coordinates), ``params.yaml`` as given and the resolved configuration (defaults
    filled in) as artifacts under ``config/`` (URL passwords masked), and the dataset as its
    logged input."""
    settings = {"experiment": params.experiment.model_dump(mode="json"),
                "budget": params.budget.model_dump(mode="json"),
                "tuning": {"release": params.tuning.release, **params.tuning.settings}}
    log_params(tracking, run_id, settings)
    given = Path(params_path).read_text(encoding="utf-8")
    log_text(tracking, run_id, mask_text(given), f"config/{Path(params_path).name}")
    resolved = yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False)
    log_text(tracking, run_id, mask_text(resolved), "config/resolved_params.yaml")
    log_data_input(tracking, run_id, dataset, prepared.version, prepared.path)
