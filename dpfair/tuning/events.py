"""The privacy events of a search: one run's, its combination over a space, the whole search's.

* ``search_event``: ``tnb`` → ``RepeatAndSelectDpEvent(run ∘ score, μ, η)`` (Papernot &
  Steinke, ICLR 2022, Theorem 2); ``poisson`` → the same with ``shape = inf``, as dp_accounting
  encodes Theorem 6; ``fixed`` → ``SelfComposed(run ∘ score, n)``; ``grid`` → None (no
  guarantee). With ``score_privacy: noisy`` the score release (one Gaussian query of
  sensitivity 1, see :mod:`dpfair.tuning.score`) is composed into the run event.
* ``combine_run_events``: a run's training event is predicted for every configuration of the
  space before training. If all give one event it is used as is; otherwise the per-run event
  is ``MaxOfDpEvent`` of the non-dominated distinct events (a run with a random configuration
  is a mixture, bounded by the pointwise maximum RDP because Rényi divergence is jointly
  quasi-convex).
* ``planned_run_event`` predicts a ``dpfair.training.train`` run's event; ``result_event``
  reads the event a finished run reports (it must equal the planned one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from dp_accounting import dp_event

from dpfair.privacy import accounting
from dpfair.tuning.config import TuningConfig

if TYPE_CHECKING:
    from dpfair.data.dataset import GroupedDataset
    from dpfair.training import TrainConfig
    from dpfair.tuning.protocols import RunOutcome

__all__ = ["combine_run_events", "planned_run_event", "result_event", "search_event"]


def search_event(cfg: TuningConfig, run: dp_event.DpEvent | None) -> dp_event.DpEvent | None:
    """The event of the whole search given the per-run training event (None: no guarantee)."""
    if run is None or cfg.mode == "grid":
        return None
    per_run = run
    if cfg.score_privacy == "noisy":
        per_run = dp_event.ComposedDpEvent([run, accounting.score_release_event(cfg.sigma_score)])
    if cfg.mode == "fixed":
        return dp_event.SelfComposedDpEvent(per_run, int(cfg.n_runs or 0))
    shape = math.inf if cfg.mode == "poisson" else float(cfg.eta)
    return dp_event.RepeatAndSelectDpEvent(per_run, float(cfg.mu), shape)


def planned_run_event(config: TrainConfig, dataset: GroupedDataset) -> dp_event.DpEvent | None:
    """The training event of ``dpfair.training.train(config, dataset)``, before training.

    q = batch_size / n_train, T = steps or epochs·ceil(n/B), σ given or calibrated to
    ``target_epsilon``, σ_count from the method (:func:`dpfair.privacy.methods.build_method`).
    ``nonprivate`` → None.
    """
    from dpfair.privacy.methods import build_method

    if config.method.name == "nonprivate":
        return None
    n = len(dataset.train)
    batch = config.batch_size
    q = batch / n
    steps = config.steps if config.steps is not None else config.epochs * math.ceil(n / batch)

    def count_sigma(s: float) -> float | None:
        method = build_method(
            config.method, n_groups=dataset.n_groups, sigma=s, expected_batch_size=float(batch)
        )
        return method.count_sigma

    sigma = config.sigma
    if sigma is None:
        ratio = count_sigma(1.0)
        sigma = _calibrate(config.target_epsilon, q, steps, config.delta, ratio)
    return accounting.run_event(q, sigma, steps, count_sigma(sigma))


_CALIBRATION_CACHE: dict[tuple[float, float, int, float, float | None], float] = {}


def _calibrate(target: float, q: float, steps: int, delta: float, ratio: float | None) -> float:
    key = (target, q, steps, delta, ratio)
    if key not in _CALIBRATION_CACHE:
        _CALIBRATION_CACHE[key] = accounting.noise_for_epsilon(target, q, steps, delta, ratio)
    return _CALIBRATION_CACHE[key]


def result_event(result: RunOutcome) -> dp_event.DpEvent | None:
    """The training event a finished run reports: ``result.event`` if it has one, else built
    from a :class:`dpfair.training.TrainResult`'s sample_rate, sigma, steps, count_sigma."""
    if hasattr(result, "event"):
        return result.event
    if getattr(result, "method", None) == "nonprivate" or not getattr(result, "sigma", 0):
        return None
    return accounting.run_event(result.sample_rate, result.sigma, result.steps, result.count_sigma)


def combine_run_events(events: Sequence[dp_event.DpEvent | None]) -> dp_event.DpEvent | None:
    """One per-run event covering every configuration's (module doc); None if any is None."""
    if any(e is None for e in events):
        return None
    distinct: dict[str, dp_event.DpEvent] = {}
    for e in events:
        distinct.setdefault(accounting.event_to_json(e), e)
    items = list(distinct.values())
    if len(items) == 1:
        return items[0]
    curves = [accounting.rdp_curve(e) for e in items]
    keep = []
    for i, ci in enumerate(curves):
        dominated = any(
            j != i and np.all(cj >= ci) and (np.any(cj > ci) or j < i)
            for j, cj in enumerate(curves)
        )
        if not dominated:
            keep.append(items[i])
    return keep[0] if len(keep) == 1 else accounting.MaxOfDpEvent(keep)
