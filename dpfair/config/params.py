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

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WrapValidator,
    create_model,
    model_validator,
)

from dpfair.audit.config import AuditSection
from dpfair.config.sections import (
    BudgetSection,
    ExperimentSection,
    PipelineSection,
    TuningSection,
    check_spaces,
)
from dpfair.data.options import DatasetOptions
from dpfair.data.registry import get_spec, kind_spec, kinds, specs
from dpfair.errors import (  # ConfigError and format_validation_error re-exported
    ConfigError,
    TuningError,
    bools_as_numbers,
    did_you_mean,
    format_validation_error,
)
from dpfair.settings import DEFAULT_PARAMS, TrackingConfig  # DEFAULT_PARAMS re-exported
from dpfair.strict_yaml import safe_load_unique

# ---------------------------------------------------------------------------------------------
# sections


class Section(BaseModel):
    """Base of every params.yaml section: strict, unknown keys forbidden, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    config_key_noun: ClassVar[str] = "key"


@dataclass(frozen=True)
class _Undeclared:
    """A ``datasets:`` key that is neither built in nor declared with a ``kind``."""

    message: str


def _user_dataset(value: Any, handler: Any) -> Any:
    """The options model of the kind ``value`` declares (its errors keep their key paths)."""
    if isinstance(value, _Undeclared):
        raise ValueError(value.message)
    spec = kind_spec(value)  # a ConfigError (a ValueError) names the known kinds
    if spec is None:  # ``kind:`` given empty (null)
        raise ValueError(f"kind is empty; give one of: {' | '.join(kinds())}")
    return spec.options.model_validate(value)


#: a user's dataset name: a folder name under data/prepared (never '.', '..' or a path)
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_NAME_RULE = "a name has letters, digits, '_', '-' and '.', starting with a letter or digit"

# a user's dataset: the options of one kind, chosen by its ``kind:`` key
UserDataset = Annotated[Any, WrapValidator(_user_dataset)]


class _DatasetsBase(Section):
    """Built-in datasets are fields; any other key is a user's dataset declared by its kind."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    __pydantic_extra__: dict[str, UserDataset] = Field(init=False)  # type: ignore[assignment]

    @model_validator(mode="before")
    @classmethod
    def _declared(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        out = dict(data)
        builtin = list(cls.model_fields)
        for key, value in data.items():
            if key in cls.model_fields:
                continue
            if not _SAFE_NAME.fullmatch(str(key)):
                out[key] = _Undeclared(f"the dataset name {key!r} cannot name a folder of "
                                       f"prepared data; {_NAME_RULE}")
                continue
            if isinstance(value, Mapping) and "kind" in value:
                continue
            if key in specs():
                why = (f"dataset {key!r} was registered after dpfair.config.params was "
                       "imported, so params.yaml cannot set its options; declare it here with a "
                       f"kind ({' | '.join(kinds())}) instead, no Python registration needed")
            else:
                why = (f"unknown dataset {key!r}{did_you_mean(str(key), builtin)} (built in: "
                       f"{', '.join(builtin)}); to declare your own dataset give it a kind: "
                       f"{' | '.join(kinds())}")
            out[key] = _Undeclared(why)
        return out


def _datasets_section() -> type[Section]:
    """``datasets:``: one key per built-in dataset, each the options model of its loader, plus
    the user's datasets (``kind: table`` ...)."""
    fields: dict[str, Any] = {
        name: (spec.options, Field(default_factory=spec.options, description=spec.summary))
        for name, spec in specs().items()
    }
    section = create_model("DatasetsSection", __base__=_DatasetsBase, **fields)
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

    @model_validator(mode="after")
    def _unit_of_the_dataset(self) -> Params:
        """Every training of ``experiment.dataset`` is charged for its privacy unit's rows."""
        declared = (self.datasets.model_extra or {}).get(self.experiment.dataset)
        unit = getattr(declared, "privacy_unit", None)
        if unit is not None and unit.rows != 1:  # frozen: set once, while validating
            object.__setattr__(self, "experiment", self.experiment.for_unit(unit.rows))
        return self

    @model_validator(mode="after")
    def _processes_on_a_local_dask_cluster(self) -> Params:
        """A local Dask cluster's workers are daemonic processes, which may not start the
        processes of ``experiment.train.nproc > 1``."""
        if (self.experiment.train.nproc > 1 and self.pipeline.task_runner == "dask"
                and not self.pipeline.dask_address):
            raise ValueError(
                "experiment.train.nproc > 1 cannot run on pipeline.task_runner: dask's local "
                "cluster (its workers are daemonic processes, which may not start processes): "
                "set pipeline.task_runner: threads, or nproc: 1")
        return self

    def privacy_unit(self, name: str | None = None) -> tuple[str, int]:
        """The privacy unit of dataset ``name`` (default ``experiment.dataset``) in words, as
        every ε names it, and its rows."""
        options = self.dataset(name or self.experiment.dataset)
        unit = getattr(options, "privacy_unit", None)
        if unit is None:
            return "one row", 1
        return unit.describe(getattr(options, "id_column", None)), unit.rows

    def declared_datasets(self) -> list[str]:
        """The user's datasets declared in ``datasets:`` with a kind."""
        return list(self.datasets.model_extra or {})

    def dataset(self, name: str) -> DatasetOptions:
        """The options of dataset ``name``: declared in ``datasets:``, or a built-in's (a
        dataset registered in Python after this module was imported gets its defaults).
        A ConfigError for an unknown name."""
        declared = self.datasets.model_extra or {}
        if name in declared:
            return declared[name]
        if name in type(self.datasets).model_fields:
            return getattr(self.datasets, name)
        if name in specs():
            return get_spec(name).options()
        known = [*type(self.datasets).model_fields, *declared]
        if not _SAFE_NAME.fullmatch(name):
            raise ConfigError(f"{name!r} is no dataset name (available: {', '.join(known)}); "
                              f"{_NAME_RULE}")
        raise ConfigError(
            f"unknown dataset {name!r}{did_you_mean(name, known)} (available: "
            f"{', '.join(known)}); declare your own under datasets: with a kind "
            f"({' | '.join(kinds())}), e.g. datasets: {{{name}: {{kind: table, path: ..., "
            "target: ..., protected: [...]}}"
        )


# ---------------------------------------------------------------------------------------------
# loading


def _refuse_bools_as_numbers(data: Mapping[str, Any], params: Params, source: str) -> None:
    """pydantic reads ``true`` as 1 where a number is expected (``epochs: true`` would train one
    epoch): refuse that, naming the keys."""
    if found := bools_as_numbers(data, params):
        raise ConfigError(f"invalid {source}: {', '.join(found)}: a boolean (true/false) where "
                          "a number is expected; write the number")


def parse_params(data: Mapping[str, Any] | None, source: str = DEFAULT_PARAMS) -> Params:
    """Validate an already-parsed mapping, search spaces included
    (:func:`dpfair.config.sections.check_spaces`); ``source`` names it in error messages."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"invalid {source}: the top level must be a mapping of sections, "
            f"got {type(data).__name__}"
        )
    try:
        params = Params.model_validate(dict(data))
        _refuse_bools_as_numbers(data, params, source)
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
    try:
        params.dataset(params.experiment.dataset)
    except ConfigError as exc:
        raise ConfigError(f"invalid {source}: experiment.dataset: {exc}") from None
    return params


def load_params(path: str | Path = DEFAULT_PARAMS) -> Params:
    """Read and validate params.yaml; any problem is one ``ConfigError``."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"parameters file {path} is a folder: give the YAML file in it (e.g. "
                          f"{path / DEFAULT_PARAMS})")
    if not path.is_file():
        where = path if path.is_absolute() else f"{path} (relative to {Path.cwd()})"
        raise ConfigError(f"parameters file not found: {where}")
    try:
        data = safe_load_unique(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"invalid YAML in {path}{where}: {problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read parameters file {path}: {exc}") from None
    return parse_params(data, source=str(path))
