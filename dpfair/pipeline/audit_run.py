"""``dpfair audit`` from params.yaml, and the audit's MLflow run (adapter layer: the audit
package itself never imports mlflow).

The audit run is a diagnostic of a training run on the private data: tag
``dpfair.stage=audit`` (never ``final``, so nothing selects or registers it) and no model is
logged, but its bounds and score histograms are computed from that training, so the audit
passes the privacy gate and is charged the training run's event (:func:`audit_from_params`).
Logged: per group the ε and μ-GDP lower bounds, the canaries (and how many were included), the
guesses behind the bound, the claimed ε (DPSGD-F: a data-dependent reading, with the bound
fixed before training beside it; a heuristic method logs none: its
``dpfair.epsilon`` tag says why) and the power to catch the stated leak alone and jointly;
the verdicts in words as tags (``audit/verdict/<group>``, and ``audit/verdict`` for all
groups jointly), as printed; the confidence, β, δ and the leak; the table as ``audit/audit.json``;
the score histograms as ``audit/scores.png``.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpfair.data import load_dataset
from dpfair.errors import ConfigError, did_you_mean
from dpfair.pipeline.check_step import check_trainable

if TYPE_CHECKING:
    from dpfair.audit import AuditResult, AuditSection
    from dpfair.config.params import Params
    from dpfair.data import GroupedDataset
    from dpfair.settings import TrackingConfig
    from dpfair.training import TrainConfig

# The audit, the accounting, the privacy gate and MLflow are imported inside the functions
# that use them, so `dpfair audit` refuses a wrong method or model before loading them.

AUDIT_NOTE = ("audit diagnostic of a training run on the private data: its bounds and "
              "score histograms are charged that run's event in the privacy ledger; no model "
              "is logged")


def audit_config(params: Params, section: AuditSection) -> TrainConfig:
    """The configuration ``section`` audits: its method label of ``experiment.methods`` (or
    ``nonprivate``) with ``experiment.train`` and the section's overrides."""
    labels = ["nonprivate", *params.experiment.methods]
    if section.method not in labels:
        raise ConfigError(f"audit.method: no method {section.method!r} in experiment.methods"
                          f"{did_you_mean(section.method, labels)} (methods: "
                          f"{', '.join(labels)}); add it there or choose one of these")
    return params.experiment.train_config(section.method, section.seed,
                                          **section.train_overrides())


def audited(params: Params, section: AuditSection) -> tuple[TrainConfig, GroupedDataset]:
    """What ``section`` audits: :func:`audit_config`'s configuration, and ``experiment.dataset``
    loaded with the configuration's model checked on its preview (before the split)."""
    config = audit_config(params, section)
    name = params.experiment.dataset
    return config, load_dataset(name, params.dataset(name),
                                inspect=lambda preview: check_trainable(config, preview))


def audit_from_params(params: Params, section: AuditSection, config: TrainConfig,
                      dataset: GroupedDataset, root: str | Path = ".") -> AuditResult:
    """Audit ``config`` on ``dataset`` (:func:`audited`) through the privacy gate like every
    release: the audit publishes bounds and a score histogram
    computed from a training run on the data (its model is never released), so it is charged
    that run's event, checked against ``budget.*`` (a σ whose ε exceeds ``budget.epsilon`` is
    refused before anything trains) and the lifetime budget. The event is planned at the
    smallest training set the canaries can leave (``mislabel`` canaries replace their
    originals), which has the largest sampling rate: an upper bound on the run's."""
    from dpfair.audit import audit, group_ids, plan_canaries
    from dpfair.pipeline.standalone import open_gate
    from dpfair.release.plan import method_release, release_plan
    from dpfair.training import make_plan

    groups = group_ids(dataset, section.groups)
    canaries = plan_canaries(config, dataset, section, groups)
    replaced = canaries.canaries * len(groups) if canaries.kind == "mislabel" else 0
    n_min = len(dataset.train) - replaced
    delta = params.budget.delta or config.delta
    plan = make_plan(config, max(n_min, 1), dataset.n_groups, len(dataset.test))
    release = method_release(f"audit of {section.method}", config.method.privacy_guarantee,
                             [config.seed], [plan.event], None, config.reproducible, delta,
                             [plan.test])
    gate, data = open_gate(params, dataset, root, "dpfair audit")
    with gate.admit(release_plan([release], delta), data, command="dpfair audit",
                    method=section.method) as spend:
        spend.may_release()
        return audit(config, dataset, section)


