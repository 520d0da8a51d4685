"""What a pipeline run reports: the results table with each
method's two ε columns and the run's total, the notes on what ε covers, the figures, what the
pipeline's parent MLflow run holds (:func:`log_release`, :func:`log_summary`) and which model
it registers (:func:`register_model`).

The parent run carries the comparison, one metric per method and question (the runs table's
columns, the compare page): ``worst_group_accuracy/<method>``, ``largest_group_gap/<method>``
and ``accuracy/<method>`` (test, mean over seeds), ``group_accuracy/<group>/<method>`` for
every group of the dataset, ``epsilon_run/<method>`` and
``epsilon_released/<method>`` (the table's two ε columns; none for a release without
guarantee), ``epsilon_total`` (and with noisy test metrics ``epsilon_test/<method>`` and
``epsilon_test_total``, the test split's line); the results table is an MLflow table artifact
(``results/results_table.json``) beside ``results.md``, ``results.csv`` and ``groups.json``;
the figures are at the artifact root. With the fairness measures (``test_metrics.fairness``,
:mod:`dpfair.fairness.rates`) the comparison also holds ``<disparity>/<method>`` and
``<disparity>_privacy_cost/<method>`` (:mod:`dpfair.fairness.rate_tables`), and results.md
their tables and the rates per group. A child run per method (:func:`log_comparison_runs`)
holds the same comparison under one set of keys, which MLflow's charts plot side by side.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dpfair import accounting, fairness
from dpfair.config.params import Params
from dpfair.data import GroupedDataset
from dpfair.fairness import rate_tables
from dpfair.fairness.rates import DISPARITIES
from dpfair.pipeline import report
from dpfair.pipeline.dvc_outputs import FAIRNESS_CSV, GROUPS_JSON
from dpfair.pipeline.method_steps import RunRecord
from dpfair.pipeline.release_step import REFERENCE
from dpfair.pipeline.report_page import REPORT_PAGE, write_report_page
from dpfair.release.labels import (
    EPSILON_ACCOUNTANT,
    EPSILON_METHOD,
    EPSILON_RUN,
    EPSILON_TEST,
    SECRET_NOISE,
)
from dpfair.release.plan import (
    MethodRelease,
    ReleasePlan,
    epsilon_cells,
    epsilon_test_cell,
    epsilon_text,
)
from dpfair.tracking import model_registry
from dpfair.tracking.model_export import preprocessing_note
from dpfair.tracking.model_registry import EPSILON_TAG
from dpfair.tracking.run_log import NOISE_TOKEN
from dpfair.tracking.runs import (
    DESCRIPTION_TAG,
    TrackingConfig,
    add_description,
    client,
    log_file,
    log_json,
    log_metrics,
    log_table,
    log_text,
    run,
    set_tags,
    tag_number,
)
from dpfair.training import EXACT_TEST_METRICS, REPLAYABLE_NOISE, TrainResult

#: The per-method comparison on the pipeline run: the test headline metrics it averages.
COMPARED = ("worst_group_accuracy", "largest_group_gap", "accuracy")
#: The ``dpfair.stage`` of the per-method comparison runs (:func:`log_comparison_runs`).
COMPARISON_STAGE = "comparison"


@dataclass
class Summary:
    """The results of a pipeline run: the table, the p-values, the figures' paths, the notes
    on what ε covers (:meth:`dpfair.release.plan.ReleasePlan.notes`) and the per-method metrics of
    the pipeline run (``compared``: ``<metric>/<method>``, :data:`COMPARED`), and the same per
    method (``by_method``: each method's comparison child run, :func:`log_comparison_runs`)."""

    table: pd.DataFrame
    significance: pd.DataFrame
    figures: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    compared: dict[str, float] = field(default_factory=dict)
    by_method: dict[str, dict[str, float]] = field(default_factory=dict)
    #: title -> table of the practitioners' fairness measures
    #: (:func:`dpfair.fairness.rate_tables.measure_tables`)
    measures: dict[str, pd.DataFrame] = field(default_factory=dict)

    def markdown(self) -> str:
        parts = ["## Per-group results (mean ± SE over seeds)", "", self.table.to_markdown()]
        if self.notes:
            parts += ["", *(f"- {note}" for note in self.notes)]
        for title, table in self.measures.items():
            parts += ["", f"## {title}", "", table.to_markdown()]
        if not self.significance.empty:
            parts += ["", "## One-sided Wilcoxon p-values against the baseline", "",
                      self.significance.to_markdown()]
        return "\n".join(parts) + "\n"


def log_release(tracking: TrackingConfig, run_id: str, plan: ReleasePlan) -> None:
    """The plan on the pipeline run: the total ε (with what it leaves out), each method's two
    ε columns, the test split's line (noisy test metrics), the composed event, and the
    release notes as the run's description."""
    metrics = {"epsilon_total": plan.epsilon_total, "delta": plan.delta}
    for m in plan.methods.values():
        if m.has_epsilon:
            metrics.update({f"epsilon_run/{m.label}": m.epsilon_run,
                            f"epsilon_released/{m.label}": m.epsilon})
        if m.epsilon_test is not None:
            metrics[f"epsilon_test/{m.label}"] = m.epsilon_test
    if plan.epsilon_test_total is not None:
        metrics.update({"epsilon_test_total": plan.epsilon_test_total,
                        "delta_test": plan.test_delta})
    log_metrics(tracking, run_id, metrics)
    noisy = plan.epsilon_test_total is not None
    set_tags(tracking, run_id, {
        "dpfair.epsilon_total": tag_number(plan.epsilon_total),
        "dpfair.test_metrics": "noisy" if noisy else "exact",
        **({"dpfair.noise": NOISE_TOKEN[REPLAYABLE_NOISE]} if plan.reproducible else {}),
        DESCRIPTION_TAG: "\n".join(f"- {note}" for note in [
            *plan.notes(), f"dpfair.epsilon_total: {plan.total_label}",
            "dpfair.test_metrics: " + (
                f"noisy (ε {epsilon_text(plan.epsilon_test_total)} at δ {plan.test_delta:g} "
                "for the test split, all methods and seeds)" if noisy else EXACT_TEST_METRICS),
            *([f"dpfair.noise: {REPLAYABLE_NOISE}"] if plan.reproducible else [])]),
    })
    log_text(tracking, run_id, accounting.event_to_json(plan.event_total), "dp_event_total.json")


def _bounds(trajectory: dict[str, list[float]]) -> dict[str, list[float]]:
    """The clip bounds of a trajectory, without its step index and released counts."""
    return {k: v for k, v in trajectory.items() if k != "step" and "released" not in k}


def summarise(params: Params, dataset: GroupedDataset, runs: list[RunRecord],
              out_dir: str | Path, plan: ReleasePlan) -> Summary:
    """Every group's table (:func:`dpfair.fairness.comparison_stats`' ``groups`` layout, with
    ``experiment.pair``'s gaps when named) with each method's two ε columns and the run's total ε
    (``plan``), Wilcoxon p-values against the baseline, and the figures. Without a finished
    training there is nothing to summarise: a ValueError says so."""
    if not runs:
        raise ValueError("no training finished: there is nothing to summarise")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frame = fairness.runs_frame([r for run_ in runs for r in run_.records])
    pair = params.experiment.named_pair
    groups = tuple(pair or dataset.group_names[:2])  # the significance tests' two groups
    methods = sorted({r.label for r in runs}, key=lambda m: (m != REFERENCE, m))
    has_reference = REFERENCE in methods
    table = fairness.comparison_table(
        frame, list(dataset.group_names), reference=REFERENCE if has_reference else methods[0],
        layout="groups", pair=pair, costs=has_reference,
    )
    reference = REFERENCE if has_reference else None
    table = _with_release(rate_tables.with_shown(table, frame, params.experiment.show,
                                                 reference), plan)
    per_seed = fairness.seed_table(frame, groups,
                                   reference=REFERENCE if has_reference else methods[0])
    baseline = params.experiment.baseline
    significance = pd.DataFrame()
    if baseline in methods:
        significance = fairness.significance_table(per_seed, baseline=baseline, min_pairs=2)
    figures = {
        "group_accuracy": report.plot_group_accuracy(
            frame, out / "group_accuracy.png", groups=list(dataset.group_names),
            methods=methods),
        "training_curves": report.plot_training_curves(
            {m: [r.history for r in runs if r.label == m] for m in methods},
            out / "training_curves.png", groups=list(dataset.group_names)),
    }
    if has_reference and len(methods) > 1:
        figures["privacy_cost"] = report.plot_privacy_cost(
            frame, out / "privacy_cost.png", reference=REFERENCE,
            groups=list(dataset.group_names),
            methods=[m for m in methods if m != REFERENCE])
    bounds = {r.label: _bounds(r.clip_trajectory) for r in runs
              if r.clip_trajectory and r.seed == params.experiment.seeds[0]}
    if bounds:
        figures["clip_bounds"] = report.plot_clip_bounds(bounds, out / "clip_bounds.png")
    figures.update(report.plot_rate_figures(frame, out, list(dataset.group_names),
                                            list(dataset.class_names), methods))
    notes = plan.notes()
    measures = rate_tables.measure_tables(frame, dataset.group_names, dataset.class_names,
                                          reference)
    (out / "results.md").write_text(
        Summary(table, significance, notes=notes, measures=measures).markdown())
    table.to_csv(out / "results.csv")
    figures["report"] = write_report_page(f"{dataset.name}: comparison of the methods", table,
                                          measures, notes, figures, out / REPORT_PAGE)
    rate_tables.long_summary(frame, reference).to_csv(out / FAIRNESS_CSV, index=False)
    facts = group_facts(frame, list(dataset.group_names), pair)
    (out / GROUPS_JSON).write_text(json.dumps(facts))
    by_method = per_method(runs, list(dataset.group_names))
    for label, stats in rate_tables.disparity_stats(frame, reference).items():
        by_method.setdefault(label, {}).update(stats)
    return Summary(table=table, significance=significance,
                   figures={k: str(v) for k, v in figures.items()}, notes=notes,
                   by_method=by_method, compared=_compared(by_method), measures=measures)


def group_facts(frame: pd.DataFrame, groups: list[str], pair: list[str] | None
                ) -> dict[str, object]:
    """``{"groups", "pair", "fewest_test_rows"}``: the group names in the dataset's order, the
    named pair (or None) and the group with the fewest test rows, read from the released test
    counts (None with noisy test metrics, which release no count: nothing new leaves)."""
    counts = frame[(frame["metric"] == fairness.COUNT) & frame["group"].isin(groups)]
    fewest = (str(counts.groupby("group")["value"].mean().idxmin()) if not counts.empty
              else None)
    return {"groups": [str(g) for g in groups], "pair": pair, "fewest_test_rows": fewest}


def per_method(runs: list[RunRecord], groups: list[str]) -> dict[str, dict[str, float]]:
    """Method -> ``{metric: mean over its seeds}``: each :data:`COMPARED` test metric and
    ``acc_<group>`` for every group (released test metrics, averaged: no new release)."""
    frame = fairness.runs_frame([rec for r in runs for rec in r.records])
    acc = frame[(frame["metric"] == fairness.ACCURACY) & frame["group"].isin(groups)]
    means = acc.groupby(["method", "group"])["value"].mean()
    return {label: {**{metric: float(np.nanmean([r.headline[metric] for r in runs
                                                 if r.label == label])) for metric in COMPARED},
                    **{f"acc_{g}": float(means[label, g]) for g in groups
                       if (label, g) in means.index}}
            for label in sorted({r.label for r in runs})}


def _compared(by_method: dict[str, dict[str, float]]) -> dict[str, float]:
    """``<metric>/<method>`` of :func:`per_method` on the pipeline run (the runs table's
    columns), ``acc_<group>`` as ``group_accuracy/<group>/<method>``."""
    return {(f"group_accuracy/{key.removeprefix('acc_')}/{label}" if key.startswith("acc_")
             else f"{key}/{label}"): value
            for label, metrics in by_method.items() for key, value in metrics.items()}


def _accountant_cell(m: MethodRelease) -> str:
    """Method ``m``'s :data:`EPSILON_ACCOUNTANT` cell: the accountant of its composed ε, and
    that of one run where it differs (names of ``accounting.ACCOUNTANTS``)."""
    if not m.has_epsilon or m.accountant_run == m.accountant:
        return m.accountant
    return f"run: {m.accountant_run}; method: {m.accountant}"


def _with_release(table: pd.DataFrame, plan: ReleasePlan) -> pd.DataFrame:
    """``table`` with each method's two ε columns, a last row holding the run's total ε, and
    the row of a reproducible method labelled so (:mod:`dpfair.release.plan`). With noisy test
    metrics, a third column holds the test split's ε (per method; the total in the last
    row), never mixed with the training ε. The last column names the accountant of each row's
    figures."""
    cells = pd.DataFrame([epsilon_cells(plan.methods[m]) for m in table.index],
                         index=table.index, columns=[EPSILON_RUN, EPSILON_METHOD])
    table = table.join(cells)
    if plan.epsilon_test_total is not None:
        table[EPSILON_TEST] = [epsilon_test_cell(plan.methods[m]) for m in table.index]
    table[EPSILON_ACCOUNTANT] = [_accountant_cell(plan.methods[m]) for m in table.index]
    table.loc[plan.total_label] = ""
    table.loc[plan.total_label, EPSILON_METHOD] = epsilon_text(plan.epsilon_total)
    table.loc[plan.total_label, EPSILON_ACCOUNTANT] = plan.accountant_total
    if plan.epsilon_test_total is not None:
        table.loc[plan.total_label, EPSILON_TEST] = epsilon_text(plan.epsilon_test_total)
    return table.rename(index={m.label: f"{m.label} ({REPLAYABLE_NOISE})"
                               for m in plan.methods.values() if m.reproducible})


def log_summary(tracking: TrackingConfig, run_id: str, summary: Summary | None,
                out_dir: str | Path, failures: dict[str, str]) -> None:
    """The per-method comparison, the results table (files and an MLflow table) and figures
    on the pipeline run (if ``summary``: none when the summary failed), and the methods that
    failed."""
    out = Path(out_dir)
    if summary is not None:
        log_metrics(tracking, run_id, summary.compared)
        for name in ("results.md", "results.csv", GROUPS_JSON, FAIRNESS_CSV):
            log_file(tracking, run_id, out / name, "results")
        log_table(tracking, run_id, summary.table, "results/results_table.json")
        for path in summary.figures.values():  # the artifact root: the first thing one sees
            log_file(tracking, run_id, path)
        log_comparison_runs(tracking, run_id, summary.by_method)
    if failures:
        log_json(tracking, run_id, failures, "failures.json")
    set_tags(tracking, run_id, {"dpfair.failed_methods": ",".join(sorted(failures)) or "none"})


def log_comparison_runs(tracking: TrackingConfig, parent: str,
                        by_method: dict[str, dict[str, float]]) -> None:
    """One child run of the pipeline run per method (``dpfair.stage = comparison``, named
    ``<method> · mean over seeds``) holding :func:`per_method`'s metrics under the same keys
    (``acc_<group>``, ``worst_group_accuracy``, ...): MLflow's chart view and *Compare* plot
    one chart per metric with a bar per method. A resumed run's are reused, not repeated."""
    mlf = client(tracking)
    experiment = mlf.get_run(parent).info.experiment_id
    existing = {r.data.tags.get("dpfair.method"): r.info.run_id for r in mlf.search_runs(
        [experiment], f"tags.`mlflow.parentRunId` = '{parent}' and "
        f"tags.`dpfair.stage` = '{COMPARISON_STAGE}'")}
    for label, metrics in by_method.items():
        if label in existing:
            log_metrics(tracking, existing[label], metrics)
            continue
        with run(tracking, experiment, f"{label} · mean over seeds", parent_run_id=parent,
                 tags={"dpfair.stage": COMPARISON_STAGE, "dpfair.method": label}) as child:
            log_metrics(tracking, child, metrics)


# ------------------------------------------------------------------------ model registry


def select_model(runs: list[RunRecord], plan: ReleasePlan, method: str | None = None
                 ) -> tuple[RunRecord | None, str]:
    """The final run whose model a pipeline run registers, and why (or None and why not).

    ``method`` None: among the methods with a proven guarantee whose noise is secret (a
    replayable run's ε protects nothing), the one with the best worst-group test accuracy
    (mean over seeds; ties: the smaller ε released for the method), and of its seeds the one
    with the best worst-group test accuracy. ``method`` given: that method's best seed, with
    whatever guarantee it has (its registry tags say which). Selection reads only the test
    metrics the run already released (post-processing: it costs no privacy), never validation
    metrics, which ε does not cover; the choice is thereby tuned on the test split, so the
    registered model's test metrics are optimistic by that choice (at most one of a handful).
    """
    if method is not None:
        candidates = [r for r in runs if r.label == method]
        rule = f"method {method!r} chosen by pipeline.registry.method; its best seed"
    else:
        candidates = [r for r in runs if plan.methods[r.label].has_epsilon
                      and not plan.methods[r.label].reproducible]
        rule = ("the proven-private method (secret noise) with the best mean worst-group test "
                "accuracy over seeds, and its seed with the best worst-group test accuracy")
    if not candidates:
        return None, ("no final model of " + (f"method {method!r}" if method else
                      "a method with a proven guarantee and secret noise") + " finished")

    def worst(r: RunRecord) -> float:
        value = r.headline["worst_group_accuracy"]
        return -math.inf if math.isnan(value) else value

    labels = sorted({r.label for r in candidates})
    mean = {label: float(np.mean([worst(r) for r in candidates if r.label == label]))
            for label in labels}
    best = max(labels, key=lambda label: (mean[label], -plan.methods[label].epsilon))
    chosen = max((r for r in candidates if r.label == best), key=lambda r: (worst(r), -r.seed))
    return chosen, rule


def _what_is_predicted(dataset: GroupedDataset) -> dict[str, str]:
    """Target, protected attribute(s) and group names of ``dataset``: what tells apart models
    of one dataset trained for different groups, as a token and JSON lists. A built-in dataset
    without such options has target ``class_label`` and no protected attribute (``[]``): its
    loader defines the groups."""
    options = dataset.meta.get("options", {})
    protected = options.get("protected") or []
    return {
        "target": str(options.get("target") or "class_label"),
        "protected_attributes": json.dumps(
            [str(p) for p in (protected if isinstance(protected, list) else [protected])]),
        "group_names": json.dumps([str(g) for g in dataset.group_names]),
        "class_names": json.dumps([str(c) for c in dataset.class_names]),
    }


def registry_tags(record: RunRecord, plan: ReleasePlan, dataset: GroupedDataset,
                  data_version: str) -> dict[str, str]:
    """The tags of a registered model version, each a machine-readable value: method, seed,
    dataset, guarantee, both ε (``inf`` without guarantee) and their accountants, δ, noise,
    data version, what it predicts for which groups (target, protected attributes, group
    names) and the test headline as fractions (what :mod:`dpfair.tracking.model_registry`'s champion
    rule reads), with the fairness disparities of :mod:`dpfair.fairness.rates` where
    released."""
    release = plan.methods[record.label]
    bounded = release.has_epsilon
    run, method = ((release.accountant_run, release.accountant) if bounded
                   else (accounting.ACCOUNTANT_NONE,) * 2)
    return _tags(record, dataset, data_version, release.guarantee,
                 release.epsilon_run if bounded else math.inf,
                 release.epsilon if bounded else math.inf, plan.epsilon_total, release.delta,
                 release.reproducible, (run, method, plan.accountant_total))


def _tags(record: RunRecord, dataset: GroupedDataset, data_version: str, guarantee: str,
          eps_run: float, eps_method: float, eps_total: float, delta: float,
          reproducible: bool, accountants: tuple[str, str, str]) -> dict[str, str]:
    """``accountants``: those of the training run's, the method's and the total's ε."""
    return {
        "method": record.label, "seed": str(record.seed), "dataset": dataset.name,
        "privacy_guarantee": guarantee, "epsilon_training_run": tag_number(eps_run),
        EPSILON_TAG: tag_number(eps_method), "epsilon_pipeline_total": tag_number(eps_total),
        "epsilon_accountants": json.dumps(dict(zip(
            ("training_run", "method", "pipeline_total"), accountants, strict=True))),
        "delta": f"{delta:g}", "noise": "replayable" if reproducible else "secret",
        "data_version": data_version,
        **_what_is_predicted(dataset),
        **{k: tag_number(record.headline[k]) for k in COMPARED},
        **{k: tag_number(record.headline[k]) for k in DISPARITIES if k in record.headline},
        "source_run_id": record.run_id,
    }


def register_standalone(params: Params, dataset: GroupedDataset, result: TrainResult,
                        record: RunRecord) -> dict[str, str]:
    """``dpfair train --register``: the standalone run's model as a version (tag
    ``standalone``), under the champion rule as a pipeline's. Its ε is its own run's (the
    standalone release); ``epsilon_pipeline_total`` is that too (no pipeline)."""
    tracking, settings = params.tracking, params.pipeline.registry
    name = settings.name or f"{tracking.experiment_prefix}-{dataset.name}"
    version = client(tracking).get_run(record.run_id).data.tags.get("dpfair.data_version", "")
    accountant = accounting.spend(result.event, result.delta).accountant
    tags = {**_tags(record, dataset, version, result.privacy_guarantee, record.epsilon,
                    record.epsilon, record.epsilon, result.delta, result.reproducible,
                    (accountant,) * 3),
            "standalone": "true"}
    worst, gap = (100 * record.headline[k] for k in ("worst_group_accuracy",
                                                     "largest_group_gap"))
    description = (f"{record.label}, seed {record.seed}, trained by `dpfair train` (no "
                   f"pipeline): test worst-group accuracy {worst:.1f}%, largest gap between "
                   f"groups {gap:.1f} points; ε {epsilon_text(record.epsilon)} at δ "
                   f"{result.delta:g} for this run. Preprocessing: "
                   f"{preprocessing_note(dataset)}.")
    return model_registry.register(tracking, name, record.model_uri, record.run_id, tags,
                             description, criterion=settings.criterion,
                             model_description=model_description(dataset.name))


def version_description(record: RunRecord, plan: ReleasePlan, dataset: GroupedDataset,
                        rule: str) -> str:
    """A registered version's own description: its fairness in percent, what its ε covers,
    the test metrics' note, how it was selected and its preprocessing."""
    worst, gap = (100 * record.headline[k] for k in ("worst_group_accuracy",
                                                     "largest_group_gap"))
    release = plan.methods[record.label]
    noise = REPLAYABLE_NOISE if release.reproducible else SECRET_NOISE
    return (f"{record.label}, seed {record.seed}: test worst-group accuracy {worst:.1f}%, "
            f"largest gap between groups {gap:.1f} points. {release.epsilon_note}. "
            f"{plan.test_note()}. Noise: {noise}. Selected as {rule}. Preprocessing: "
            f"{preprocessing_note(dataset)}.")


def register_model(params: Params, tracking: TrackingConfig, dataset: GroupedDataset,
                   runs: list[RunRecord], plan: ReleasePlan, data_tags: dict[str, str],
                   parent_run_id: str) -> dict[str, str] | None:
    """Register the selected final model (:func:`select_model`) in MLflow's Model Registry as
    a new version of ``pipeline.registry.name`` with :func:`registry_tags` and its own
    description; it becomes ``@challenger``, and ``@champion`` by the rule of
    :mod:`dpfair.tracking.model_registry` (``pipeline.registry.criterion``). The pipeline run's
    tag ``dpfair.registered_model`` holds ``NAME/VERSION`` or ``none`` (why: its description).
    Returns ``{"name", "version", "champion"}``, or None (registry disabled, or no candidate)."""
    settings = params.pipeline.registry
    if not settings.enabled:
        set_tags(tracking, parent_run_id, {"dpfair.registered_model": "none"})
        return None
    record, rule = select_model(runs, plan, settings.method)
    if record is None:
        set_tags(tracking, parent_run_id, {"dpfair.registered_model": "none"})
        add_description(tracking, parent_run_id, f"dpfair.registered_model: none: {rule}")
        return None
    name = settings.name or f"{tracking.experiment_prefix}-{dataset.name}"
    version = dataset.meta.get("data_version") or data_tags.get("dpfair.data_version", "")
    tags = {**registry_tags(record, plan, dataset, version), "pipeline_run_id": parent_run_id}
    registered = model_registry.register(
        tracking, name, record.model_uri, record.run_id, tags,
        version_description(record, plan, dataset, rule), criterion=settings.criterion,
        model_description=model_description(dataset.name))
    set_tags(tracking, parent_run_id,
             {"dpfair.registered_model": f"{registered['name']}/{registered['version']}"})
    return registered


def model_description(dataset: str) -> str:
    """The registered model's description (each version has its own)."""
    return (f"dpfair models trained on {dataset}. @champion is the version `dpfair predict "
            f"--model NAME` serves; @challenger the newest. Each version's description says "
            "its method, ε and fairness.")
