"""Settings that import little: the parameters file's default name and the ``tracking`` section.

They live apart from the modules that act on them (``dpfair.config.params`` pulls in the training
stack, ``dpfair.tracking.runs`` pulls in mlflow), so the CLI can name the default parameters file in
its ``--help`` and ``Params`` can hold the tracking section without importing either.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, field_validator

from dpfair.urls import ARTIFACT_SCHEMES, TRACKING_SCHEMES, check_scheme
from dpfair.workspace import durable_sqlite_uri

DEFAULT_PARAMS = "params.yaml"
DEFAULT_URI = "sqlite:///mlflow.db"
#: The CLI's -q / -v for the steps that run other programs (``quiet``, ``default``,
#: ``verbose``; set by ``dpfair.cli.console.set_verbosity``, inherited by worker processes).
VERBOSITY = "DPFAIR_VERBOSITY"
#: The logger of the experiment flow's one line per step (the CLI shows its messages alone).
STEPS_LOGGER = "flows.steps"


def verbose() -> bool:
    """Whether a step shows what the programs it runs print (``dpfair -v``)."""
    return os.environ.get(VERBOSITY) == "verbose"


def quiet() -> bool:
    """Whether a command prints its results and errors only (``dpfair -q``)."""
    return os.environ.get(VERBOSITY) == "quiet"


class TrackingConfig(BaseModel):
    """Where results land. ``MLFLOW_TRACKING_URI`` in the environment overrides ``uri``."""

    model_config = ConfigDict(extra="forbid")

    uri: str = DEFAULT_URI
    artifact_root: str = "mlartifacts"
    experiment_prefix: str = "dpfair"

    @field_validator("uri")
    @classmethod
    def _tracking_scheme(cls, uri: str) -> str:
        check_scheme(uri, TRACKING_SCHEMES, "the URL")
        return uri

    @field_validator("artifact_root")
    @classmethod
    def _artifact_scheme(cls, root: str) -> str:
        check_scheme(root, ARTIFACT_SCHEMES, "the URL")
        return root

    def resolved_uri(self) -> str:
        """The tracking URI; a relative SQLite file is the project's, also from a DVC
        temporary workspace (:func:`dpfair.workspace.durable_sqlite_uri`)."""
        return durable_sqlite_uri(os.environ.get("MLFLOW_TRACKING_URI") or self.uri)