def rows(result: AuditResult) -> list[dict[str, Any]]:
    """The per-group table, as plain values (``epsilon_claimed`` None: no guarantee)."""
    return [dataclasses.asdict(g) for g in result.groups]


def claim_note(result: AuditResult) -> str:
    """What the method claims, in words, where no ε is shown."""
    from dpfair.release.labels import HEURISTIC, NONPRIVATE_REFERENCE

    if any(g.epsilon_fixed is not None for g in result.groups):
        return ("proven: ε of the accountant; per group a data-dependent reading of this run, "
                "beside the bound fixed before training")
    return {"heuristic": HEURISTIC, "none": NONPRIVATE_REFERENCE}.get(
        result.privacy_guarantee, "proven: ε of the accountant")


def log_audit(tracking: TrackingConfig, label: str, config: TrainConfig,
              dataset: GroupedDataset, result: AuditResult) -> str:
    """One MLflow run for the audit (module docstring); returns its id."""
    from dpfair.audit.plot import score_figure
    from dpfair.release.labels import SECRET_NOISE
    from dpfair.tracking.run_log import NOISE_TOKEN
    from dpfair.tracking.runs import (
        described,
        experiment_id,
        log_file,
        log_json,
        log_metrics,
        log_params,
        run,
        set_tags,
    )
    from dpfair.training import REPLAYABLE_NOISE

    noise = REPLAYABLE_NOISE if config.reproducible else SECRET_NOISE
    tags = {"dpfair.stage": "audit", "dpfair.method": label, "dpfair.seed": str(config.seed),
            "dpfair.release": "audit", "privacy_guarantee": result.privacy_guarantee,
            "dpfair.noise": NOISE_TOKEN[noise]}
    notes = {"dpfair.release": AUDIT_NOTE, "privacy_guarantee": claim_note(result),
             "dpfair.noise": noise}
    with run(tracking, experiment_id(tracking, dataset.name), f"audit:{label}",
             tags=described(tags, notes)) as run_id:
        log_params(tracking, run_id, {"train": config.model_dump(mode="json"),
                                      "audit": result.settings.model_dump(mode="json")})
        metrics: dict[str, float] = {"audit/confidence": result.confidence,
                                     "audit/beta": result.settings.beta,
                                     "audit/delta": result.delta,
                                     "audit/leak": result.settings.leak,
                                     "audit/canaries": float(len(result.scores))}
        for g in result.groups:
            metrics.update({f"audit/epsilon_lower_bound/{g.group}": g.epsilon_lower_bound,
                            f"audit/mu_lower_bound/{g.group}": g.mu_lower_bound,
                            f"audit/canaries/{g.group}": g.canaries,
                            f"audit/included/{g.group}": g.included,
                            f"audit/guesses/{g.group}": g.guesses,
                            f"audit/correct/{g.group}": g.correct})
            if result.privacy_guarantee == "proven" and g.epsilon_claimed is not None:
                metrics[f"audit/epsilon_claimed/{g.group}"] = g.epsilon_claimed
            if g.epsilon_fixed is not None:  # the claim above is a reading (DPSGD-F)
                metrics[f"audit/epsilon_fixed_before_training/{g.group}"] = g.epsilon_fixed
            if g.power is not None and g.joint_power is not None:
                metrics.update({f"audit/power/{g.group}": g.power,
                                f"audit/joint_power/{g.group}": g.joint_power})
        log_metrics(tracking, run_id, metrics)
        log_json(tracking, run_id, {"groups": rows(result), "claim": claim_note(result),
                                    "joint_verdict": result.joint_verdict}, "audit/audit.json")
        with tempfile.TemporaryDirectory() as tmp:
            log_file(tracking, run_id, score_figure(result, Path(tmp) / "scores.png"), "audit")
        set_tags(tracking, run_id, {"dpfair.device": result.train_result.device,
                                    "audit/kind": result.plan.kind,
                                    "audit/verdict": result.joint_verdict,
                                    **{f"audit/verdict/{g.group}": g.verdict
                                       for g in result.groups}})
    return run_id
