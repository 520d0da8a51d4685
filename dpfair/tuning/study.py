"""The Optuna study of a search: its storage, its samplers, creating it and reopening it.

Storage (``TuningConfig.storage``): None → in memory, in this process only (one worker; the
study is not kept: ``tune()`` writes no file the caller did not name; the parameters file's
default, :data:`~dpfair.tuning.config.PARAMS_STORAGE`, is the SQLite file ``optuna.db`` in the
project root); ``"sqlite:///FILE"`` → that file (a relative path in the project root:
:func:`dpfair.workspace.project_root`, also from a DVC temporary workspace; one process);
``"journal:PATH"`` → ``JournalStorage(JournalFileBackend(PATH))`` for several processes on
one machine; ``"postgresql://..."`` (or any SQLAlchemy URL) → ``RDBStorage`` for several
machines (run ``tune`` with the same URL and study name on each machine). RDB storages get
Optuna's heartbeat (``heartbeat_interval``, ``grace_period``).

Samplers. Each run draws every hyperparameter uniformly, with replacement, from its
categorical list (a ``RandomSampler`` over ``CategoricalDistribution``). The sampler of worker
i is created with seed ``seed + i`` but every draw of trial number n is reseeded from
``SeedSequence([seed, 67, n, crc32(name)])``: draws are i.i.d. across trials, reproducible, and
do not depend on which worker (or resumed session, or machine) ran the trial. (A sampler
seeded only by the worker index would repeat the same configuration stream after every resume
and on every machine.) Mode ``grid`` uses ``GridSampler``: trial number n evaluates grid point
n, so several workers never duplicate a point.

The study's user attrs hold K (``dpfair.K``), drawn once when the study is created (from OS
entropy unless ``reproducible``: :mod:`~dpfair.tuning.k_draw`), and the search's
fingerprint, epsilons, delta, event and privacy labels. They are the private working state.
The configuration draws above (which configuration trial n gets, the grid's order) are
data-independent, but the selected configuration would bound K from below if anyone could
replay them: they are seeded by the study's :data:`CONFIG_SEED`, drawn from OS entropy when
the study is created and kept with K in the private working state (``seed`` itself only when
``reproducible``), so that workers and resumes agree and nothing logged replays them.
"""

from __future__ import annotations

import math
import os
import secrets
import time
import uuid
import warnings
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution

from dpfair.errors import TuningError
from dpfair.tuning.config import check_storage
from dpfair.tuning.job import TuningJob, fingerprint
from dpfair.tuning.k_draw import draw_k
from dpfair.urls import mask_url
from dpfair.workspace import durable_sqlite_uri, open_racing

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial, TrialState

    from dpfair.tuning.config import Scalar, TuningConfig

__all__ = [
    "CONFIG_SEED",
    "CONFIG_STREAM",
    "IN_MEMORY",
    "GridSampler",
    "TrialSeededRandomSampler",
    "distributions",
    "load_study",
    "make_storage",
    "open_study",
    "sampler_for",
    "study_identity",
    "search_space",
]

CONFIG_STREAM = 67  # "C": the SeedSequence stream of the configuration draws
#: the study's user attr holding the seed of its configuration draws (module doc)
CONFIG_SEED = "dpfair.config_seed"
#: the study's user attr holding a random id drawn when it is created (:func:`study_identity`)
STUDY_UID = "dpfair.study_uid"
IN_MEMORY = "in memory (not kept: give storage= to keep or resume the study)"
_IN_MEMORY: dict[str, optuna.storages.InMemoryStorage] = {}


def make_storage(cfg: TuningConfig) -> tuple[optuna.storages.BaseStorage, str]:
    """The Optuna storage of ``cfg.storage`` and a printable description of it (its password
    masked: :func:`dpfair.urls.mask_url`; None: one in-memory storage per study name in this
    process, shared by its prepare and finish)."""
    if cfg.storage is None:
        return _IN_MEMORY.setdefault(cfg.study_name or "", optuna.storages.InMemoryStorage()), (
            IN_MEMORY)
    url = durable_sqlite_uri(cfg.storage)
    check_storage(url)
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        path = os.path.abspath(url[len("journal:") :])
        return optuna.storages.JournalStorage(JournalFileBackend(path)), f"journal:{path}"
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None

    def open_storage() -> optuna.storages.RDBStorage:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs,
                                              heartbeat_interval=cfg.heartbeat_interval,
                                              grace_period=cfg.grace)

    # the first use of a fresh database creates Optuna's schema: processes started together
    # race on it, and the loser opens the schema the winner made
    return open_racing(open_storage, url), mask_url(url)


class TrialSeededRandomSampler(optuna.samplers.RandomSampler):
    """RandomSampler whose draw for trial n and parameter p is seeded by (seed, n, crc32(p)):
    uniform with replacement, i.i.d. across trials whatever the worker."""

    def __init__(self, seed: int, worker_index: int) -> None:
        super().__init__(seed=(seed + worker_index) % 2**32)  # numpy's seed range
        self._base_seed = seed

    def sample_independent(  # noqa: D102
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: optuna.distributions.BaseDistribution,
    ) -> object:
        if not isinstance(param_distribution, CategoricalDistribution):
            return super().sample_independent(study, trial, param_name, param_distribution)
        ss = np.random.SeedSequence(
            [self._base_seed, CONFIG_STREAM, trial.number, zlib.crc32(param_name.encode())]
        )
        rng = np.random.default_rng(ss)
        return param_distribution.choices[int(rng.integers(len(param_distribution.choices)))]


