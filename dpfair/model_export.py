"""A trained model as an MLflow Model: a pyfunc that predicts from raw rows (issue 16.5).

Input: a ``pandas.DataFrame``.

* A dataset with a ``preprocessor`` (a file dataset: :mod:`dpfair.data`) takes the raw columns
  ``preprocessor.columns``; the model applies ``preprocessor.transform`` (fitted on the
  training split, saved with the model) before the network.
* A built-in dataset has no preprocessor: its rows are already the network's numeric
  features, columns ``x0 .. x{d-1}`` (``d`` = the product of the input shape). An image is
  flattened in C-order (``array.reshape(n, -1)``) and reshaped back by the model.

Output: a DataFrame with column ``prediction`` (the class name) and ``probability_<class>``
per class (softmax of the logits).

Signature: the input columns (built-in: ``double``; raw columns: MLflow's ``Any``, since a
CSV read by pandas gives whole numbers as int64, which MLflow refuses for a ``double``
column, and codes of a category as numbers: the preprocessor checks the values and names a
bad one) and the outputs. The input example is no training row: the preprocessor's
``example_frame()`` when it has one (synthetic rows), else zeros (and a placeholder category).
The model is logged through the explicit client (a LoggedModel of the run's experiment, the
run's output), never through MLflow's process-wide active run: trainings run in threads.
"""

from __future__ import annotations

import logging
import os
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import torch
from mlflow.entities import LoggedModelOutput, LoggedModelStatus
from mlflow.exceptions import MlflowException
from mlflow.models import Model, ModelSignature
from mlflow.types.schema import AnyType, ColSpec, DataType, Schema

from dpfair.data import GroupedDataset
from dpfair.data.preprocess import TablePreprocessor
from dpfair.errors import DataError
from dpfair.models import build_model, parse_model_config
from dpfair.tracking import TrackingConfig, client, flatten, log_metrics
from dpfair.training import TrainResult
from dpfair.urls import mask_url

# No third-party progress bars in dpfair's output (saving a model downloads its artifacts).
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

PREDICTION = "prediction"
PROBABILITY = "probability_"
_STATE, _PREPROCESSOR = "model_state", "preprocessor"
_BATCH = 4096


def feature_columns(input_shape: tuple[int, ...]) -> list[str]:
    """The input columns of a model without preprocessor: ``x0 .. x{d-1}``."""
    return [f"x{i}" for i in range(int(np.prod(input_shape)))]


class DpfairModel(mlflow.pyfunc.PythonModel):
    """A dpfair network (rebuilt from its config and state) behind its preprocessing."""

    def __init__(self, model_config: dict[str, Any], input_shape: tuple[int, ...],
                 class_names: list[str], columns: list[str]) -> None:
        self.model_config, self.input_shape = model_config, tuple(input_shape)
        self.class_names, self.columns = list(class_names), list(columns)
        self._net: torch.nn.Module | None = None
        self._preprocessor: Any = None

    def load_context(self, context: Any) -> None:
        state = torch.load(context.artifacts[_STATE], map_location="cpu", weights_only=True)
        net = build_model(parse_model_config(self.model_config), self.input_shape,
                          len(self.class_names))
        net.load_state_dict(state)
        self._net = net.eval()
        if _PREPROCESSOR in context.artifacts:  # JSON: loading it runs no code
            path = Path(context.artifacts[_PREPROCESSOR])
            if path.suffix != ".json":
                raise DataError(f"{path.name}: this model's preprocessor is a pickle (logged by "
                                "an older dpfair), which dpfair does not load (it could run "
                                "code); train and log the model again")
            self._preprocessor = TablePreprocessor.from_json(path.read_bytes(), str(path))

    def features(self, frame: pd.DataFrame) -> torch.Tensor:
        """The network's input of ``frame``'s rows (a DataError names missing columns)."""
        missing = [c for c in self.columns if c not in frame.columns]
        if missing:
            raise DataError(f"the input lacks column(s) {', '.join(missing)}; the model takes "
                            f"{', '.join(self.columns)}")
        rows = frame[self.columns]
        if self._preprocessor is not None:
            x = np.asarray(self._preprocessor.transform(rows), dtype=np.float32)
        else:
            x = rows.to_numpy(dtype=np.float32)
        bad = np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))
        if len(bad):
            raise DataError(f"row(s) {', '.join(map(str, bad[:5].tolist()))} of the input have "
                            "missing or infinite values after preprocessing: fill them in (a "
                            "model predicts nothing sensible from them)")
        return torch.from_numpy(np.ascontiguousarray(x)).reshape(len(frame), *self.input_shape)

    @torch.no_grad()
    def predict(self, context: Any, model_input: pd.DataFrame,
                params: dict[str, Any] | None = None) -> pd.DataFrame:
        if self._net is None:
            raise RuntimeError("load_context was not called")
        x = self.features(pd.DataFrame(model_input))
        probs = torch.cat([torch.softmax(self._net(x[i : i + _BATCH]), dim=1)
                           for i in range(0, len(x), _BATCH)] or [torch.empty(0, 1)])
        labels = np.asarray(self.class_names, dtype=object)
        out = pd.DataFrame({PREDICTION: labels[probs.argmax(dim=1).numpy()] if len(x) else []})
        for k, name in enumerate(self.class_names):
            out[f"{PROBABILITY}{name}"] = probs[:, k].double().numpy() if len(x) else []
        return out


