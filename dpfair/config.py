"""Pydantic models of ``params.yaml``; every bad value becomes one clear ``ConfigError``.

The root model ``Params`` has one field per top-level section of params.yaml. Sections are
strict pydantic models with ``extra="forbid"``; a new section is a new field of ``Params``.
Messages come from :func:`dpfair.errors.format_validation_error` (``key.path: message`` lines
with did-you-mean hints), so new sections get the same messages for free. ``ConfigError`` and
``format_validation_error`` are re-exported here for callers that read them from the config.

This is the top layer of the library: it may import every lower layer (data, training,
tuning's pure config, tracking's settings), never mlflow, optuna, prefect or dvc.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from dpfair.audit.config import AuditSection
from dpfair.data.options import DatasetOptions
from dpfair.data.registry import get_spec, specs
from dpfair.errors import ConfigError, TuningError, format_validation_error  # re-exported
from dpfair.sections import (
    BudgetSection,
    ExperimentSection,
    PipelineSection,
    TuningSection,
    check_spaces,
)
from dpfair.settings import DEFAULT_PARAMS, TrackingConfig  # DEFAULT_PARAMS re-exported

# ---------------------------------------------------------------------------------------------
# sections


class Section(BaseModel):
    """Base of every params.yaml section: strict, unknown keys forbidden, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    config_key_noun: ClassVar[str] = "key"


def _datasets_section() -> type[Section]:
    """``datasets:``: one key per registered dataset, each the options model of its loader."""
    fields: dict[str, Any] = {
        name: (spec.options, Field(default_factory=spec.options, description=spec.summary))
        for name, spec in specs().items()
    }
    section = create_model("DatasetsSection", __base__=Section, **fields)
    section.config_key_noun = "dataset"
    return section


DatasetsSection = _datasets_section()


class Params(Section):
    """The whole of params.yaml. Sections not given take their defaults."""

    config_key_noun: ClassVar[str] = "section"

    datasets: DatasetsSection = Field(default_factory=DatasetsSection)  # type: ignore[valid-type]
    experiment: ExperimentSection = Field(default_factory=ExperimentSection)
    tuning: TuningSection = Field(default_factory=TuningSection)
    budget: BudgetSection = Field(default_factory=BudgetSection)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    pipeline: PipelineSection = Field(default_factory=PipelineSection)
    audit: AuditSection = Field(default_factory=AuditSection)

    def dataset(self, name: str) -> DatasetOptions:
        """The options of dataset ``name`` (ConfigError for an unknown name)."""
        get_spec(name)
        return getattr(self.datasets, name)


# ---------------------------------------------------------------------------------------------
# loading


def parse_params(data: Mapping[str, Any] | None, source: str = DEFAULT_PARAMS) -> Params:
    """Validate an already-parsed mapping, search spaces included
    (:func:`dpfair.sections.check_spaces`); ``source`` names it in error messages."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"invalid {source}: the top level must be a mapping of sections, "
            f"got {type(data).__name__}"
        )
    try:
        params = Params.model_validate(dict(data))
        check_spaces(params.experiment, params.tuning)
    except ValidationError as exc:
        body = format_validation_error(exc, Params)
        if "\n" in body:
            body = "\n  " + body.replace("\n", "\n  ")
        else:
            body = " " + body
        raise ConfigError(f"invalid {source}:{body}") from None
    except TuningError as exc:
        raise ConfigError(f"invalid {source}: {exc}") from None
    return params


def load_params(path: str | Path = DEFAULT_PARAMS) -> Params:
    """Read and validate params.yaml; any problem is one ``ConfigError``."""
    path = Path(path)
    if not path.is_file():
        where = path if path.is_absolute() else f"{path} (relative to {Path.cwd()})"
        raise ConfigError(f"parameters file not found: {where}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"invalid YAML in {path}{where}: {problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read parameters file {path}: {exc}") from None
    return parse_params(data, source=str(path))
