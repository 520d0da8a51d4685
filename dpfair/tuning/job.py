"""A prepared search as data: :class:`TuningJob` (what a worker needs), :class:`TuningResult`,
and how one run's config is made from the base configs and a point of the space.

A job is pickled into the SPEC file of worker processes, so ``train_fn``, ``event_fn`` and
``on_trial`` are module-level functions or strings ``"module:function"`` /
``"/path/file.py:function"`` (:func:`resolve`). The fingerprint (settings and events of the
search, as JSON) is stored in the study and must match when a study is resumed.

A run's training seed (:func:`seed_of_run`) is public randomness: it fixes the
initialisation, is the same on every worker and resume, and is logged; the run's batches and
noise are drawn from it only in a ``reproducible`` search (:func:`make_config`).
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import json
import math
import sys
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError

from dpfair.errors import TuningError, bools_as_numbers, did_you_mean
from dpfair.tuning.config import Scalar, TuningConfig

if TYPE_CHECKING:
    from dpfair.tuning.protocols import (
        DatasetLike,
        EventFn,
        MethodSpec,
        OnTrial,
        RunConfig,
        RunOutcome,
        TrainFn,
    )
    from dpfair.tuning.trial_records import TrialRow

__all__ = [
    "SEED_STREAM",
    "TuningJob",
    "TuningResult",
    "allowed_names",
    "check_space_names",
    "check_space_values",
    "config_json",
    "dump",
    "fingerprint",
    "grid_points",
    "make_config",
    "params_key",
    "resolve",
    "seed_of_run",
]

SEED_STREAM = 83  # "S": the SeedSequence stream of a run's training seed
_NOT_TUNABLE = frozenset(
    {"method", "model", "seed", "delta", "allow_large_delta", "name", "reproducible"}
)

F = TypeVar("F", bound=Callable[..., object])


@dataclass
class TuningJob:
    """Everything a worker needs (pickled into the SPEC file for worker processes)."""

    method_cfg: MethodSpec
    train_cfg_base: RunConfig
    dataset: DatasetLike
    cfg: TuningConfig
    train_fn: TrainFn | str | None
    event_fn: EventFn | str | None
    on_trial: OnTrial | str | None
    allowed: list[str] | None
    study_name: str
    storage_desc: str
    k: int = 0
    run_event_json: str | None = None
    planned: dict[str, str] = field(default_factory=dict)  # params json -> event json
    search_event_json: str | None = None
    epsilon_training: float = math.inf
    epsilon_search: float = math.inf
    delta: float = 1e-6


@dataclass
class TuningResult:
    """Outcome of a search. ``trials`` is the ledger (one row per trial, runs and excess)."""

    best_config: RunConfig | None
    best_params: dict[str, Scalar] | None
    best_score: float | None
    best_trial: int | None
    K: int
    n_runs: int
    trials: list[TrialRow]
    epsilon_training: float
    epsilon_search: float
    delta: float
    event_json: str | None
    run_event_json: str | None
    tuning_privacy: str
    score_privacy: str
    score: str
    study_name: str
    storage: str
    privacy_guarantee: str | None = None  # "heuristic" if any run reported so (fairlens)
    best_result: RunOutcome | None = field(default=None, repr=False)
    #: K, the scores and the runs' noise were drawn from the tuning seed: label the search's
    #: outputs :data:`dpfair.training.REPLAYABLE_NOISE`.
    reproducible: bool = False


def _fields(obj: MethodSpec | RunConfig) -> list[str]:
    if isinstance(obj, BaseModel):
        return list(type(obj).model_fields)
    if isinstance(obj, Mapping):
        return list(obj)
    raise TuningError(f"expected a pydantic model or a mapping, got {type(obj).__name__}")


def dump(obj: MethodSpec | RunConfig) -> dict[str, object]:
    """A config's fields as a dict (pydantic ``model_dump`` or a copy of the mapping)."""
    return obj.model_dump() if isinstance(obj, BaseModel) else dict(obj)


def allowed_names(method_cfg: MethodSpec, train_cfg_base: RunConfig) -> list[str]:
    """Hyperparameters a space may name: the method's fields, then the training config's
    (excluding method, model, seed, delta, name, reproducible)."""
    names = [n for n in _fields(method_cfg) if n not in _NOT_TUNABLE]
    names += [n for n in _fields(train_cfg_base) if n not in _NOT_TUNABLE and n not in names]
    return names


def check_space_names(
    space: Mapping[str, object], names: list[str], method_cfg: MethodSpec, key: str = "space"
) -> None:
    """Refuse (``TuningError``) a space key that is not in ``names`` (:func:`allowed_names`),
    naming it under ``key`` with a did-you-mean hint and the allowed names."""
    for name in space:
        if name not in names:
            method_name = dump(method_cfg).get("name", "?")
            raise TuningError(
                f"{key}.{name}: {name!r} is not a hyperparameter of method {method_name!r} or "
                f"of training{_hint(name, names)} (allowed: {', '.join(names)})"
            )


def _hint(name: str, names: list[str]) -> str:
    """:func:`did_you_mean`, else the name abbreviated by its words' initials
    (``learning_rate`` -> ``lr``)."""
    initials = "".join(word[:1] for word in name.lower().split("_"))
    close = [n for n in names if len(n) > 1 and n.lower() == initials]
    return did_you_mean(name, names) or (f"; did you mean {close[0]!r}?" if close else "")