def signature(dataset: GroupedDataset) -> ModelSignature:
    """The model's inputs and outputs (module doc)."""
    pre = dataset.preprocessor
    columns = feature_columns(dataset.input_shape) if pre is None else list(pre.columns)
    kind = DataType.double if pre is None else AnyType()
    outputs = [ColSpec(DataType.string, PREDICTION),
               *(ColSpec(DataType.double, f"{PROBABILITY}{c}") for c in dataset.class_names)]
    return ModelSignature(Schema([ColSpec(kind, c) for c in columns]), Schema(outputs))


#: The value of a categorical column in the input example (a category no training row has:
#: the one-hot transform encodes it as all zeros).
EXAMPLE_CATEGORY = "example"


def input_example(dataset: GroupedDataset) -> pd.DataFrame:
    """Two rows that are no training rows: the preprocessor's synthetic ``example_frame()``
    when it offers one, else zeros, with :data:`EXAMPLE_CATEGORY` in the preprocessor's
    ``categorical`` columns (so the signature types them as strings)."""
    pre = dataset.preprocessor
    if pre is None:
        columns = feature_columns(dataset.input_shape)
        return pd.DataFrame(np.zeros((2, len(columns))), columns=columns)
    if callable(getattr(pre, "example_frame", None)):
        return pd.DataFrame(pre.example_frame())
    categorical = set(getattr(pre, "categorical", []))
    return pd.DataFrame({c: [EXAMPLE_CATEGORY] * 2 if c in categorical else [0.0, 0.0]
                         for c in pre.columns})


def preprocessing_note(dataset: GroupedDataset) -> str:
    """What a model's preprocessing releases (a tag of the model and its registered version):
    a transform fitted on the training split holds exact statistics that ε does not cover."""
    pre = dataset.preprocessor
    if pre is None:
        return "none: the model takes the dataset's numeric features"
    return "fitted on the " + str(getattr(pre, "fitted_on", "training split (not covered by ε)"))