class GridSampler(optuna.samplers.GridSampler):
    """GridSampler (trial number n < grid size evaluates grid point n) that never calls
    ``study.stop()`` (we drive ask/tell ourselves and stop at K)."""

    def after_trial(  # noqa: D102
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        return None


def search_space(cfg: TuningConfig) -> dict[str, list[Scalar]]:
    """The space trials are asked over: a grid search of an empty space has one point."""
    return cfg.space if cfg.space or cfg.mode != "grid" else {"_": [None]}


def distributions(space: Mapping[str, list[Scalar]]) -> dict[str, CategoricalDistribution]:
    """One categorical distribution per hyperparameter of ``space``."""
    return {k: CategoricalDistribution(list(v)) for k, v in space.items()}


def sampler_for(cfg: TuningConfig, worker_index: int, study: optuna.Study
                ) -> optuna.samplers.BaseSampler:
    """The sampler of worker ``worker_index`` for ``study``, seeded with the study's
    :data:`CONFIG_SEED` (see the module doc; a study created before it existed: ``cfg.seed``)."""
    seed = int(study.user_attrs.get(CONFIG_SEED, cfg.seed))
    if cfg.mode == "grid":
        return GridSampler(search_space(cfg), seed=seed % 2**32)  # numpy's seed range
    return TrialSeededRandomSampler(seed, worker_index)


def load_study(job: TuningJob, sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    """The job's existing study, opened with ``sampler`` (None: a RandomSampler, for reading)."""
    storage, _ = make_storage(job.cfg)
    if sampler is None:
        sampler = optuna.samplers.RandomSampler()
    return optuna.load_study(study_name=job.study_name, storage=storage, sampler=sampler)


def study_identity(job: TuningJob) -> str:
    """The identity of the job's study: its storage (password hidden), name and the id drawn
    when it was created, so that a study deleted and created again under the same name, or
    the same name in another storage, is another search (what the privacy ledger records)."""
    study = load_study(job)
    uid = study.user_attrs.get(STUDY_UID) or f"study-id-{study._study_id}"
    return f"{job.storage_desc}::{job.study_name}::{uid}"  # storage_desc: password masked


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else repr(x)


def open_study(job: TuningJob, storage: optuna.storages.BaseStorage, n_grid: int) -> int:
    """Create the job's study in ``storage`` and draw K, or reopen it and read K back (after
    checking the fingerprint); returns K. ``n_grid``: the number of points of the space.

    Creating a study is atomic in every storage, and only its creator draws K and writes the
    attrs (K last): a secret K differs between processes, so one that finds the study just
    created by another (``tune`` started on several machines at once) waits up to ``grace``
    seconds for that K instead of writing its own.
    """
    cfg = job.cfg
    direction = "minimize" if cfg.minimize else "maximize"
    try:
        study = optuna.create_study(storage=storage, study_name=job.study_name, direction=direction)
    except optuna.exceptions.DuplicatedStudyError:
        return _read_k(job, storage)
    study.set_user_attr("dpfair.fingerprint", fingerprint(job))
    study.set_user_attr("dpfair.tuning_privacy", cfg.tuning_privacy)
    study.set_user_attr("dpfair.score_privacy", cfg.score_privacy)
    study.set_user_attr("dpfair.epsilon_search", _json_float(job.epsilon_search))
    study.set_user_attr("dpfair.epsilon_training", _json_float(job.epsilon_training))
    study.set_user_attr("dpfair.delta", job.delta)
    study.set_user_attr("dpfair.event", job.search_event_json)
    study.set_user_attr(CONFIG_SEED, cfg.seed if cfg.reproducible else secrets.randbits(63))
    study.set_user_attr(STUDY_UID, uuid.uuid4().hex)
    k = draw_k(cfg, n_grid)
    study.set_user_attr("dpfair.K", k)
    return k


def _read_k(job: TuningJob, storage: optuna.storages.BaseStorage) -> int:
    """K of the existing study, once its creator has written it (see :func:`open_study`)."""
    study_id = storage.get_study_id_from_name(job.study_name)
    deadline = time.monotonic() + job.cfg.grace
    while "dpfair.K" not in (attrs := storage.get_study_user_attrs(study_id)):
        if time.monotonic() > deadline:
            raise TuningError(
                f"study {job.study_name!r} in {job.storage_desc} exists but holds no K (not "
                "created by dpfair, or its creation was interrupted); delete it or use a new "
                "study_name. Nothing was run."
            )
        time.sleep(0.1)
    if attrs.get("dpfair.fingerprint") != fingerprint(job):
        raise TuningError(
            f"study {job.study_name!r} in {job.storage_desc} was created with other tuning "
            "settings (reproducible included) or another run event; resume it with the same "
            "settings or use a new study_name"
        )
    return int(attrs["dpfair.K"])