def check_space_values(
    space: Mapping[str, list[Scalar]],
    method_cfg: MethodSpec,
    train_cfg_base: RunConfig,
    key: str = "space",
) -> None:
    """Refuse (``TuningError``) a value the method's or training config's own validation
    rejects, each value set alone on the base configs (:func:`make_config`), naming
    ``key.<name>`` and the value; the data-dependent rules are :func:`make_plan`'s."""
    for name, values in space.items():
        for value in values:
            try:
                made = make_config(method_cfg, train_cfg_base, {name: value}, seed=0,
                                   reproducible=False)
                if bools_as_numbers({name: value}, _values(made)):
                    raise TuningError(f"{key}.{name}: the value {value!r} is a boolean where a "
                                      "number is expected; list numbers only")
            except ValidationError as exc:
                reasons = "; ".join(
                    str(e["msg"]).removeprefix("Value error, ")
                    for e in exc.errors(include_url=False)
                )
                raise TuningError(
                    f"{key}.{name}: the value {value!r} is invalid ({reasons}); list only "
                    f"values that {name} accepts"
                ) from None


def _values(config: RunConfig) -> dict[str, object]:
    """A run config's values with its method's on top (where :func:`make_config` sets them)."""
    values = dump(config)
    method = values.get("method")
    return {**values, **(dump(method) if isinstance(method, BaseModel | Mapping) else {})}


def make_config(
    method_cfg: MethodSpec,
    train_cfg_base: RunConfig,
    params: Mapping[str, Scalar],
    seed: int,
    *,
    reproducible: bool,
) -> RunConfig:
    """The run config: ``params`` set on the method (its fields) or the training config, the
    method placed in it, ``seed`` set, and ``reproducible`` (the search's: a reproducible search
    trains reproducibly, a default one with secret noise) set where the training config has
    that field (a :class:`~dpfair.training.TrainConfig` does); pydantic configs are
    re-validated."""
    method_fields = set(_fields(method_cfg))
    method = dump(method_cfg)
    train = dump(train_cfg_base)
    for k, v in params.items():
        if k in method_fields:
            method[k] = v
        else:
            train[k] = v
    train["method"] = method
    if "seed" in _fields(train_cfg_base) or isinstance(train_cfg_base, Mapping):
        train["seed"] = seed
    if "reproducible" in _fields(train_cfg_base):
        train["reproducible"] = reproducible
    if isinstance(train_cfg_base, BaseModel):
        return type(train_cfg_base).model_validate(train)
    return train


def grid_points(space: Mapping[str, list[Scalar]]) -> list[dict[str, Scalar]]:
    """Every point of ``space``, keys sorted (one empty point for an empty space)."""
    names = sorted(space)
    return [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(space[k] for k in names))
    ]


def config_json(config: RunConfig) -> str:
    """A run config as the JSON stored in its trial (``dpfair.config``)."""
    data = config.model_dump(mode="json") if isinstance(config, BaseModel) else config
    return json.dumps(data, sort_keys=True, default=str)


def params_key(params: Mapping[str, Scalar]) -> str:
    """The key of a point of the space in :attr:`TuningJob.planned`."""
    return json.dumps(dict(sorted(params.items())), sort_keys=True)


def seed_of_run(seed: int, number: int) -> int:
    """The training seed of trial ``number``: ``SeedSequence([seed, 83, number])``, so it does
    not depend on which worker ran the trial (public: see the module doc)."""
    return int(np.random.SeedSequence([seed, SEED_STREAM, number]).generate_state(1)[0] >> 1)


def resolve(fn: F | str) -> F:
    """``fn`` itself, or the function named by ``"module:function"`` /
    ``"/path/file.py:function"`` (a file is loaded once per process)."""
    if not isinstance(fn, str):
        return fn
    target, _, attr_name = fn.rpartition(":")
    if not target or not attr_name:
        raise TuningError(f"expected 'module:function' or '/path/file.py:function', got {fn!r}")
    if target.endswith(".py"):
        name = f"_dpfair_tuning_{zlib.crc32(target.encode()):08x}"
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, target)
            if spec is None or spec.loader is None:
                raise TuningError(f"cannot load {target}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, attr_name)


def fingerprint(job: TuningJob) -> str:
    """The settings and events of the search as JSON (stored as ``dpfair.fingerprint``: a
    study is resumed only with the same).

    A default (secret-randomness) search adds ``"secret_randomness": true``; a reproducible
    one adds nothing, so it has the fingerprint every study written before that option had
    (they all drew K and the scores from the seed) and resumes them unchanged, while a secret
    search refuses a study whose K is replayable and a reproducible one a secret study.
    """
    c = job.cfg
    secret = {} if c.reproducible else {"secret_randomness": True}
    return json.dumps(
        {
            **secret,
            "mode": c.mode,
            "eta": c.eta,
            "mu": c.mu,
            "n_runs": c.n_runs,
            "space": c.space,
            "score": c.score,
            "score_privacy": c.score_privacy,
            "sigma_score": c.sigma_score,
            "loss_clip": c.loss_clip,
            "seed": c.seed,
            "search_event": job.search_event_json,
            "run_event": job.run_event_json,
        },
        sort_keys=True,
        default=str,
    )