class _KnownNotices(logging.Filter):
    """Drop MLflow's notice about what :func:`log_model` does on purpose: the python model is
    pickled by reference (its class is in dpfair)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Passing a Python object as `python_model`")


logging.getLogger("mlflow.pyfunc").addFilter(_KnownNotices())


def _requirements(has_preprocessor: bool) -> list[str]:
    """Pinned requirements (given, so MLflow does not load the model to infer them)."""
    names = ["dpfair", "torch", "numpy", "pandas", "mlflow"]
    if has_preprocessor:
        names.append("scikit-learn")
    return [f"{name}=={version(name).split('+')[0]}" for name in names]


def log_model(tracking: TrackingConfig, experiment_id: str, run_id: str, result: TrainResult,
              dataset: GroupedDataset, tags: dict[str, str], *, name: str = "model",
              params: dict[str, Any] | None = None,
              metrics: dict[str, float] | None = None) -> str:
    """Log ``result``'s model as an MLflow pyfunc Model named ``name`` (the method) of run
    ``run_id`` (its output in the Models column) with ``tags`` and its
    :func:`preprocessing_note`, ``params`` (flattened) and ``metrics`` (the model page's
    Parameters and Metrics), and return its URI ``models:/<model_id>``."""
    pre = dataset.preprocessor
    if pre is not None and not isinstance(pre, TablePreprocessor):
        raise DataError(f"dataset {dataset.name!r}: its preprocessor is a {type(pre).__name__}; "
                        "a logged model keeps only dpfair's TablePreprocessor (as JSON)")
    columns = list(pre.columns) if pre is not None else feature_columns(dataset.input_shape)
    python_model = DpfairModel(result.config.model.model_dump(mode="json"),
                               result.input_shape, dataset.class_names, columns)
    mlf = client(tracking)
    logged = mlf.create_logged_model(experiment_id, name=name, source_run_id=run_id,
                                     tags={**tags, "preprocessing": preprocessing_note(dataset)},
                                     params=flatten(params or {}), model_type="classifier")
    try:
        mlf.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
        log_metrics(tracking, run_id, metrics or {}, model_id=logged.model_id)
        with tempfile.TemporaryDirectory() as tmp:
            artifacts = {_STATE: str(Path(tmp) / "model_state.pt")}
            torch.save(result.model_state, artifacts[_STATE])
            if pre is not None:
                artifacts[_PREPROCESSOR] = str(Path(tmp) / "preprocessor.json")
                Path(artifacts[_PREPROCESSOR]).write_text(pre.to_json())
            path = Path(tmp) / "model"
            mlflow.pyfunc.save_model(
                path, python_model=python_model, artifacts=artifacts,
                signature=signature(dataset), input_example=input_example(dataset),
                pip_requirements=_requirements(pre is not None),
                mlflow_model=Model(artifact_path=logged.artifact_location,
                                   model_uuid=logged.model_id, run_id=run_id,
                                   model_id=logged.model_id))
            mlf.log_model_artifacts(logged.model_id, str(path))
    except BaseException:
        mlf.finalize_logged_model(logged.model_id, LoggedModelStatus.FAILED)
        raise
    mlf.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    return f"models:/{logged.model_id}"


def model_location(cfg: TrackingConfig, model: str) -> str:
    """Where the files of ``model`` are: a local folder (or ``file://`` URI) the user names, or
    a model of ``cfg``'s store: ``runs:/...``, a logged model ``models:/<model_id>``, a
    registered version ``models:/NAME/VERSION`` or ``NAME/VERSION``, ``NAME@ALIAS``, or
    ``NAME`` (its ``@champion``, :mod:`dpfair.registry`). Looked up through ``cfg``'s store,
    never MLflow's process-wide tracking URI (threads share it). Any other URI (``s3://``,
    ``http://``...) is refused: loading an MLflow model runs its code, so it comes only from
    these places."""
    from dpfair.registry import CHAMPION

    if Path(model).exists() or model.startswith(("file://", "runs:/")):
        return model
    if "://" in model:
        raise DataError(f"--model {mask_url(model)}: dpfair loads models only from the "
                        "configured tracking store (tracking.uri) or a local folder you name, "
                        "since loading an MLflow model runs its code; download the model to a "
                        "folder you trust and give that folder")
    mlf = client(cfg)
    ref = model.removeprefix("models:/")
    if ref.startswith("m-") and "/" not in ref:
        return mlf.get_logged_model(ref).artifact_location
    name, _, number = ref.partition("/")
    name, _, alias = name.partition("@")
    if not number:
        if not mlf.search_model_versions(f"name = '{name}'"):
            raise DataError(f"no registered model {name!r} in {mask_url(cfg.resolved_uri())}: "
                            "give --model NAME[@ALIAS|/VERSION] of a registered model, "
                            "models:/<model_id> or a model folder (`dpfair run` registers "
                            "its selected model)")
        try:
            number = mlf.get_model_version_by_alias(name, alias or CHAMPION).version
        except MlflowException:
            raise DataError(f"registered model {name!r} has no @{alias or CHAMPION}: give "
                            f"--model {name}/VERSION, or make a version the champion with "
                            f"`dpfair promote {name} VERSION`") from None
    return mlf.get_model_version_download_uri(name, str(number))


def load(cfg: TrackingConfig, model: str) -> mlflow.pyfunc.PyFuncModel:
    """The pyfunc model ``model`` (see :func:`model_location`) of ``cfg``'s store."""
    return mlflow.pyfunc.load_model(model_location(cfg, model))


def predict_csv(cfg: TrackingConfig, model: str, rows: Path, out: Path) -> int:
    """Predict the raw rows of CSV ``rows`` with ``model``, write the predictions to CSV
    ``out`` (written whole or not at all) and return how many rows were predicted."""
    loaded = load(cfg, model)
    schema = loaded.metadata.get_input_schema()
    frame = pd.read_csv(rows)
    if frame.empty:
        raise DataError(f"{rows} holds no rows to predict (a header only?); give at least one "
                        "row under the header")
    if schema is not None:
        missing = [c for c in schema.input_names() if c not in frame.columns]
        if missing:
            raise DataError(f"{rows}: no column(s) {', '.join(map(str, missing))}; the model "
                            f"takes {', '.join(map(str, schema.input_names()))}")
        for spec in schema.inputs:
            if spec.type in (DataType.double, DataType.float):  # whole numbers read as int64
                frame[spec.name] = _numbers(frame[spec.name], rows).astype(spec.type.to_numpy())
        frame = frame[schema.input_names()]
    predictions = pd.DataFrame(loaded.predict(frame))
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    predictions.to_csv(partial, index=False)
    partial.replace(out)
    return len(predictions)


def _numbers(values: pd.Series, rows: Path) -> pd.Series:
    """``values`` as numbers (missing stays NaN); a DataError names other values."""
    parsed = pd.to_numeric(values, errors="coerce")
    bad = values[parsed.isna() & values.notna()]
    if len(bad):
        raise DataError(f"{rows}: column {values.name!r} is numeric but holds "
                        f"{list(bad.astype(str).unique()[:5])}; give numbers (or leave empty)")
    return parsed
