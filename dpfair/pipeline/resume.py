"""Resume a pipeline run that crashed, without retraining what had finished (issue #15, item 3).

A pipeline run is identified by a fingerprint of its settings (:func:`fingerprint`: every
section of params.yaml but the orchestration ones, ``pipeline``) and the version of its
prepared data; both are tags of its MLflow parent run (:data:`FINGERPRINT_TAG`,
``dpfair.data_version``). When ``dpfair run`` starts and the latest pipeline run with the same
fingerprint and data version ended FAILED (a method failed, the summary failed, or the process
was killed and :func:`dpfair.tracking.runs.fail_stale_runs` marked it), the new run resumes it
(:func:`find_resumable`):

* the same parent run (reopened), the same Optuna studies (their K, drawn once, and their
  finished trials: :mod:`dpfair.tuning` resumes a study until K runs), the same results folder;
* every search whose run FINISHED with its selected configuration
  (:data:`dpfair.pipeline.method_steps.SELECTED_CONFIG`) and every final training whose run
  FINISHED with its record (:data:`dpfair.pipeline.method_steps.RUN_RECORD`) is read back, not
  redone;
* the rest runs again. A final training that had started may already have released per-epoch
  metrics, so each such earlier attempt counts as one more training run of its method in the
  resumed plan (:func:`dpfair.pipeline.release_step.plan_release`'s ``extra_runs``), which the
  budget checks, and the retrains are reserved in the data source's privacy ledger as a release of
  their own (:func:`retry_event`); the crashed run's own reservation still counts in full.

A crashed run whose ledger release is void (it stopped before anything could be released) is
not resumed: the new run plans and reserves everything afresh. ``dpfair run --no-resume``
starts a new pipeline run whatever is there.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dp_accounting import dp_event

from dpfair.pipeline.method_steps import RUN_RECORD, SELECTED_CONFIG, RunRecord, TuneRecord
from dpfair.release.plan import ledger_event
from dpfair.tracking.runs import TrackingConfig, client

if TYPE_CHECKING:
    from mlflow.entities import Run

    from dpfair.config.params import Params
    from dpfair.ledger import SourceLedger
    from dpfair.release.plan import ReleasePlan

__all__ = ["FINGERPRINT_TAG", "STUDY_TAG", "Resumable", "find_resumable", "fingerprint",
           "retry_event"]

FINGERPRINT_TAG = "dpfair.params_fingerprint"
STUDY_TAG = "dpfair.study."  # + method label: the Optuna study of that method's search
_ORCHESTRATION = {"pipeline"}  # how the run is scheduled, not what it computes or releases


def fingerprint(params: Params) -> str:
    """md5 of every setting that decides what a pipeline run computes and releases."""
    settings = params.model_dump(mode="json", exclude=_ORCHESTRATION)
    return hashlib.md5(json.dumps(settings, sort_keys=True).encode()).hexdigest()


@dataclass
class Resumable:
    """What a crashed pipeline run left: its parent run, studies and ledger release, the
    searches and trainings that finished, and how often each unfinished (label, seed)
    training was attempted."""

    parent_run_id: str
    studies: dict[str, str]
    ledger_release: str
    tuned: dict[str, TuneRecord] = field(default_factory=dict)
    trained: dict[tuple[str, int], RunRecord] = field(default_factory=dict)
    attempts: dict[tuple[str, int], int] = field(default_factory=dict)

    def summary(self) -> str:
        """The parent run's ``dpfair.resumed`` tag, JSON: the searches and trainings read back
        and the ``[label, seed]`` pairs trained again."""
        return json.dumps({"searches_read_back": len(self.tuned),
                           "trainings_read_back": len(self.trained),
                           "retrains": [list(key) for key in sorted(self.attempts)]})

    def describe(self) -> str:
        """One line for the log and the parent run's description."""
        retried = ", ".join(f"{label} seed {seed}" for label, seed in sorted(self.attempts))
        return (f"resumes pipeline run {self.parent_run_id}: {len(self.tuned)} search(es) and "
                f"{len(self.trained)} training(s) read back, not redone"
                + (f"; retrains {retried} (earlier attempts counted again)" if retried else ""))


