"""How a run looks in MLflow (issue 17): its name, the headline metrics of a model, the
dataset as the run's logged input, the per-epoch test metrics, and the run's DpEvent with a
note. :mod:`dpfair.pipeline.method_steps` logs every run through these."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pandas as pd

from dpfair import accounting
from dpfair.data import GroupedDataset
from dpfair.fairness import max_gap
from dpfair.fairness.rates import DISPARITIES
from dpfair.metric_keys import renamed
from dpfair.release.labels import NO_NOISE, SECRET_NOISE
from dpfair.tracking.runs import (
    TrackingConfig,
    log_dataset,
    log_metric_steps,
    set_tags,
)
from dpfair.training import REPLAYABLE_NOISE, TrainResult

#: The fairness summary of a model's test metrics: one chart each on a run, one column each
#: per method on the pipeline run, tags of a registered model (see :func:`headline`).
HEADLINE = ("accuracy", "macro_accuracy", "worst_group_accuracy", "largest_group_gap")

#: The ``dpfair.noise`` tag of each kind of noise (its sentence goes to the run's description).
NOISE_TOKEN = {NO_NOISE: "none", SECRET_NOISE: "secret", REPLAYABLE_NOISE: "replayable"}


def run_name(dataset: str, *parts: str) -> str:
    """A run's name in MLflow's runs table: the dataset, then what ran (method, seed)."""
    return " · ".join([dataset, *parts])


def pipeline_run_name(dataset: str) -> str:
    """The pipeline (parent) run's name: the dataset and when it started."""
    return run_name(dataset, time.strftime("%Y-%m-%d %H:%M"))


def public_schema(dataset: GroupedDataset) -> dict[str, Any]:
    """What a logged dataset says about itself: public facts only (no row or group counts)."""
    pre = dataset.preprocessor
    return {"input_shape": list(dataset.input_shape), "classes": dataset.class_names,
            "groups": dataset.group_names,
            "columns": list(pre.columns) if pre is not None else None}


def log_data_input(tracking: TrackingConfig, run_id: str, dataset: GroupedDataset,
                   version: str, source: str) -> None:
    """``dataset`` as the run's logged input (MLflow's Dataset column): digest = its data
    version (the source's content hash when the loader records one, else ``version``). Group
    and class names that are no safe metric key (:mod:`dpfair.metric_keys`) are mapped to
    the keys their metrics use in the tag ``dpfair.metric_keys`` (JSON: key -> name)."""
    log_dataset(tracking, run_id, name=dataset.name,
                digest=dataset.meta.get("data_version") or version,
                source=str(dataset.meta.get("source") or source), schema=public_schema(dataset))
    keys = {**renamed(dataset.class_names), **renamed(dataset.group_names)}
    if keys:
        set_tags(tracking, run_id, {"dpfair.metric_keys": json.dumps(keys, ensure_ascii=False)})


def headline(metrics: dict[str, Any]) -> dict[str, float]:
    """The :data:`HEADLINE` of a model's metrics: accuracy, macro accuracy, worst-group
    accuracy and the largest gap between two groups' accuracies (NaN with < 2 groups), and
    the disparities of :mod:`dpfair.fairness.rates` where released (the last evaluation). A
    noisy test release has no macro accuracy (no per-class metric): it is left out."""
    try:
        gap = max_gap(metrics["group_accuracy"])[0]
    except ValueError:
        gap = math.nan
    return {**{k: float(metrics[k]) for k in HEADLINE[:3] if k in metrics},
            "largest_group_gap": gap,
            **{k: float(metrics[k]) for k in DISPARITIES if k in metrics}}


class EpochLogger:
    """Training callback: per-epoch TEST headline metrics into the run (held-out data that ε
    does not cover, :data:`dpfair.release.labels.TEST_METRICS_NOTE`, unless the run releases noisy
    test metrics: then these are the noisy ones). The first epoch is written at once, later
    ones together every :data:`FLUSH_S` seconds and at the end (one write per epoch cost
    more than a short training); as a context, the rest when the block ends."""

    def __init__(self, tracking: TrackingConfig, run_id: str) -> None:
        self.tracking, self.run_id = tracking, run_id
        self._pending: dict[int, dict[str, float]] = {}
        self._written = -math.inf

    def on_epoch_end(self, epoch: int, entry: dict[str, Any]) -> None:
        found = headline(entry["test"])
        self._pending[epoch] = {f"test/{k}": found[k] for k in HEADLINE if k != "macro_accuracy"}
        if time.monotonic() - self._written >= FLUSH_S:
            self.flush()

    def on_train_end(self, result: TrainResult) -> None:
        self.flush()

    def __enter__(self) -> EpochLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()  # also when the training stopped

    def flush(self) -> None:
        """Write the epochs not written yet."""
        if self._pending:
            log_metric_steps(self.tracking, self.run_id, self._pending)
            self._pending = {}
        self._written = time.monotonic()


#: seconds between two writes of a training's per-epoch metrics (:class:`EpochLogger`)
FLUSH_S = 5.0


READING = ("epsilon_reading: a data-dependent reading of this one run (its clip bounds come "
           "from noisy counts), not a guarantee fixed in advance; "
           "epsilon_fixed_before_training: the bound from the clip range the method allows")


def epsilon_by_group(result: TrainResult, dataset: GroupedDataset) -> Any:
    """DPSGD-F's per-group ε (:mod:`dpfair.accounting.per_group`: each group's own steps
    accounted) as a table: group name, the data-dependent reading of this run at its δ, the
    bound fixed before training beside it, δ, the accountant, and what the reading is."""
    return pd.DataFrame({"group": dataset.group_names,
                         "epsilon_reading": result.group_epsilons,
                         "epsilon_fixed_before_training": result.group_epsilon_bounds,
                         "delta": result.delta, "accountant": result.group_accountants,
                         "reading": READING}).set_index("group")


def event_with_note(result: TrainResult) -> str:
    """The run's DpEvent JSON (:func:`~dpfair.accounting.accountant.event_from_json` reads it)
    with a ``note`` saying how its noise multipliers relate to the ``sigma`` param."""
    how = ("set by the sigma param" if result.config.sigma is not None else
           f"calibrated so that the run reaches target_epsilon {result.config.target_epsilon:g}")
    note = (f"noise_multiplier of the GaussianDpEvent on the clipped gradient sum is sigma = "
            f"{result.sigma:g} ({how}); the event is Poisson-sampled with probability "
            f"sampling_probability and self-composed count = {result.steps} times (steps).")
    if result.count_sigma is not None:
        eff = (result.sigma ** -2 + result.count_sigma ** -2) ** -0.5
        note += (f" The second GaussianDpEvent is the method's noisy count release "
                 f"(noise multiplier {result.count_sigma:g}); both query the same batch, so "
                 f"the accountant treats them as one Gaussian of noise multiplier "
                 f"(sigma^-2 + count_sigma^-2)^-1/2 = {eff:.4g} (Zhao et al., Lemma 3.1): "
                 "this is the noise_multiplier a reduced event shows.")
    return json.dumps({**json.loads(accounting.event_to_json(result.event)), "note": note},
                      indent=2, sort_keys=True)
