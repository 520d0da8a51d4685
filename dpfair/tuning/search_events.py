"""The privacy events of a search: one run's, its combination over a space, the whole search's.

* ``search_event``: ``tnb`` → ``RepeatAndSelectDpEvent(run ∘ score, μ, η)`` (Papernot &
  Steinke, ICLR 2022, Theorem 2); ``poisson`` → the same with ``shape = inf``, as dp_accounting
  encodes Theorem 6; ``binomial`` → :class:`~dpfair.accounting.accountant.BinomialSelectDpEvent`
  (run ∘ score, n_runs, p) (Koskela, Redberg & Wang 2024); ``fixed`` →
  ``SelfComposed(run ∘ score, n)``; ``grid`` → None (no guarantee). With
  ``score_privacy: noisy`` the score release (one Gaussian query of sensitivity 1, see
  :mod:`dpfair.tuning.score`) is composed into the run event.
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

from dp_accounting import dp_event

from dpfair import accounting
from dpfair.tuning.config import TuningConfig

if TYPE_CHECKING:
    from dpfair.data.dataset import GroupedDataset
    from dpfair.training import TrainConfig
    from dpfair.tuning.protocols import RunOutcome

__all__ = ["combine_run_events", "planned_run_event", "result_event", "search_event"]


def search_event(cfg: TuningConfig, run: dp_event.DpEvent) -> dp_event.DpEvent | None:
    """The event of the whole search given the per-run training event; None when the search
    has no guarantee (grid mode, or non-private runs)."""
    if isinstance(run, dp_event.NonPrivateDpEvent) or cfg.mode == "grid":
        return None
    per_run = run
    if cfg.score_privacy == "noisy":
        per_run = dp_event.ComposedDpEvent([run, accounting.score_release_event(cfg.sigma_score)])
    if cfg.mode == "fixed":
        return dp_event.SelfComposedDpEvent(per_run, int(cfg.n_runs or 0))
    if cfg.mode == "binomial":
        return accounting.BinomialSelectDpEvent(per_run, int(cfg.n_runs or 0), float(cfg.p or 0))
    shape = math.inf if cfg.mode == "poisson" else float(cfg.eta)
    return dp_event.RepeatAndSelectDpEvent(per_run, float(cfg.mu), shape)


def planned_run_event(config: TrainConfig, dataset: GroupedDataset) -> dp_event.DpEvent:
    """The training event of ``dpfair.training.train(config, dataset)``, before training: its
    :func:`dpfair.training.make_plan` event, in the reduced form the ledger holds
    (:func:`dpfair.accounting.accountant.reduced`; studies stored before keep their fingerprints).
    """
    from dpfair.training import make_plan

    return accounting.reduced(make_plan(config, len(dataset.train), dataset.n_groups).event)


def result_event(result: RunOutcome) -> dp_event.DpEvent:
    """The training event a finished run reports (``result.event``), in the reduced form."""
    return accounting.reduced(result.event)


def combine_run_events(events: Sequence[dp_event.DpEvent]) -> dp_event.DpEvent:
    """One per-run event covering every configuration's (module doc); non-private if any is."""
    if any(isinstance(e, dp_event.NonPrivateDpEvent) for e in events):
        return dp_event.NonPrivateDpEvent()
    distinct: dict[str, dp_event.DpEvent] = {}
    for e in events:
        distinct.setdefault(accounting.event_to_json(e), e)
    items = list(distinct.values())
    if len(items) == 1:
        return items[0]
    keep = [e for i, e in enumerate(items)
            if not any(j != i and _dominates(f, e) for j, f in enumerate(items))]
    return keep[0] if len(keep) == 1 else accounting.MaxOfDpEvent(keep)


def _shape(event: dp_event.DpEvent) -> tuple[float, float, int] | None:
    """(q, σ, steps) of ``SelfComposed(PoissonSampled(q, Gaussian(σ)), steps)``, else None."""
    if not isinstance(event, dp_event.SelfComposedDpEvent):
        return None
    inner = event.event
    if not (isinstance(inner, dp_event.PoissonSampledDpEvent)
            and isinstance(inner.event, dp_event.GaussianDpEvent)):
        return None
    return inner.sampling_probability, inner.event.noise_multiplier, event.count


def _dominates(a: dp_event.DpEvent, b: dp_event.DpEvent) -> bool:
    """Whether ``b`` is a post-processing of ``a`` (module doc); distinct events only."""
    sa, sb = _shape(a), _shape(b)
    if sa is None or sb is None:
        return False
    return sa[0] >= sb[0] and sa[1] <= sb[1] and sa[2] >= sb[2]
