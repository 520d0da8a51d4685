"""Loading a logged dpfair model and predicting with it (``dpfair predict``), without
unpickling anything a model folder holds.

An MLflow pyfunc model is loaded by unpickling its ``python_model.pkl``, which can run any
code. A dpfair model (:mod:`dpfair.tracking.model_export`) also carries the arguments it was
made with as JSON (``dpfair_model.json``), its weights (``model_state.pt``, read with
``torch.load(weights_only=True)``) and its preprocessing as JSON: :func:`load_location`
rebuilds it from those and never reads the pickle. A model that only a pickle can load (an
older dpfair's, one whose network is the user's own module, or a model that is not dpfair's) is
loaded by MLflow only when it is trusted: a model of the tracking store, or a folder the user
marks as trusted (``dpfair predict --trust-model``).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mlflow
import pandas as pd
from mlflow.models import Model
from mlflow.models.model import MLMODEL_FILE_NAME
from mlflow.types.schema import DataType

from dpfair.data.preprocess import TablePreprocessor
from dpfair.errors import DataError
from dpfair.models import ImportModelConfig, parse_model_config
from dpfair.tracking.model_export import (
    INIT_ARTIFACT,
    PREPROCESSOR_ARTIFACT,
    STATE_ARTIFACT,
    DpfairModel,
    model_location,
)
from dpfair.tracking.runs import TrackingConfig
from dpfair.urls import mask_url

__all__ = ["checked_rows", "from_store", "load", "load_location", "predict_csv",
           "write_predictions"]


def from_store(model: str) -> bool:
    """Whether ``model`` (as :func:`model_location` takes it) names a model of the tracking
    store (a name, ``models:/``, ``runs:/``) rather than a local folder."""
    return not (Path(model).exists() or model.startswith("file://"))


def load(cfg: TrackingConfig, model: str, trusted: bool = False
         ) -> mlflow.pyfunc.PyFuncModel:
    """The model ``model`` (see :func:`model_location`) of ``cfg``'s store, loaded by
    :func:`load_location` (a model of the store is trusted, a folder only if ``trusted``)."""
    return load_location(model_location(cfg, model), trusted or from_store(model))


class _Rebuilt:
    """A dpfair model rebuilt without unpickling, as a pyfunc model's implementation (MLflow's
    :class:`~mlflow.pyfunc.PyFuncModel` around it enforces the input schema, as for a model
    MLflow loads)."""

    def __init__(self, model: DpfairModel) -> None:
        self.model = model

    def predict(self, model_input: pd.DataFrame, params: dict[str, Any] | None = None
                ) -> pd.DataFrame:
        return self.model.predict(None, model_input, params)


def load_location(location: str, trusted: bool = False) -> mlflow.pyfunc.PyFuncModel:
    """The model at ``location``. A dpfair model of a built-in network is rebuilt from its
    ``dpfair_model.json`` (its arguments), its weights (``torch.load(weights_only=True)``) and
    its JSON preprocessing: its ``python_model.pkl`` is never unpickled, so a planted one runs
    nothing. Any other model (an older dpfair's without the JSON, one whose network is the
    user's own module, which imports that module's code, or not dpfair's) is loaded by MLflow,
    which unpickles it and may run code: only when ``trusted`` (a model of the tracking store,
    or a folder the user marks as trusted), else a ``DataError`` says so."""
    metadata = Model.load(_download(location, MLMODEL_FILE_NAME))
    artifacts = metadata.flavors.get("python_function", {}).get("artifacts", {})
    init = artifacts.get(INIT_ARTIFACT, {}).get("path", "")
    if init.endswith(".json"):
        try:
            args = json.loads(Path(_download(location, init)).read_text(encoding="utf-8"))
            own_code = isinstance(parse_model_config(args["model_config"]), ImportModelConfig)
            model = None if own_code else DpfairModel(**args)
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{init}: not the arguments of a dpfair model ({type(exc).__name__}:"
                            f" {str(exc)[:200]}); the model folder is damaged or was changed: "
                            "log the model again with dpfair") from None
        if model is not None:
            model.load_context(SimpleNamespace(artifacts={
                name: _download(location, spec["path"]) for name, spec in artifacts.items()
                if name in (STATE_ARTIFACT, PREPROCESSOR_ARTIFACT)}))
            return mlflow.pyfunc.PyFuncModel(model_meta=metadata, model_impl=_Rebuilt(model))
    if not trusted:
        reason = ("its network is a user's module, whose code loading it imports"
                  if init.endswith(".json") else
                  "it has no dpfair_model.json (an older dpfair's or not dpfair's), so only "
                  "its python_model.pkl can load it, which can run any code")
        raise DataError(f"{mask_url(location)}: {reason}. dpfair loads such a model only from "
                        "the tracking store (tracking.uri) or a folder you trust: if you trust "
                        "whoever wrote this folder, give --trust-model (else log the model "
                        "again with dpfair)")
    return mlflow.pyfunc.load_model(location)


def predict_csv(cfg: TrackingConfig, model: str, rows: Path, out: Path,
                trusted: bool = False) -> int:
    """Predict the raw rows of the CSV or Parquet file ``rows`` with ``model`` (a model folder
    holding only a pickle: only if ``trusted``, :func:`load_location`), write the predictions
    to CSV ``out`` (written whole or not at all) and return how many rows were predicted."""
    from dpfair.data.table_file import read_rows

    frame, _ = read_rows(rows)  # before loading the model: a bad file is a quick DataError
    location, frame = checked_rows(cfg, model, frame, rows)
    return write_predictions(location, frame, out, trusted or from_store(model))


def checked_rows(cfg: TrackingConfig, model: str, frame: pd.DataFrame,
                 rows: Path) -> tuple[str, pd.DataFrame]:
    """Where ``model``'s files are (:func:`model_location`), and the rows ``frame`` read from
    the file ``rows`` as the model takes them. They are held to the model's input schema and its
    preprocessing rules (read from its MLmodel and JSON transform) before its network, torch
    and its code load, so a wrong row costs little: a ``DataError`` names the column, the value
    and the row."""
    location = model_location(cfg, model)
    metadata = Model.load(_download(location, MLMODEL_FILE_NAME))  # no weights, no code
    schema = metadata.get_input_schema()
    if schema is not None:
        missing = [c for c in schema.required_input_names() if c not in frame.columns]
        if missing:
            raise DataError(f"{rows}: no column(s) {', '.join(map(str, missing))}; the model "
                            f"takes {', '.join(map(str, schema.input_names()))}")
        for spec in schema.inputs:
            if spec.type in (DataType.double, DataType.float):  # whole numbers read as int64
                frame[spec.name] = _numbers(frame[spec.name], rows).astype(spec.type.to_numpy())
        frame = frame[[c for c in schema.input_names() if c in frame.columns]]
    preprocessor = _preprocessor(location, metadata)
    if preprocessor is not None:  # training's rules, before torch and the network load
        preprocessor.check_rows(frame)
    return location, frame


def write_predictions(location: str, frame: pd.DataFrame, out: Path,
                      trusted: bool = False) -> int:
    """Predict the rows of :func:`checked_rows` with the model at ``location``
    (:func:`load_location`: ``trusted`` for a model of the store or a folder the user trusts),
    write them to CSV ``out`` (whole or not at all) and return how many were predicted."""
    predictions = pd.DataFrame(load_location(location, trusted).predict(frame))
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    predictions.to_csv(partial, index=False)
    partial.replace(out)
    return len(predictions)


def _preprocessor(location: str, metadata: Model) -> TablePreprocessor | None:
    """The saved transform of the model at ``location`` (a JSON artifact: reading it runs no
    code), or None for a model without one."""
    artifacts = metadata.flavors.get("python_function", {}).get("artifacts", {})
    path = artifacts.get(PREPROCESSOR_ARTIFACT, {}).get("path", "")
    if not path.endswith(".json"):  # none, or an older pickle the model itself refuses
        return None
    return TablePreprocessor.from_json(Path(_download(location, path)).read_bytes(), path)


def _download(location: str, path: str) -> str:
    """A local copy of the file ``path`` of the model at ``location`` (a folder or a URI of
    any artifact store), and of nothing else of the model."""
    return mlflow.artifacts.download_artifacts(artifact_uri=f"{location.rstrip('/')}/{path}")


def _numbers(values: pd.Series, rows: Path) -> pd.Series:
    """``values`` as numbers (missing stays NaN); a DataError names other values."""
    parsed = pd.to_numeric(values, errors="coerce")
    bad = values[parsed.isna() & values.notna()]
    if len(bad):
        raise DataError(f"{rows}: column {values.name!r} is numeric but holds "
                        f"{list(bad.astype(str).unique()[:5])}; give numbers (or leave empty)")
    return parsed
