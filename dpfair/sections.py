"""The params.yaml sections of the pipeline: ``experiment``, ``tuning``, ``tracking``, ``pipeline``.

Each section reuses the model of the module that owns the fact (``TrainConfig``,
``MethodConfig``, ``ModelConfig``, ``TuningConfig``, ``TrackingConfig``): nothing is declared
twice. ``dpfair.config.Params`` composes them with the ``datasets`` section.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from dpfair.data.registry import get_spec
from dpfair.errors import format_validation_error
from dpfair.models import ModelConfig
from dpfair.privacy.methods import MethodConfig, NonPrivateConfig
from dpfair.training import TrainConfig
from dpfair.tuning.config import TuningConfig

_STRICT = ConfigDict(extra="forbid", frozen=True)


def _fields_except(model: type[BaseModel], *names: str) -> dict[str, Any]:
    return {k: (f.annotation, f) for k, f in model.model_fields.items() if k not in names}


TrainSettings = create_model(
    "TrainSettings",
    __config__=ConfigDict(extra="forbid", frozen=True),
    __doc__="``experiment.train``: TrainConfig without method, model and seed.",
    **_fields_except(TrainConfig, "method", "model", "seed"),
)


class ExperimentSection(BaseModel):
    """``experiment:`` what ``dpfair run`` trains: one dataset, one model, several methods,
    every method on every seed, plus the non-private reference on the same seeds."""

    model_config = _STRICT
    config_key_noun: ClassVar[str] = "key"

    dataset: str = "digits"
    model: ModelConfig = Field(default_factory=lambda: {"name": "mlp", "hidden": [64]})
    train: TrainSettings = Field(  # type: ignore[valid-type]
        default_factory=lambda: TrainSettings(
            epochs=20, batch_size=64, lr=0.5, sigma=1.0, delta=1e-5, progress=False
        )
    )
    methods: dict[str, MethodConfig] = Field(
        default_factory=lambda: {"dpsgd": {"name": "dpsgd"}},
        description="label -> method hyperparameters (the label is the name unless given)",
    )
    seeds: list[int] = Field(default_factory=lambda: [0, 1], min_length=1)
    pair: list[str] | None = Field(
        None, description="the two group names of the named gap (default: all groups)"
    )
    baseline: str = "dpsgd"

    @field_validator("methods", mode="before")
    @classmethod
    def _name_from_label(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {
                label: ({"name": label, **cfg} if isinstance(cfg, dict) else cfg)
                for label, cfg in value.items()
            }
        return value

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, name: str) -> str:
        get_spec(name)  # ConfigError with a did-you-mean
        return name

    @model_validator(mode="after")
    def _runs_are_valid(self) -> ExperimentSection:
        if "nonprivate" in self.methods:
            raise ValueError(
                "methods: 'nonprivate' is trained as the reference on every seed; remove it"
            )
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: duplicates in {self.seeds}")
        if self.pair is not None and len(self.pair) != 2:
            raise ValueError(f"pair: give exactly two group names (got {self.pair})")
        for label in self.methods:
            try:
                self.train_config(label, self.seeds[0])
            except ValidationError as exc:
                raise ValueError(format_validation_error(exc, TrainConfig, ("train",))) from None
        return self

    def train_config(self, label: str, seed: int, **overrides: Any) -> TrainConfig:
        """The TrainConfig of method ``label`` (``"nonprivate"``: the reference) on ``seed``."""
        method = NonPrivateConfig() if label == "nonprivate" else self.methods[label]
        settings = {**self.train.model_dump(), **overrides}
        return TrainConfig(method=method, model=self.model, seed=seed, **settings)


class TuningSection(BaseModel):
    """``tuning:`` TuningConfig's settings shared by all methods, and a search space per tuned
    method (methods without a space train with their fixed hyperparameters)."""

    model_config = _STRICT
    config_key_noun: ClassVar[str] = "key"

    spaces: dict[str, dict[str, list[Any]]] = Field(default_factory=dict)
    settings: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        if isinstance(data, dict) and "settings" not in data:
            data = dict(data)
            spaces = data.pop("spaces", {})
            return {"spaces": spaces, "settings": data}
        return data

    @model_validator(mode="after")
    def _check(self) -> TuningSection:
        for label, space in {"": {}, **self.spaces}.items():
            try:
                TuningConfig(**self.settings, space=space)
            except ValidationError as exc:
                prefix = ("spaces", label) if label else ()
                raise ValueError(format_validation_error(exc, TuningConfig, prefix)) from None
        return self

    def config(self, label: str, study_name: str) -> TuningConfig:
        return TuningConfig(
            **{"study_name": study_name, **self.settings}, space=self.spaces[label]
        )


class ScheduleSection(BaseModel):
    """When the Prefect deployment runs the experiment (``dpfair serve``)."""

    model_config = _STRICT

    name: str = "dpfair-scheduled"
    cron: str = "0 3 * * 1"
    timezone: str = "UTC"

    @field_validator("cron")
    @classmethod
    def _five_fields(cls, cron: str) -> str:
        if len(cron.split()) != 5:
            raise ValueError(f"a cron expression has 5 fields (got {cron!r})")
        return cron


class PipelineSection(BaseModel):
    """``pipeline:`` how the flow runs: task runner, where prepared data goes, schedule."""

    model_config = _STRICT

    task_runner: Literal["threads", "processes", "dask"] = "threads"
    max_workers: PositiveInt = 2
    dask_address: str | None = Field(None, description="None: a local Dask cluster")
    data_dir: str = "data/prepared"
    use_dvc: bool = Field(True, description="prepare data through `dvc repro` (else directly)")
    schedule: ScheduleSection = Field(default_factory=ScheduleSection)
