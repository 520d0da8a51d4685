"""How to search: :class:`TuningConfig` (the ``tuning:`` settings and one method's space).

Pure settings (pydantic only): ``dpfair.config.sections`` imports this module, so it must not
pull in optuna, mlflow or torch. Every bad value is an error here, before any training.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Literal, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    SkipValidation,
    field_validator,
    model_validator,
)

from dpfair.errors import TuningError
from dpfair.urls import STORAGE_SCHEMES, check_scheme, mask_url

__all__ = ["PARAMS_STORAGE", "Scalar", "ScoreConstraint", "ScoreName", "TuningConfig"]

#: The most training runs one search may plan (``mu``, ``n_runs``) and the most worker
#: processes one command starts: resource bounds, refused before any work.
MAX_RUNS = 1_000
MAX_WORKERS = 256

ScoreName = Literal["macro_accuracy", "worst_group_accuracy", "accuracy", "loss",
                    "demographic_parity_difference", "demographic_parity_ratio",
                    "equalized_odds_difference", "equal_opportunity_difference"]
#: the scores a search minimises (the others it maximises)
MINIMISED = frozenset({"loss", "demographic_parity_difference", "equalized_odds_difference",
                       "equal_opportunity_difference"})
ACCURACIES = ("macro_accuracy", "worst_group_accuracy", "accuracy")


class ScoreConstraint(BaseModel):
    """An accuracy score subject to a fairness measure: a run whose measure (from the same
    noisy validation table as its score) misses the bound scores ``score - 1``, below every
    run that meets it (:func:`dpfair.tuning.score.release_score`)."""

    model_config = ConfigDict(extra="forbid")

    measure: Literal["demographic_parity_difference", "demographic_parity_ratio",
                     "equalized_odds_difference", "equal_opportunity_difference"]
    at_least: float | None = Field(None, allow_inf_nan=False)
    at_most: float | None = Field(None, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_bound(self) -> ScoreConstraint:
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError("a constraint needs exactly one of at_least and at_most, e.g. "
                             "{measure: demographic_parity_ratio, at_least: 0.8}")
        return self

    def met(self, value: float) -> bool:
        """Whether ``value`` of :attr:`measure` meets the bound."""
        return (value >= self.at_least if self.at_least is not None
                else value <= self.at_most)  # type: ignore[operator]
#: A value a search space may list (its JSON form keys the planned events and the fingerprint).
Scalar: TypeAlias = str | int | float | bool | None


class TuningConfig(BaseModel):
    """How to search (modes, K and the score release: see :mod:`dpfair.tuning`). Every bad
    value is an error before any training.

    Randomness: ``seed`` fixes the data-independent public draws (which
    hyperparameters trial n gets, and its training seed, which fixes the initialisation), so
    they are the same on every worker and resume. K, the score noise and the runs' batches and
    noise come from OS entropy unless ``reproducible``; then from ``seed``, and the search is
    labelled :data:`dpfair.training.REPLAYABLE_NOISE`.
    """

    model_config = ConfigDict(extra="forbid")

    mode: Literal["tnb", "poisson", "binomial", "fixed", "grid"] = "tnb"
    eta: float = Field(0.0, description="TNB shape η > -1 (0 logarithmic, 1 geometric)")
    mu: float = Field(10.0, description=f"mean number of runs (tnb, poisson), 1 to {MAX_RUNS}")
    n_runs: PositiveInt | None = Field(
        None, le=MAX_RUNS,
        description="number of runs (mode fixed); the most runs, n of Binomial(n, p) (binomial)")
    p: float | None = Field(None, gt=0.0, le=1.0,
                            description="binomial: each of the n_runs runs happens with "
                            "probability p, so K ~ Binomial(n_runs, p)")
    # Items are checked by _check (one message naming the key), not by pydantic's union.
    space: dict[str, list[SkipValidation[Scalar]]] = Field(default_factory=dict)
    score: ScoreName = "macro_accuracy"
    constraint: ScoreConstraint | None = Field(
        None, description="an accuracy score subject to a fairness measure, e.g. {measure: "
        "demographic_parity_ratio, at_least: 0.8}")
    score_privacy: Literal["noisy", "public_validation"] = "noisy"
    sigma_score: PositiveFloat = Field(
        10.0,
        allow_inf_nan=False,
        description="noise std of the released validation counts (sensitivity 1)",
    )
    loss_clip: PositiveFloat = Field(
        10.0, allow_inf_nan=False, description="per-example loss clipped to [0, L]"
    )
    storage: str | None = None
    study_name: str | None = None
    seed: int = Field(
        0,
        ge=0,
        description="seeds the public draws: each trial's configuration and its "
        "training seed (initialisation); K and the score noise only when reproducible",
    )
    reproducible: bool = Field(
        False,
        description="draw K and the score noise from seed and train every run reproducibly "
        "(research, tests): the search can be replayed, so ε does not protect what it releases",
    )
    budget_epsilon: PositiveFloat | None = None
    delta: float | None = Field(None, gt=0.0, lt=1.0, description="None: the training delta")
    workers: PositiveInt = Field(1, le=MAX_WORKERS)
    heartbeat_interval: PositiveInt = Field(10, le=3600, description="seconds, at most an hour")
    grace_period: PositiveInt | None = Field(None, le=86400,
                                             description="None: 2 * heartbeat_interval")

    @field_validator("storage")
    @classmethod
    def _storage_scheme(cls, url: str | None) -> str | None:
        """A supported scheme whose client is installed, never a database in memory (the
        files are checked before the data loads: :func:`check_storage`)."""
        if url is not None and ("://" in url or url.startswith("journal:")):
            check_scheme(url, STORAGE_SCHEMES, "the storage")
        return url

    @model_validator(mode="after")
    def _check(self) -> TuningConfig:
        if not math.isfinite(self.eta) or self.eta <= -1:
            raise ValueError(f"eta must be a finite number > -1 (got {self.eta})")
        if not math.isfinite(self.mu) or not 1 <= self.mu <= MAX_RUNS:
            raise ValueError(f"mu (the mean number of runs) must be between 1 and {MAX_RUNS} "
                             f"(got {self.mu:g})")
        if self.mode in ("fixed", "binomial") and self.n_runs is None:
            raise ValueError(f"mode {self.mode!r} needs n_runs")
        if self.mode not in ("fixed", "binomial") and self.n_runs is not None:
            raise ValueError(f"n_runs is only used by modes 'fixed' and 'binomial' (mode is "
                             f"{self.mode!r})")
        if self.mode == "binomial" and self.p is None:
            raise ValueError("mode 'binomial' needs p (each of the n_runs runs happens with "
                             "probability p)")
        if self.mode != "binomial" and self.p is not None:
            raise ValueError(f"p is only used by mode 'binomial' (mode is {self.mode!r})")
        for name, values in self.space.items():
            if not values:
                raise ValueError(f"space.{name}: the list of values is empty")
            for v in values:
                if not isinstance(v, Scalar):
                    raise ValueError(
                        f"space.{name}: values must be numbers, strings, booleans or null "
                        f"(got {v!r})"
                    )
            if len({json.dumps(v) for v in values}) != len(values):
                raise ValueError(f"space.{name}: duplicate values in {values}")
        if self.constraint is not None and self.score not in ACCURACIES:
            raise ValueError(f"constraint applies to an accuracy score ({', '.join(ACCURACIES)})"
                             f"; score is {self.score!r}")
        if self.storage is not None and self.storage.startswith("journal:"):
            if not self.storage[len("journal:") :]:
                raise ValueError("storage 'journal:PATH' needs a path")
        return self

    @property
    def minimize(self) -> bool:
        """Whether the search minimises its score (a loss, a difference between groups)."""
        return self.score in MINIMISED

    @property
    def grace(self) -> int:
        """Seconds without a heartbeat after which a RUNNING trial is failed as stale."""
        return self.grace_period if self.grace_period is not None else 2 * self.heartbeat_interval

    @property
    def tuning_privacy(self) -> str:
        """What every result and ledger row says of the search's privacy (``none`` for grid)."""
        return "none" if self.mode == "grid" else self.mode


