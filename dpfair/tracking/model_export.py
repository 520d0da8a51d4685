"""A trained model as an MLflow Model: a pyfunc that predicts from raw rows (issue 16.5).

Input: a ``pandas.DataFrame``.

* A dataset with a ``preprocessor`` (a file dataset: :mod:`dpfair.data`) takes the raw columns
  ``preprocessor.columns``; the model applies ``preprocessor.transform`` (fitted on the
  training split, saved with the model) before the network.
* A built-in dataset has no preprocessor: its rows are already the network's numeric
  features, columns ``x0 .. x{d-1}`` (``d`` = the product of the input shape). An image is
  flattened in C-order (``array.reshape(n, -1)``) and reshaped back by the model.

Rows are held to training's rules (``preprocessor.check_rows``): a category value the model
never saw is an error naming column, value and row unless the dataset declares ``unknown:
ignore``. Columns that are no features but belong to the data (target, protected attributes,
id columns) are optional inputs of the signature, accepted without a warning.

Output: a DataFrame with the dataset's id columns (when the input has them), ``prediction``
(the class as the target column holds it: ``1``, not ``"1"``; text when the target is text) and
``probability_<class>`` per class (softmax of the logits).

Environment: the model carries its code (MLflow ``code_paths``): dpfair's package and, for an
import-path model (``{name: import}``), the user's module unless an installed distribution
provides it (then that distribution is pinned). Its requirements pin the installable packages
that loading it imports (:data:`LOAD_REQUIREMENTS`), never a local build of dpfair.

Signature: the input columns (built-in: ``double``; raw columns: MLflow's ``Any``, since a
CSV read by pandas gives whole numbers as int64, which MLflow refuses for a ``double``
column, and codes of a category as numbers: the preprocessor checks the values and names a
bad one) and the outputs. The input example is no training row: the preprocessor's
``example_frame()`` when it has one (synthetic rows), else zeros (and a placeholder category).
Loading: the model's arguments are saved as JSON too (``dpfair_model.json``), so that
:mod:`dpfair.tracking.model_load` rebuilds it without unpickling its ``python_model.pkl``.
The model is logged through the explicit client (a LoggedModel of the run's experiment, the
run's output), never through MLflow's process-wide active run: trainings run in threads.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import pickle
import re
import sys
import tempfile
from importlib.metadata import packages_distributions, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
import numpy as np
import pandas as pd
from mlflow.entities import LoggedModelOutput, LoggedModelStatus
from mlflow.exceptions import MlflowException
from mlflow.models import Model, ModelSignature
from mlflow.types.schema import AnyType, ColSpec, DataType, Schema

from dpfair.data.preprocess import TablePreprocessor
from dpfair.errors import DataError
from dpfair.lazy import lazy_module
from dpfair.models import ImportModelConfig, parse_model_config
from dpfair.tracking.runs import TrackingConfig, client, flatten, log_metrics
from dpfair.urls import mask_url

if TYPE_CHECKING:
    from dpfair.data import GroupedDataset
    from dpfair.training import TrainResult

#: torch loads with the network: `dpfair predict` checks the rows against the model's rules
#: before (a wrong row is refused in the time MLflow takes to import).
torch = lazy_module("torch")

# No third-party progress bars in dpfair's output (saving a model downloads its artifacts).
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

PREDICTION = "prediction"
PROBABILITY = "probability_"
#: the model's artifacts: its weights, its JSON preprocessing, its arguments as JSON
STATE_ARTIFACT, PREPROCESSOR_ARTIFACT = "model_state", "preprocessor"
INIT_ARTIFACT = "dpfair_model"
_BATCH = 4096


def feature_columns(input_shape: tuple[int, ...]) -> list[str]:
    """The input columns of a model without preprocessor: ``x0 .. x{d-1}``."""
    return [f"x{i}" for i in range(int(np.prod(input_shape)))]


class DpfairModel(mlflow.pyfunc.PythonModel):
    """A dpfair network (rebuilt from its config and state) behind its preprocessing."""

    def __init__(self, model_config: dict[str, Any], input_shape: tuple[int, ...],
                 class_names: list[str], columns: list[str],
                 class_values: list[Any] | None = None,
                 id_columns: list[str] | None = None) -> None:
        self.model_config, self.input_shape = model_config, tuple(input_shape)
        self.class_names, self.columns = list(class_names), list(columns)
        self.class_values = list(class_values) if class_values else None
        self.id_columns = list(id_columns or [])
        self._net: torch.nn.Module | None = None
        self._preprocessor: Any = None

    def init_json(self) -> str:
        """The arguments it was made with, as JSON: :mod:`dpfair.tracking.model_load` rebuilds
        it from them, so loading a dpfair model unpickles nothing."""
        return json.dumps({"model_config": self.model_config,
                           "input_shape": list(self.input_shape),
                           "class_names": self.class_names, "columns": self.columns,
                           "class_values": self.class_values, "id_columns": self.id_columns},
                          default=lambda v: v.item() if hasattr(v, "item") else str(v))

    def load_context(self, context: Any) -> None:
        from dpfair.models import build_model

        net = build_model(parse_model_config(self.model_config), self.input_shape,
                          len(self.class_names))
        path = Path(context.artifacts[STATE_ARTIFACT])
        try:  # weights_only: a planted pickle runs nothing
            net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        except (OSError, EOFError, RuntimeError, ValueError, TypeError, AttributeError,
                pickle.UnpicklingError) as exc:
            raise DataError(f"{path.name}: not the weights of this model's network "
                            f"({type(exc).__name__}: {str(exc)[:200]}); the model folder is "
                            "damaged or was changed: log the model again with dpfair") from None
        self._net = net.eval()
        if PREPROCESSOR_ARTIFACT in context.artifacts:  # JSON: loading it runs no code
            path = Path(context.artifacts[PREPROCESSOR_ARTIFACT])
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
            if callable(getattr(self._preprocessor, "check_rows", None)):
                self._preprocessor.check_rows(rows)
            x = np.asarray(self._preprocessor.transform(rows), dtype=np.float32)
        else:
            x = rows.to_numpy(dtype=np.float32)
        bad = np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))
        if len(bad):
            raise DataError(f"row(s) {', '.join(map(str, bad[:5].tolist()))} of the input have "
                            "missing or infinite values after preprocessing: fill them in (a "
                            "model predicts nothing sensible from them)")
        return torch.from_numpy(np.ascontiguousarray(x)).reshape(len(frame), *self.input_shape)

    def predict(self, context: Any, model_input: pd.DataFrame,
                params: dict[str, Any] | None = None) -> pd.DataFrame:
        if self._net is None:
            raise RuntimeError("load_context was not called")
        frame = pd.DataFrame(model_input)
        x = self.features(frame)
        with torch.no_grad():
            probs = torch.cat([torch.softmax(self._net(x[i : i + _BATCH]), dim=1)
                               for i in range(0, len(x), _BATCH)] or [torch.empty(0, 1)])
        # models logged before class values and id columns existed have neither attribute
        labels = pd.Series(getattr(self, "class_values", None) or self.class_names)
        out = pd.DataFrame({c: frame[c].to_numpy() for c in getattr(self, "id_columns", [])
                            if c in frame})
        out[PREDICTION] = (labels.iloc[probs.argmax(dim=1).numpy()].to_numpy() if len(x)
                           else labels.iloc[:0].to_numpy())
        for k, name in enumerate(self.class_names):
            out[f"{PROBABILITY}{name}"] = probs[:, k].double().numpy() if len(x) else []
        return out


def _passed_along(dataset: GroupedDataset) -> list[str]:
    """Columns of the data that are no features: accepted silently (id columns: copied)."""
    pre, meta = dataset.preprocessor, dataset.meta
    if pre is None:
        return []
    target = meta.get("options", {}).get("target")
    named = [*meta.get("id_columns", []), *meta.get("protected", []), *([target] if target
                                                                          else [])]
    return [c for c in dict.fromkeys(named) if c not in pre.columns]


_VALUE_TYPES = ((bool, DataType.boolean), (int, DataType.long), (float, DataType.double))


def _prediction_type(class_values: list[Any] | None) -> DataType:
    for kind, dtype in _VALUE_TYPES:
        if class_values and all(isinstance(v, kind) for v in class_values):
            return dtype
    return DataType.string


def signature(dataset: GroupedDataset) -> ModelSignature:
    """The model's inputs (the features, then optional non-feature columns of the data) and
    outputs (module doc)."""
    pre = dataset.preprocessor
    columns = feature_columns(dataset.input_shape) if pre is None else list(pre.columns)
    kind = DataType.double if pre is None else AnyType()
    ids = dataset.meta.get("id_columns", []) if pre is not None else []
    outputs = [*(ColSpec(AnyType(), c) for c in ids),
               ColSpec(_prediction_type(dataset.meta.get("class_values")), PREDICTION),
               *(ColSpec(DataType.double, f"{PROBABILITY}{c}") for c in dataset.class_names)]
    inputs = [*(ColSpec(kind, c) for c in columns),
              *(ColSpec(AnyType(), c, required=False) for c in _passed_along(dataset))]
    return ModelSignature(Schema(inputs), Schema(outputs))


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


def _preprocessing(dataset: GroupedDataset) -> str:
    """The logged model's ``preprocessing`` tag: ``none``, ``declared`` (every column from
    public, declared ranges and categories) or ``fitted`` (exact training statistics, not
    covered by ε); :func:`preprocessing_note` says it in words in the descriptions."""
    pre = dataset.preprocessor
    return "none" if pre is None else "declared" if pre.data_independent else "fitted"


class _KnownNotices(logging.Filter):
    """Drop MLflow's notice about what :func:`log_model` does on purpose: the python model is
    pickled by reference (its class is in dpfair)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Passing a Python object as `python_model`")


