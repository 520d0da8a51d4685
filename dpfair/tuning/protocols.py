"""What a search takes from its caller and hands back, as types.

``dpfair.training`` gives the real ones (``TrainConfig``, ``GroupedDataset``, ``TrainResult``);
a caller may instead pass plain mappings as configs and a ``train_fn`` of its own whose result
reports its event (the tests' fast numpy trainer does). Type-only: nothing here is imported at
run time, so the pure modules stay free of torch and optuna.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypedDict

if TYPE_CHECKING:
    from dp_accounting.dp_event import DpEvent
    from numpy.typing import ArrayLike

    from dpfair.methods import MethodConfig
    from dpfair.training import Predictions, TrainConfig, TrainResult
    from dpfair.tuning.trial_records import TrialRow

__all__ = [
    "DatasetLike",
    "EventFn",
    "MethodSpec",
    "OnTrial",
    "PredictionsLike",
    "ReportsEvent",
    "RunConfig",
    "RunOutcome",
    "SearchHooks",
    "TrainFn",
]

#: A method's hyperparameters: its pydantic config or a plain mapping.
MethodSpec: TypeAlias = "MethodConfig | Mapping[str, object]"
#: One run's config as ``train_fn`` receives it (made by :func:`dpfair.tuning.make_config`).
RunConfig: TypeAlias = "TrainConfig | Mapping[str, object]"
#: Validation predictions: ``y_true``, ``y_pred``, ``groups`` and ``loss`` as fields or keys.
PredictionsLike: TypeAlias = "Predictions | Mapping[str, ArrayLike]"


class DatasetLike(Protocol):
    """What the search itself reads of a dataset (``train_fn``/``event_fn`` read the rest):
    its name, for the default study name. ``n_classes``/``n_groups`` are read when present,
    else taken from the validation predictions."""

    @property
    def name(self) -> str: ...


class ReportsEvent(Protocol):
    """A ``train_fn`` result that reports its training event itself (not a TrainResult)."""

    @property
    def event(self) -> DpEvent: ...

    @property
    def val_predictions(self) -> PredictionsLike: ...


#: What ``train_fn`` returns.
RunOutcome: TypeAlias = "TrainResult | ReportsEvent"
#: ``train_fn(config, dataset)``: one training run.
TrainFn: TypeAlias = "Callable[[RunConfig, DatasetLike], RunOutcome]"
#: ``event_fn(config, dataset)``: the training event of a run, predicted before it runs.
EventFn: TypeAlias = "Callable[[RunConfig, DatasetLike], DpEvent]"
#: ``on_trial(row, result)``: called after each completed run with its ledger row.
OnTrial: TypeAlias = "Callable[[TrialRow, RunOutcome], None]"


class SearchHooks(TypedDict, total=False):
    """The keyword arguments of :func:`dpfair.tuning.tune` and :func:`~dpfair.tuning.prepare`.

    ``allowed``: the hyperparameter names a space may use (default: the fields of the method
    and training configs). ``event_fn(config, dataset)`` predicts a run's training event
    (default :func:`dpfair.tuning.search_events.planned_run_event`). ``on_trial(row, result)`` is
    called in the worker after each completed run with its ledger row and the train_fn result
    (e.g. to log a nested MLflow run); its errors are logged, never fail the run.
    """

    allowed: Collection[str] | None
    event_fn: EventFn | str | None
    on_trial: OnTrial | str | None