STORAGE_FORMS = "sqlite:///FILE, journal:PATH or postgresql://USER@HOST/DB"


#: The storage of a search run from the parameters file (CLI, pipeline): kept, resumable
#: (``TuningConfig.storage`` None, the Python API's default, keeps the study in memory).
PARAMS_STORAGE = "sqlite:///optuna.db"


def storage_file(url: str) -> Path | None:
    """The local file of a SQLite or journal storage URL (None for a database server)."""
    if url.startswith("journal:"):
        return Path(url[len("journal:"):]).absolute()
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return Path(url[len("sqlite:///"):]).absolute()
    return None


def check_storage(url: str) -> None:
    """Refuse, before any data is loaded, a storage whose local file cannot be created or
    written: the message names the file and the folder (the database's own error does not)."""
    if "://" not in url and not url.startswith("journal:"):
        raise TuningError(f"storage {mask_url(url)!r} is not a storage URL; give "
                          f"{STORAGE_FORMS}")
    try:
        check_scheme(url, STORAGE_SCHEMES, "storage")
    except ValueError as exc:
        raise TuningError(str(exc)) from None
    path = storage_file(url)
    if path is None:
        return
    folder = path.parent
    if not folder.is_dir():
        problem = "is a file, not a folder" if folder.exists() else "does not exist"
        raise TuningError(f"storage {url!r}: the folder {folder} {problem}; create it or "
                          f"give another path ({STORAGE_FORMS})")
    target = path if path.exists() else folder
    if path.is_dir():
        raise TuningError(f"storage {url!r}: {path} is a folder; give a file path")
    if not os.access(target, os.W_OK):
        raise TuningError(f"storage {url!r}: {target} is not writable; choose a writable path "
                          "or fix its permissions")
