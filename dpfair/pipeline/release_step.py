"""The pipeline's release step: what a run will release, with its ε, planned and checked
against the budget before anything trains (:func:`plan_release`; the privacy gate,
:mod:`dpfair.ledger.gate`, then reserves it), the noise calibrated to the budget
(:func:`calibrated_params`) and ``dpfair run``'s check in seconds (:func:`check_release`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import optuna

from dpfair import accounting
from dpfair.config.params import Params
from dpfair.data import GroupedDataset
from dpfair.errors import ConfigError, did_you_mean
from dpfair.pipeline.check_step import check_against_data
from dpfair.release.allowed import check_budget
from dpfair.release.budget import budget_first
from dpfair.release.plan import ReleasePlan, method_release, release_plan, search_release
from dpfair.training import make_plan, metrics_release
from dpfair.tuning import TuningConfig
from dpfair.tuning import prepare as prepare_search

#: The label of the non-private reference training.
REFERENCE = "nonprivate"


def plan_release(params: Params, dataset: GroupedDataset, studies: dict[str, str],
                 extra_runs: Mapping[tuple[str, int], int] | None = None) -> ReleasePlan:
    """Everything the run will release, with its ε, after every check that needs the data:
    the privacy gate (:mod:`dpfair.ledger.gate`) then checks it against ``params.budget``.

    A tuned method's search is prepared here (:func:`dpfair.tuning.prepare`, in study
    ``studies[label]``): its events, and K, drawn once and kept in the study, which
    :func:`tune_method` reopens. A final run's event is its :func:`~dpfair.training.make_plan`
    event; a tuned method's is the search's per-run bound (:mod:`dpfair.release.plan`). First,
    everything that needs the data is checked for every method (:mod:`dpfair.pipeline.check_step`),
    so no search opens a study while another method's settings are wrong.

    ``extra_runs[(label, seed)]``: trainings of that method and seed beyond the planned one (a
    resumed pipeline's earlier attempts that started and did not finish,
    :mod:`dpfair.pipeline.resume`): each may have released per-epoch metrics, so each is one
    more run event of the method.
    """
    check_against_data(params, dataset)
    untuned = [label for label in params.tuning.spaces if label not in studies]
    if untuned:
        raise ConfigError(f"tuning.spaces.{untuned[0]}: the pipeline tunes only the methods of "
                          "experiment.methods (dpfair tune --method tunes the others); remove "
                          "this space to run the pipeline")
    exp = params.experiment
    delta = params.budget.delta or exp.train.delta
    n_train, n_groups = len(dataset.train), dataset.n_groups
    labels = [*([REFERENCE] if exp.nonprivate_reference else []), *exp.methods]
    chosen = params.pipeline.registry.method
    if chosen is not None and chosen not in labels:
        raise ConfigError(f"pipeline.registry.method: {chosen!r} is not trained by this run"
                          f"{did_you_mean(chosen, labels)} (it trains: {', '.join(labels)}); "
                          "name one of them, or null to register the fairest private model")
    releases = []
    for label in labels:
        base = exp.train_config(label, exp.seeds[0])
        search = None
        if label in params.tuning.spaces:
            job = prepare_search(base.method, base, dataset,
                                 params.tuning.config(label, studies[label]))
            search = search_release(job.cfg, accounting.event_from_json(job.run_event_json),
                                    job.k, params.tuning.release)
            per_seed = [search.run_event] * len(exp.seeds)
        else:
            per_seed = [make_plan(exp.train_config(label, seed), n_train, n_groups).event
                        for seed in exp.seeds]
        # a tuned method's test release: its base configuration's (the ε of noisy test
        # metrics is calibrated per run, whatever the selected epochs)
        per_seed_test = [metrics_release(exp.train_config(label, seed), n_train,
                                         len(dataset.test)) for seed in exp.seeds]
        extra = [seed for seed in exp.seeds
                 for _ in range((extra_runs or {}).get((label, seed), 0))]
        events = [*per_seed, *(per_seed[exp.seeds.index(seed)] for seed in extra)]
        tests = [*per_seed_test, *(per_seed_test[exp.seeds.index(seed)] for seed in extra)]
        releases.append(method_release(label, base.method.privacy_guarantee, exp.seeds,
                                       events, search, base.reproducible, delta, tests))
    return release_plan(releases, delta)


#: explicit count noise multipliers of the methods (a count σ left to its default is already a
#: multiple of the training σ)
_COUNT_SIGMAS = ("sigma_count", "sigma1", "sigma2")


def calibrated_params(params: Params, dataset: GroupedDataset) -> Params:
    """``params`` trained at the noise that makes the run's total meet ``budget.epsilon`` when
    ``budget.calibrate_noise`` is on (else ``params``): ``experiment.train.sigma``, every
    method's explicit count σ and ``tuning.sigma_score`` multiplied by the factor of
    :func:`dpfair.release.budget.budget_first`. The factor is found on a plan whose searches
    are prepared in a throwaway storage (K is drawn only in the real study, later), for a
    fresh run: a resumed run keeps the noise of the run it resumes."""
    budget = params.budget
    if not budget.calibrate_noise:
        return params
    if params.experiment.train.sigma is None or budget.keep_noise or any(
            "sigma" in space for space in params.tuning.spaces.values()):
        raise ConfigError(
            "budget.calibrate_noise in a pipeline run scales experiment.train.sigma, which "
            "every method shares: give experiment.train.sigma (not target_epsilon), search no "
            "sigma in tuning.spaces and leave budget.keep_noise empty, or set the noise "
            "yourself with calibrate_noise: false")
    factor = budget_first(_scratch_plan(params, dataset), budget).noise_scale or 1.0
    data = params.model_dump(mode="json")
    data["experiment"]["train"]["sigma"] *= factor
    for method in data["experiment"]["methods"].values():
        for key in _COUNT_SIGMAS:
            if method.get(key) is not None:
                method[key] *= factor
    if params.tuning.spaces:
        score = params.tuning.settings.get("sigma_score", TuningConfig.model_fields[
            "sigma_score"].default)
        data["tuning"]["settings"]["sigma_score"] = score * factor
    data["budget"]["calibrate_noise"] = False  # the noise above is the calibrated one
    return type(params).model_validate(data)


def _scratch_plan(params: Params, dataset: GroupedDataset) -> ReleasePlan:
    """:func:`plan_release` on searches in memory, each under a name of its own (K: drawn by
    the real study; a SQLite file would first create Optuna's schema, a second or more)."""
    scratch, verbosity = params.model_copy(deep=True), optuna.logging.get_verbosity()
    token, scratch.tuning.settings["storage"] = uuid.uuid4().hex, None
    studies = {m: f"scratch-{m}-{token}" for m in params.experiment.methods
               if m in params.tuning.spaces}
    try:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return plan_release(scratch, dataset, studies)
    finally:
        optuna.logging.set_verbosity(verbosity)


def check_release(params: Params, dataset: GroupedDataset) -> None:
    """``dpfair run``'s :func:`~dpfair.release.allowed.check_budget` on a :func:`_scratch_plan`, in
    seconds; the gate checks the real plan again (alone with ``all_trials``: K matters)."""
    if not (params.tuning.spaces and params.tuning.release == "all_trials"):
        checked = calibrated_params(params, dataset)
        check_budget(_scratch_plan(checked, dataset), checked.budget)
