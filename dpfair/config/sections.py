"""The params.yaml sections of the pipeline: ``experiment``, ``tuning``, ``budget``, ``pipeline``.

Each section reuses the model of the module that owns the fact (``TrainConfig``,
``MethodConfig``, ``ModelConfig``, ``TuningConfig``, ``TrackingConfig``): nothing is declared
twice. ``dpfair.config.params.Params`` composes them with the ``datasets`` section.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    PrivateAttr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from dpfair.errors import TuningError, bools_as_numbers, did_you_mean, format_validation_error
from dpfair.fairness import rates
from dpfair.methods import MethodConfig, NonPrivateConfig
from dpfair.models import ModelConfig
from dpfair.models.config import MLPConfig
from dpfair.training import TrainConfig
from dpfair.tuning.config import PARAMS_STORAGE, TuningConfig
from dpfair.tuning.job import allowed_names, check_space_names, check_space_values

_STRICT = ConfigDict(extra="forbid", frozen=True)


def _fields_except(model: type[BaseModel], *names: str) -> dict[str, Any]:
    return {k: (f.annotation, f) for k, f in model.model_fields.items() if k not in names}


TrainSettings = create_model(
    "TrainSettings",
    __config__=ConfigDict(extra="forbid", frozen=True),
    __doc__="``experiment.train``: TrainConfig without method, model, seed and the rows of a "
    "privacy unit (the dataset's ``privacy_unit`` sets them).",
    **_fields_except(TrainConfig, "method", "model", "seed", "rows_per_unit"),
)


class ExperimentSection(BaseModel):
    """``experiment:`` what ``dpfair run`` trains: one dataset, one model, several methods,
    every method on every seed, plus the non-private reference on the same seeds."""

    model_config = _STRICT
    config_key_noun: ClassVar[str] = "key"
    #: rows of the dataset's privacy unit (:class:`dpfair.data.privacy_unit.PrivacyUnit`), set
    #: by ``Params`` from ``datasets.<dataset>.privacy_unit``
    _rows_per_unit: int = PrivateAttr(1)

    dataset: str = "digits"
    model: ModelConfig = Field(default_factory=lambda: MLPConfig(name="mlp", hidden=[64]))
    train: TrainSettings = Field(  # type: ignore[valid-type]
        default_factory=lambda: TrainSettings(
            epochs=20, batch_size=64, lr=0.5, sigma=1.0, delta=1e-5, progress="auto"
        )
    )
    methods: dict[str, MethodConfig] = Field(
        default_factory=lambda: {"dpsgd": {"name": "dpsgd"}},
        description="label -> method hyperparameters (the label is the name unless given)",
    )
    seeds: list[int] = Field(default_factory=lambda: [0, 1], min_length=1, max_length=1000)
    pair: list[str] | dict[str, list[str]] | None = Field(
        None, description="optional: two group names whose gap the results add (the papers' "
        "two-group columns), for experiment.dataset, or a mapping dataset -> two names (a "
        "dataset not in it has none); every group is shown either way"
    )
    baseline: str = "dpsgd"
    nonprivate_reference: bool = Field(
        True,
        description="train the non-private reference on every seed (the privacy cost π needs "
        "it); its test metrics are released without any DP guarantee (budget section)",
    )
    show: list[str] = Field(
        default_factory=list, description="fairness measures the terminal's results table "
        "shows per method with their privacy cost Δ (dp_diff, dp_ratio, eo_diff, eop_diff: "
        "dpfair.fairness.rates); results.md, MLflow and DVC's details hold all of them")

    @field_validator("show")
    @classmethod
    def _known_measures(cls, value: list[str]) -> list[str]:
        known = list(rates.SHORT.values())
        unknown = [v for v in value if v not in known]
        if unknown:
            raise ValueError(f"unknown fairness measure {unknown[0]!r}"
                             f"{did_you_mean(unknown[0], known)}; name some of "
                             f"{', '.join(known)}")
        return value

    @field_validator("methods", mode="before")
    @classmethod
    def _name_from_label(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {
                label: ({"name": label, **cfg} if isinstance(cfg, dict) else cfg)
                for label, cfg in value.items()
            }
        return value

    @field_validator("pair", mode="before")
    @classmethod
    def _names_as_text(cls, value: Any) -> Any:
        """Group names are text; ``[2, 8]`` (integer-coded groups) means ``["2", "8"]``."""
        def text(names: Any) -> Any:
            return [str(n) for n in names] if isinstance(names, list | tuple) else names

        if isinstance(value, dict):
            return {k: text(v) for k, v in value.items()}
        return text(value)

    @property
    def named_pair(self) -> list[str] | None:
        """The pair of ``dataset`` (None: no named pair)."""
        return self.pair.get(self.dataset) if isinstance(self.pair, dict) else self.pair

    @model_validator(mode="after")
    def _runs_are_valid(self) -> ExperimentSection:
        if "nonprivate" in self.methods:
            raise ValueError(
                "methods: 'nonprivate' is trained as the reference on every seed; remove it"
            )
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: duplicates in {self.seeds}")
        pairs = self.pair.items() if isinstance(self.pair, dict) else [("", self.pair)]
        for name, pair in pairs:
            if pair is not None and len(pair) != 2:
                raise ValueError(f"pair{'.' + name if name else ''}: give exactly two group "
                                 f"names (got {pair})")
        for label in self.methods:
            try:
                self.train_config(label, self.seeds[0])
            except ValidationError as exc:
                raise ValueError(format_validation_error(exc, TrainConfig, ("train",))) from None
        return self

    def train_config(self, label: str, seed: int, **overrides: Any) -> TrainConfig:
        """The TrainConfig of method ``label`` (``"nonprivate"``: the reference) on ``seed``."""
        method = NonPrivateConfig() if label == "nonprivate" else self.methods[label]
        settings = {**self.train.model_dump(), "rows_per_unit": self._rows_per_unit, **overrides}
        return TrainConfig(method=method, model=self.model, seed=seed, **settings)

    def for_unit(self, rows: int) -> ExperimentSection:
        """This section for a dataset whose privacy unit holds ``rows`` rows."""
        section = self.model_copy()
        section._rows_per_unit = rows
        return section


#: What a search releases: ``selected``, the selected
#: configuration and its outputs (the RepeatAndSelect bound covers exactly that), or
#: ``all_trials``, every trial's hyperparameters and score and K (then ε is the composition of
#: all K runs and their score releases).
ReleaseMode = Literal["selected", "all_trials"]


class TuningSection(BaseModel):
    """``tuning:`` TuningConfig's settings shared by all methods, a search space per tuned
    method (methods without a space train with their fixed hyperparameters), and ``release``:
    what a search publishes (:data:`ReleaseMode`)."""

    model_config = _STRICT
    config_key_noun: ClassVar[str] = "key"

    spaces: dict[str, dict[str, list[Any]]] = Field(default_factory=dict)
    release: ReleaseMode = "selected"
    settings: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        if isinstance(data, dict) and "settings" not in data:
            data = dict(data)
            spaces = data.pop("spaces", {})
            fixed = {"release": data.pop("release")} if "release" in data else {}
            return {"spaces": spaces, **fixed, "settings": data}
        return data

    @model_validator(mode="after")
    def _check(self) -> TuningSection:
        for label, space in {"": {}, **self.spaces}.items():
            if label and not space:
                raise ValueError(f"spaces.{label} is empty: a search needs at least one "
                                 "hyperparameter and its values (e.g. lr: [0.1, 0.5]); list "
                                 "them, or remove the space to train with fixed settings")
            try:
                cfg = TuningConfig(**self.settings, space=space)
            except ValidationError as exc:
                prefix = ("spaces", label) if label else ()
                raise ValueError(format_validation_error(exc, TuningConfig, prefix)) from None
            if found := bools_as_numbers(self.settings, cfg):
                raise ValueError(f"{', '.join(found)}: a boolean (true/false) where a number "
                                 "is expected; write the number")
        return self

    def config(self, label: str, study_name: str) -> TuningConfig:
        return TuningConfig(**{"study_name": study_name, "storage": PARAMS_STORAGE,
                                  **self.settings}, space=self.spaces[label])


def check_spaces(experiment: ExperimentSection, tuning: TuningSection) -> None:
    """Each ``tuning.spaces.<label>`` against what it tunes, before any data is loaded: the
    label is a method of ``experiment.methods`` (or the reference ``nonprivate``), every key a
    field of that method or of TrainConfig (did-you-mean), and every value one that the
    method's config and TrainConfig accept when set on ``experiment.train``
    (:func:`dpfair.tuning.job.check_space_values`). A ``TuningError`` names the key."""
    labels = ["nonprivate", *experiment.methods]
    for label, space in tuning.spaces.items():
        key = f"tuning.spaces.{label}"
        if label not in labels:
            raise TuningError(
                f"{key}: no method {label!r} in experiment.methods{did_you_mean(label, labels)} "
                f"(a space tunes one of: {', '.join(labels)}); rename the space or add the method"
            )
        base = experiment.train_config(label, experiment.seeds[0])
        check_space_names(space, allowed_names(base.method, base), base.method, key)
        check_space_values(space, base.method, base, key)


class BudgetSection(BaseModel):
    """``budget:`` the most a pipeline run may release.

    It covers every release of the run together: each method's search, each final model on
    each seed (all trained on the same data, so they compose) and any noisy statistic. The
    spend is planned and checked before anything trains (:mod:`dpfair.release.plan`). Releases
    without a DP guarantee (a heuristic method such as FairLens, the non-private reference)
    have no ε to count, so they are refused unless allowed here. Over time, every run's
    release is recorded per data source in ``ledger`` and held to ``lifetime_epsilon``
    (:mod:`dpfair.ledger`).
    """

    model_config = _STRICT

    epsilon: PositiveFloat | None = Field(
        None, description="the most ε the run may release (None: no limit; still reported)"
    )
    delta: float | None = Field(
        None, gt=0.0, lt=1.0, description="δ of every ε reported (None: experiment.train.delta)"
    )
    allow_large_delta: bool = Field(
        False,
        description="experts only: accept budget.delta >= 1/n_train (checked once the data is "
        "loaded; such a δ allows releasing training examples outright)",
    )
    calibrate_noise: bool = Field(
        False, description="budget-first planning: multiply every noise multiplier (training "
        "σ, count σ, score σ) by the one factor that makes the run total meet budget.epsilon "
        "(needs it); the plan shows the factor and each part's ε (dpfair.release.budget)"
    )
    keep_noise: list[str] = Field(
        default_factory=list, description="methods whose noise stays as configured when "
        "calibrate_noise is on (the others scale to meet the budget)"
    )
    test_epsilon: PositiveFloat | None = Field(
        None, allow_inf_nan=False, description="the most ε the run's noisy test metrics may "
        "release about the test split, all methods and seeds composed (None: no limit)"
    )
    allow_heuristic: bool = Field(
        False, description="run methods without a proven guarantee (released with no ε)"
    )
    allow_nonprivate_reference: bool = Field(
        False, description="release the non-private reference's test metrics (no guarantee)"
    )
    allow_unnoised_validation_scores: bool = Field(
        False, description="allow tuning.score_privacy: public_validation, which scores every "
        "trial on the validation rows without noise: those scores are released without any "
        "guarantee (the validation rows must be public data)"
    )
    allow_fitted_preprocessing: bool = Field(
        False, description="release models whose feature transform was fitted on the training "
        "rows (exact means, standard deviations, categories: not covered by ε); else declare "
        "numeric_ranges and categories of the dataset"
    )
    lifetime_epsilon: PositiveFloat | None = Field(
        None, description="the most ε all runs over time may release on one data source's "
        "people, composed (None: no limit, still recorded)"
    )
    ledger: str = Field(
        ".dpfair/ledger.sqlite", min_length=1,
        description="the privacy ledger of every release on the people of the data: a SQLite "
        "file (relative to the project root, also from DVC's temporary workspaces) or an "
        "SQLAlchemy URL of a database server shared by a team (e.g. "
        "postgresql+psycopg2://user@host/dpfair); it must outlive the runs: never delete it",
    )
    disjoint_from_previous: bool = Field(
        False, description="a data version not seen before holds only new people: it starts "
        "its own account in the ledger (set it for that run only)"
    )

    @model_validator(mode="after")
    def _calibration_needs_a_total(self) -> BudgetSection:
        if self.calibrate_noise and self.epsilon is None:
            raise ValueError("budget.calibrate_noise needs budget.epsilon, the total ε the "
                             "noise is calibrated to meet: set it, or turn calibrate_noise off")
        if self.keep_noise and not self.calibrate_noise:
            raise ValueError("budget.keep_noise applies only with budget.calibrate_noise: true")
        return self


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


class RegistrySection(BaseModel):
    """``pipeline.registry:`` which final model of a pipeline run becomes a version in MLflow's
    Model Registry (:func:`dpfair.pipeline.summary.register_model`)."""

    model_config = _STRICT

    enabled: bool = True
    name: str | None = Field(
        None, description="registered model name (None: <tracking.experiment_prefix>-<dataset>)")
    method: str | None = Field(
        None, description="the method label whose model is registered (None: the method with a "
        "proven guarantee and the best mean worst-group test accuracy, noise not replayable)")
    criterion: Literal["worst_group_accuracy", "accuracy", "largest_group_gap"] = Field(
        "worst_group_accuracy", description="a new version becomes @champion when at least as "
        "good on this test metric at no more ε (else `dpfair promote`)")


class PipelineSection(BaseModel):
    """``pipeline:`` how the flow runs: task runner, where prepared data goes, schedule, and
    which model it registers."""

    model_config = _STRICT

    task_runner: Literal["threads", "processes", "dask"] = "threads"
    max_workers: PositiveInt = Field(2, le=256)
    dask_address: str | None = Field(None, description="None: a local Dask cluster")
    data_dir: str = "data/prepared"
    use_dvc: bool = Field(True, description="prepare data through `dvc repro` (else directly)")
    schedule: ScheduleSection = Field(default_factory=ScheduleSection)
    registry: RegistrySection = Field(default_factory=RegistrySection)