def find_resumable(tracking: TrackingConfig, experiment_id: str, params: Params,
                   data_version: str, ledger: SourceLedger) -> Resumable | None:
    """The latest pipeline run of these settings and data if it ended FAILED and may have
    released something (its ledger release is not void); else None (start afresh)."""
    mlf = client(tracking)
    found = mlf.search_runs(
        [experiment_id],
        f"tags.`dpfair.stage` = 'pipeline' and tags.`{FINGERPRINT_TAG}` = "
        f"'{fingerprint(params)}' and tags.`dpfair.data_version` = '{data_version}'",
        order_by=["attributes.start_time DESC"], max_results=1)
    if not found or found[0].info.status != "FAILED":
        return None
    parent = found[0]
    release_id = parent.data.tags.get("dpfair.ledger_release", "")
    release = next((r for r in ledger.releases() if r.id == release_id), None)
    if release is None or release.status == "void":
        return None
    studies = {key[len(STUDY_TAG):]: value for key, value in parent.data.tags.items()
               if key.startswith(STUDY_TAG)}
    state = Resumable(parent.info.run_id, studies, release_id)
    _read_children(tracking, experiment_id, state)
    return state


def _read_children(tracking: TrackingConfig, experiment_id: str, state: Resumable) -> None:
    """Fill ``state`` from the parent's nested runs: finished searches and trainings are
    read back; every other final training run is an attempt."""
    mlf = client(tracking)
    children = mlf.search_runs(
        [experiment_id], f"tags.`mlflow.parentRunId` = '{state.parent_run_id}'",
        order_by=["attributes.start_time ASC"])
    attempts: Counter[tuple[str, int]] = Counter()
    for child in children:
        tags, finished = child.data.tags, child.info.status == "FINISHED"
        stage, label = tags.get("dpfair.stage"), tags.get("dpfair.method", "")
        if stage == "tuning" and finished and label not in state.tuned:
            if (data := _artifact(tracking, child, SELECTED_CONFIG)) is not None:
                state.tuned[label] = TuneRecord(**data)
        elif stage == "final":
            key = (label, int(tags.get("dpfair.seed", "-1")))
            data = _artifact(tracking, child, RUN_RECORD) if finished else None
            if data is not None and key not in state.trained:
                state.trained[key] = RunRecord.from_json(data)
            else:
                attempts[key] += 1
    state.attempts = {key: n for key, n in attempts.items() if key not in state.trained}


def _artifact(tracking: TrackingConfig, run: Run, path: str) -> dict | None:
    """A JSON artifact of ``run``, or None when it was never written."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            local = client(tracking).download_artifacts(run.info.run_id, path, tmp)
        except Exception:  # MLflow raises several types for a missing artifact
            return None
        return json.loads(Path(local).read_text())


def retry_event(plan: ReleasePlan, attempts: dict[tuple[str, int], int]) -> dp_event.DpEvent:
    """What retraining the unfinished attempted trainings adds (one run event each, and its
    noisy test metrics: :func:`dpfair.release.plan.ledger_event`), to be reserved in the privacy
    ledger; a no-op when nothing is retrained."""
    events = []
    for (label, seed), _ in sorted(attempts.items()):
        release = plan.methods.get(label)
        if release is None:
            continue
        index = release.seeds.index(seed)
        test = release.test_releases[index].event if release.test_releases else None
        event = ledger_event(release.run_events[index] if release.has_epsilon else None, test)
        if not isinstance(event, dp_event.NoOpDpEvent):
            events.append(event)
    return dp_event.ComposedDpEvent(events) if events else dp_event.NoOpDpEvent()
