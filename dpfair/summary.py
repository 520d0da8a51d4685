"""What a pipeline run reports (DESIGN.md sections 5 and 7): the results table with each
method's two ε columns and the run's total, the notes on what ε covers, the figures, and what
the pipeline's parent MLflow run holds (:func:`log_release`, :func:`log_summary`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dpfair import fairness, report
from dpfair.config import Params
from dpfair.data import GroupedDataset
from dpfair.experiment import REFERENCE, RunRecord
from dpfair.privacy import accounting
from dpfair.release import EPSILON_METHOD, EPSILON_RUN, ReleasePlan, epsilon_cells, epsilon_text
from dpfair.tracking import TrackingConfig, log_file, log_json, log_metrics, log_text, set_tags
from dpfair.training import REPLAYABLE_NOISE


@dataclass
class Summary:
    """The results of a pipeline run: the table, the p-values, the figures' paths and the
    notes on what ε covers (:meth:`dpfair.release.ReleasePlan.notes`)."""

    table: pd.DataFrame
    significance: pd.DataFrame
    figures: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        parts = ["## Per-group results (mean ± SE over seeds)", "", self.table.to_markdown()]
        if self.notes:
            parts += ["", *(f"- {note}" for note in self.notes)]
        if not self.significance.empty:
            parts += ["", "## One-sided Wilcoxon p-values against the baseline", "",
                      self.significance.to_markdown()]
        return "\n".join(parts) + "\n"


def log_release(tracking: TrackingConfig, run_id: str, plan: ReleasePlan) -> None:
    """The plan on the pipeline run: the total ε (with what it leaves out), each method's,
    the composed event, and the release notes as the run's description."""
    metrics = {"epsilon_total": plan.epsilon_total, "delta": plan.delta}
    metrics.update({f"epsilon_released/{m.label}": m.epsilon
                    for m in plan.methods.values() if m.has_epsilon})
    log_metrics(tracking, run_id, metrics)
    set_tags(tracking, run_id, {
        "dpfair.epsilon_total": plan.total_label,
        "mlflow.note.content": "\n".join(f"- {note}" for note in plan.notes()),
        **({"dpfair.noise": REPLAYABLE_NOISE} if plan.reproducible else {}),
    })
    log_text(tracking, run_id, accounting.event_to_json(plan.event_total), "dp_event_total.json")


def _bounds(trajectory: dict[str, list[float]]) -> dict[str, list[float]]:
    """The clip bounds of a trajectory, without its step index and released counts."""
    return {k: v for k, v in trajectory.items() if k != "step" and "released" not in k}


def summarise(params: Params, dataset: GroupedDataset, runs: list[RunRecord],
              out_dir: str | Path, plan: ReleasePlan) -> Summary:
    """Esipova-layout table with each method's two ε columns and the run's total ε
    (``plan``), Wilcoxon p-values against the baseline, and the figures. Without a finished
    training there is nothing to summarise: a ValueError says so."""
    if not runs:
        raise ValueError("no training finished: there is nothing to summarise")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frame = fairness.runs_frame([r for run_ in runs for r in run_.records])
    groups = tuple(params.experiment.pair or dataset.group_names[:2])
    methods = sorted({r.label for r in runs}, key=lambda m: (m != REFERENCE, m))
    has_reference = REFERENCE in methods
    table = fairness.comparison_table(
        frame, groups, reference=REFERENCE if has_reference else methods[0],
        max_gap_groups=list(dataset.group_names) if len(dataset.group_names) > 2 else None,
    )
    table = _with_release(table, plan)
    per_seed = fairness.seed_table(frame, groups,
                                   reference=REFERENCE if has_reference else methods[0])
    baseline = params.experiment.baseline
    significance = pd.DataFrame()
    if baseline in methods:
        significance = fairness.significance_table(per_seed, baseline=baseline, min_pairs=2)
    figures = {
        "group_accuracy": report.plot_group_accuracy(
            frame, out / "group_accuracy.png", groups=list(dataset.group_names)[:10],
            methods=methods),
        "training_curves": report.plot_training_curves(
            {m: [r.history for r in runs if r.label == m] for m in methods},
            out / "training_curves.png", groups=list(groups)),
    }
    if has_reference and len(methods) > 1:
        figures["privacy_cost"] = report.plot_privacy_cost(
            frame, out / "privacy_cost.png", reference=REFERENCE,
            groups=list(dataset.group_names)[:10],
            methods=[m for m in methods if m != REFERENCE])
    bounds = {r.label: _bounds(r.clip_trajectory) for r in runs
              if r.clip_trajectory and r.seed == params.experiment.seeds[0]}
    if bounds:
        figures["clip_bounds"] = report.plot_clip_bounds(bounds, out / "clip_bounds.png")
    notes = plan.notes()
    (out / "results.md").write_text(Summary(table, significance, notes=notes).markdown())
    table.to_csv(out / "results.csv")
    return Summary(table=table, significance=significance,
                   figures={k: str(v) for k, v in figures.items()}, notes=notes)


def _with_release(table: pd.DataFrame, plan: ReleasePlan) -> pd.DataFrame:
    """``table`` with each method's two ε columns, a last row holding the run's total ε, and
    the row of a reproducible method labelled so (:mod:`dpfair.release`)."""
    cells = pd.DataFrame([epsilon_cells(plan.methods[m]) for m in table.index],
                         index=table.index, columns=[EPSILON_RUN, EPSILON_METHOD])
    table = table.join(cells)
    table.loc[plan.total_label] = ""
    table.loc[plan.total_label, EPSILON_METHOD] = epsilon_text(plan.epsilon_total)
    return table.rename(index={m.label: f"{m.label} ({REPLAYABLE_NOISE})"
                               for m in plan.methods.values() if m.reproducible})


def log_summary(tracking: TrackingConfig, run_id: str, summary: Summary | None,
                out_dir: str | Path, failures: dict[str, str]) -> None:
    """The results table and figures on the pipeline run (if ``summary``: none when the
    summary failed), and the methods that failed."""
    out = Path(out_dir)
    if summary is not None:
        for name in ("results.md", "results.csv"):
            log_file(tracking, run_id, out / name, "results")
        for path in summary.figures.values():
            log_file(tracking, run_id, path, "figures")
    if failures:
        log_json(tracking, run_id, failures, "failures.json")
    set_tags(tracking, run_id, {"dpfair.failed_methods": ",".join(sorted(failures)) or "none"})
