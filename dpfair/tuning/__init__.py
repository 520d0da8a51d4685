"""DP hyperparameter optimisation on Optuna, with the search itself accounted.

Modes (``TuningConfig.mode``; K, the number of runs, is drawn once per study from OS entropy,
or from the seed with ``reproducible``, :mod:`~dpfair.tuning.k_draw`):

* ``tnb`` (default): K ~ truncated negative binomial TNB(η, γ) with mean μ (Papernot &
  Steinke, ICLR 2022, Theorem 2). Privacy: ``RepeatAndSelectDpEvent(run ∘ score, μ, η)``.
* ``poisson``: K ~ Poisson(μ) (Theorem 6); K may be 0: the search then returns no config.
* ``binomial``: K ~ Binomial(n_runs, p) (Koskela, Redberg & Wang, ICML 2024): at most n_runs
  runs, more concentrated than Poisson; accounted by the privacy-profile bound; K may be 0.
* ``fixed``: K = ``n_runs``; privacy by n-fold composition ``SelfComposed(run ∘ score, n)``.
* ``grid``: every point of the grid once; **no accounting**: the result, every ledger row and
  the study carry ``tuning_privacy: "none"`` and the search's epsilon is ``inf``.

A search is :func:`prepare` (validate, predict every configuration's run event and account
the search before any training: :mod:`~dpfair.tuning.search_events`; check the budget; create or
reopen the study: :mod:`~dpfair.tuning.study`), the workers (:mod:`~dpfair.tuning.worker`:
each run trains one random configuration and releases a noisy validation score,
:mod:`~dpfair.tuning.score`), then :func:`finish` (select the best run). :func:`tune` does all
three; calling it again resumes the study. The study's trials are the privacy ledger
(:mod:`~dpfair.tuning.trial_records`).

Importing this package loads only the settings (:class:`TuningConfig`) and the errors; the
rest (which needs optuna and dp_accounting) is imported on first use of its name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpfair.errors import BudgetExceededError, TuningError
from dpfair.lazy import lazy_getattr
from dpfair.tuning.config import Scalar, ScoreName, TuningConfig

__all__ = [
    "BudgetExceededError",
    "TrialRow",
    "Scalar",
    "ScoreName",
    "TuningConfig",
    "TuningError",
    "TuningJob",
    "TuningResult",
    "allowed_names",
    "draw_k",
    "finish",
    "make_config",
    "make_storage",
    "planned_run_event",
    "prepare",
    "release_score",
    "result_event",
    "run_worker",
    "sample_tnb",
    "search_event",
    "tune",
    "write_spec",
]

if TYPE_CHECKING:
    from dpfair.tuning.job import TuningJob, TuningResult, allowed_names, make_config
    from dpfair.tuning.k_draw import draw_k, sample_tnb
    from dpfair.tuning.score import release_score
    from dpfair.tuning.search import finish, prepare, tune
    from dpfair.tuning.search_events import planned_run_event, result_event, search_event
    from dpfair.tuning.study import make_storage
    from dpfair.tuning.trial_records import TrialRow
    from dpfair.tuning.worker import run_worker, write_spec

_LAZY = {
    "TrialRow": "trial_records",
    "TuningJob": "job",
    "TuningResult": "job",
    "allowed_names": "job",
    "draw_k": "k_draw",
    "finish": "search",
    "make_config": "job",
    "make_storage": "study",
    "planned_run_event": "search_events",
    "prepare": "search",
    "release_score": "score",
    "result_event": "search_events",
    "run_worker": "worker",
    "sample_tnb": "k_draw",
    "search_event": "search_events",
    "tune": "search",
    "write_spec": "worker",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
