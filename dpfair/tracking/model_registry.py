"""MLflow Model Registry conventions: one registered model per dataset, two aliases.

- Every registered version gets the alias ``@challenger`` (the newest candidate).
- ``@champion`` is the version that ``dpfair predict --model NAME`` and
  ``mlflow.pyfunc.load_model("models:/NAME@champion")`` serve. A new version takes it only
  when it is at least as good on the registry's criterion (``pipeline.registry.criterion``,
  worst-group test accuracy by default) at no more ε released for its method than the
  champion's (:func:`at_least_as_good`); or by an explicit ``dpfair promote`` (:func:`promote`).
  The first version of a model is its champion.

Each version links its logged model: tag :data:`MODEL_ID_TAG` (MLflow's SQL registry store
drops the ``model_id`` given at creation: it reads back None) and, on the logged model,
MLflow's ``mlflow.modelVersions`` tag. The rule reads only version tags that hold numbers
(:data:`EPSILON_TAG` and the criterion: fractions, never percent); prose goes to each
version's own description.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

from dpfair.errors import DataError
from dpfair.tracking.runs import TrackingConfig, client

__all__ = ["CHALLENGER", "CHAMPION", "CRITERIA", "EPSILON_TAG", "MODEL_ID_TAG", "at_least_as_good",
           "champion", "promote", "register"]

CHAMPION, CHALLENGER = "champion", "challenger"
#: The version tag holding the ε released for the version's method (``inf`` without guarantee).
EPSILON_TAG = "epsilon_released_for_method"
#: The version tag naming its logged model (MLflow's SQL registry store keeps no ``model_id``).
MODEL_ID_TAG = "model_id"
#: The criteria a champion can be chosen by, and whether higher is better.
CRITERIA = {"worst_group_accuracy": True, "accuracy": True, "largest_group_gap": False}


def _number(tags: Mapping[str, str], key: str) -> float:
    try:
        return float(tags[key])
    except (KeyError, ValueError):
        return math.nan


def at_least_as_good(new: Mapping[str, str], old: Mapping[str, str],
                     criterion: str = "worst_group_accuracy") -> bool:
    """Whether version tags ``new`` are at least as good as ``old`` on ``criterion`` at no
    more ε (:data:`EPSILON_TAG`). A missing or NaN value is never as good."""
    a, b = _number(new, criterion), _number(old, criterion)
    better = a >= b if CRITERIA[criterion] else a <= b
    return better and _number(new, EPSILON_TAG) <= _number(old, EPSILON_TAG)


def champion(cfg: TrackingConfig, name: str) -> ModelVersion | None:
    """The ``@champion`` version of registered model ``name``, or None."""
    try:
        return client(cfg).get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None


def register(cfg: TrackingConfig, name: str, model_uri: str, run_id: str,
             tags: Mapping[str, Any], description: str = "", *,
             criterion: str = "worst_group_accuracy", model_description: str = ""
             ) -> dict[str, str]:
    """Register the logged model ``model_uri`` (``models:/<model_id>``) of run ``run_id`` as a
    new version of ``name`` (created, with ``model_description``, when absent) linked to the
    logged model, with ``tags`` and its own ``description``; give it ``@challenger``, and
    ``@champion`` by the module's rule. Returns ``{"name", "version", "champion"}``.
    Idempotent per run: a version of ``name`` from the same run and model is reused (a
    retried task registers once)."""
    mlf = client(cfg)
    try:
        mlf.create_registered_model(name, description=model_description or None)
    except MlflowException as exc:
        if exc.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
            raise
    model_id = model_uri.removeprefix("models:/")
    # the source is the model's storage: a models:/ source is resolved through MLflow's
    # process-wide tracking URI, not this client's
    source = mlf.get_logged_model(model_id).artifact_location
    found = [v for v in mlf.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
             if v.source == source]
    version = found[0] if found else mlf.create_model_version(
        name, source, run_id=run_id, tags={MODEL_ID_TAG: model_id,
                                           **{k: str(v) for k, v in tags.items()}},
        description=description or None, model_id=model_id)
    number = str(version.version)
    _link(mlf, model_id, name, number)
    mlf.set_registered_model_alias(name, CHALLENGER, number)
    current = champion(cfg, name)
    if current is None or (str(current.version) != number
                           and at_least_as_good(version.tags, current.tags, criterion)):
        mlf.set_registered_model_alias(name, CHAMPION, number)
        current = version
    return {"name": name, "version": number, "champion": str(current.version)}


def _link(mlf: MlflowClient, model_id: str, name: str, version: str) -> None:
    """Name the version on its logged model (tag ``mlflow.modelVersions``: the logged model's
    page lists its registered versions), as ``mlflow.register_model`` does."""
    links = json.loads(mlf.get_logged_model(model_id).tags.get(MLFLOW_MODEL_VERSIONS, "[]"))
    if {"name": name, "version": version} not in links:
        mlf.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(
            [*links, {"name": name, "version": version}])})


def promote(cfg: TrackingConfig, name: str, version: str | None = None) -> str:
    """Make ``version`` of ``name`` (default: its ``@challenger``) the ``@champion``; returns
    the version. A DataError names a model or version the registry does not hold."""
    mlf = client(cfg)
    try:
        number = version or str(mlf.get_model_version_by_alias(name, CHALLENGER).version)
        mlf.get_model_version(name, str(number))
    except MlflowException:
        raise DataError(
            f"registered model {name!r} has no version {version or '@' + CHALLENGER} in "
            f"{cfg.resolved_uri()}: give a version that `mlflow` lists for it (a pipeline "
            "run, or `dpfair train --register`, registers one)") from None
    mlf.set_registered_model_alias(name, CHAMPION, str(number))
    return str(number)