logging.getLogger("mlflow.pyfunc").addFilter(_KnownNotices())
# A model keeps its DpfairModel pickled by name; models logged before dpfair's modules moved
# into packages name it dpfair.model_export.DpfairModel. Loaded where dpfair is already
# imported (``load``, ``dpfair predict``), that name must still find this module.
sys.modules.setdefault("dpfair.model_export", sys.modules[__name__])


#: The installable distributions that loading a model imports (dpfair's own code travels with
#: the model; ``tests/tracking/test_model_export.py`` checks this list against a fresh interpreter).
LOAD_REQUIREMENTS = ("torch", "numpy", "pandas", "scipy", "mlflow", "pydantic", "dp-accounting",
                     "pyyaml", "scikit-learn")


def _requirements(extra: list[str]) -> list[str]:
    """Pinned requirements (given, so MLflow does not load the model to infer them)."""
    names = dict.fromkeys([*LOAD_REQUIREMENTS, *extra])
    return [f"{name}=={version(name).split('+')[0]}" for name in names]


def _code(model: Any) -> tuple[list[str], list[str]]:
    """``(code_paths, extra requirements)`` of a model: dpfair's package folder, and for an
    import-path model its module's top-level file or package folder, or the installed
    distribution that provides it. MLflow copies each path into the model, without its
    ``__pycache__`` folders."""
    # dpfair's folder from this file (dpfair/tracking/model_export.py): ``dpfair.__file__`` is
    # None where the working directory holds a folder named dpfair (a DVC workspace's copy of
    # dpfair/data), which Python then imports as a namespace package
    paths = [str(Path(__file__).resolve().parents[1])]
    extra: list[str] = []
    if isinstance(model, ImportModelConfig):
        top = model.target.split(":")[0].strip().split(".")[0]
        dists = packages_distributions().get(top, [])
        if dists:
            extra.append(dists[0])
        else:
            spec = importlib.util.find_spec(top)
            if spec is None or spec.origin is None and not spec.submodule_search_locations:
                raise DataError(f"cannot find the files of module {top!r} (the model's "
                                f"target {model.target!r}) to save them with the model")
            paths.append(list(spec.submodule_search_locations)[0]
                         if spec.submodule_search_locations else spec.origin)
    return paths, extra


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
                               result.input_shape, dataset.class_names, columns,
                               class_values=dataset.meta.get("class_values"),
                               id_columns=dataset.meta.get("id_columns") if pre else None)
    mlf = client(tracking)
    name = re.sub(r"[/:.%\"']", "-", name)  # MLflow refuses these in a model's name
    logged = mlf.create_logged_model(experiment_id, name=name, source_run_id=run_id,
                                     tags={**tags, "preprocessing": _preprocessing(dataset)},
                                     params=flatten(params or {}), model_type="classifier")
    try:
        mlf.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
        log_metrics(tracking, run_id, metrics or {}, model_id=logged.model_id)
        with tempfile.TemporaryDirectory() as tmp:
            artifacts = {STATE_ARTIFACT: str(Path(tmp) / "model_state.pt")}
            torch.save(result.model_state, artifacts[STATE_ARTIFACT])
            if pre is not None:
                artifacts[PREPROCESSOR_ARTIFACT] = str(Path(tmp) / "preprocessor.json")
                Path(artifacts[PREPROCESSOR_ARTIFACT]).write_text(pre.to_json())
            artifacts[INIT_ARTIFACT] = str(Path(tmp) / "dpfair_model.json")
            Path(artifacts[INIT_ARTIFACT]).write_text(python_model.init_json())
            path = Path(tmp) / "model"
            code_paths, extra = _code(result.config.model)
            mlflow.pyfunc.save_model(
                path, python_model=python_model, artifacts=artifacts,
                signature=signature(dataset), input_example=input_example(dataset),
                code_paths=code_paths, pip_requirements=_requirements(extra),
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
    ``NAME`` (its ``@champion``, :mod:`dpfair.tracking.model_registry`). Looked up through ``cfg``'s
    store, never MLflow's process-wide tracking URI (threads share it). Any other URI (``s3://``,
    ``http://``...) is refused: loading an MLflow model runs its code, so it comes only from
    these places."""
    from dpfair.tracking.model_registry import CHAMPION

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
