"""DVC metrics and plot tables of a pipeline run, read from the results table it wrote.

The ``evaluate`` stage of ``dvc.yaml`` (``dpfair evaluate RESULTS_CSV --out DIR``) turns the
run's ``results.csv`` (:func:`dpfair.pipeline.summary.summarise`: one row per method, cells
``"mean ± se"`` in the units of :func:`dpfair.fairness.format_table`, the two ε columns of
:mod:`dpfair.release.plan` and a last row with the run's total ε) into

- ``metrics.json``, DVC's metrics: the short, flat set of :data:`SHORT`, which ``dvc metrics
  show`` and ``dvc exp show`` fit in 120 columns: ``epsilon_total`` (with noisy test metrics
  also ``epsilon_test_total``) and ``worst.<method>``, the worst group's test accuracy.
- ``details.json`` (an output, not a DVC metric): every figure, per method: ``worst``,
  ``accuracy_gap`` (the largest accuracy gap between two groups), ``cost_gap`` (the largest
  privacy-cost gap between groups; Esipova et al. 2023, Eq. 1), all fractions (0.85, never
  85: the percent of the results table divided by 100), ``epsilon`` (released for the
  method) and ``epsilon_run`` (one training run); and ``group_accuracy.<method>.<group>``
  (every group by name, fractions). Only numbers that the results table already publishes:
  no training-set counts, and no ε for a release without a DP guarantee (the non-private
  reference, heuristic methods): such a method has its label in ``privacy.<method>``
  instead, and a replayable run its ``note.<method>``, as in MLflow. With noisy test
  metrics, also ``epsilon_test`` per method and ``epsilon_test_total`` (the test split's ε,
  a different set of rows); with exact ones, ``test_metrics`` says that no ε covers them.
  ``epsilon_accountant.<method>`` and ``epsilon_total_accountant`` name the accountant of
  each ε (the results table's accountant column). ``fairness.<measure>.<method>.<group>``:
  the selection and error rates per group and their disparities (group ``all``) with their
  privacy cost against the reference (:data:`FAIRNESS_CSV`, fractions, mean over seeds). They
  are not in metrics.json: the default four methods' worst-group accuracies already take 116
  of its 120 columns.
- ``group_accuracy.csv``: test accuracy (a fraction) per method and group (every group and
  the worst group), for ``dvc plots``.
- ``epsilon_accuracy.csv``: per method with an ε, the ε released and the worst-group accuracy.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from dpfair.errors import DataError
from dpfair.release.labels import EPSILON_ACCOUNTANT, EPSILON_METHOD, EPSILON_RUN, EPSILON_TEST

#: exact test metrics, as the results table and MLflow say: no ε covers them
TEST_METRICS_LABEL = "exact: not covered by ε (held-out test rows)"

WORST = "acc_worst_group"  # the table's worst-group column
ACC_GAP = "acc_gap_max"  # the largest accuracy gap between two groups
COST_GAPS = ("pi_gap_max", "pi_gap")  # the largest privacy-cost gap, then the pair's
TOTAL_ROW = "run total"  # how the row of the run's total ε starts (ReleasePlan.total_label)
#: DVC's metrics (metrics.json): what `dvc metrics show` and `dvc exp show` fit in 120 columns
SHORT = ("epsilon_total", "epsilon_test_total", "worst")
#: Beside results.csv: every fairness measure per method and group, mean and SE over seeds
#: (:func:`dpfair.fairness.rate_tables.long_summary`), read into details.json's ``fairness``
FAIRNESS_CSV = "fairness.csv"
#: Beside results.csv: the dataset's groups in order, ``experiment.pair`` and the group with
#: the fewest test rows (:func:`dpfair.pipeline.summary.group_facts`), what the terminal
#: table chooses its columns by
GROUPS_JSON = "groups.json"


def number(cell: str) -> float | None:
    """The mean of a ``"mean ± se"`` cell or an ε cell; None for ``-``, ``∞`` or a label."""
    head = str(cell).split("±")[0].strip()
    try:
        value = float(head)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def read_results(path: str | Path) -> pd.DataFrame:
    """The results table as strings, indexed by its row labels (a DataError when it is not a
    results table)."""
    try:
        table = pd.read_csv(path, index_col=0, dtype=str, keep_default_na=False)
    except (OSError, ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise DataError(f"cannot read {path} as a CSV table ({type(exc).__name__}: {exc}); "
                        "give the results.csv of a pipeline run's results directory") from None
    missing = [c for c in (EPSILON_RUN, EPSILON_METHOD) if c not in table.columns]
    if missing or not any(str(c).startswith("acc_") for c in table.columns):
        raise DataError(f"{path} is not a results table of `dpfair run` (no accuracy or ε "
                        f"columns; it has: {', '.join(map(str, table.columns))}); give the "
                        "results.csv of a pipeline run's results directory")
    return table


def _method_rows(table: pd.DataFrame) -> dict[str, pd.Series]:
    """Rows by method label (a label's note in parentheses, e.g. replayable noise, dropped
    from the key and kept in the row's ``note``)."""
    rows = {}
    for label, row in table.iterrows():
        label = str(label)
        if label.startswith(TOTAL_ROW):
            continue
        name, _, note = label.partition(" (")
        rows[name] = row.copy()
        rows[name]["note"] = note.rstrip(")")
    return rows


def _fraction(percent: float | None) -> float | None:
    """A results-table percentage as a fraction (four decimals: the table's one of a percent,
    no false precision)."""
    return None if percent is None else round(percent / 100.0, 4)


def _group_accuracies(row: pd.Series) -> dict[str, float]:
    """Group -> accuracy (a fraction) of a method's row: every ``acc_<group>`` and the
    worst."""
    out = {}
    for col, cell in row.items():
        col = str(col)
        value = _fraction(number(cell)) if col.startswith("acc_") and col != ACC_GAP else None
        if value is not None:
            out["worst group" if col == WORST else col.removeprefix("acc_")] = value
    return out


def method_metrics(row: pd.Series) -> dict[str, Any]:
    """The DVC metrics of one method's row (see the module docstring)."""
    groups = _group_accuracies(row)
    named = [v for g, v in groups.items() if g != "worst group"]
    worst = groups.get("worst group", min(named) if named else None)
    gap = next((number(row[c]) for c in COST_GAPS if c in row and number(row[c]) is not None),
               None)
    metrics: dict[str, Any] = {
        "group_accuracy": {g: v for g, v in groups.items() if g != "worst group"} or None,
        "worst": worst,
        "accuracy_gap": _fraction(number(row[ACC_GAP])) if ACC_GAP in row else None,
        "cost_gap": _fraction(gap),
        "epsilon": number(row[EPSILON_METHOD]),
        "epsilon_run": number(row[EPSILON_RUN]),
        "epsilon_test": number(row[EPSILON_TEST]) if EPSILON_TEST in row else None,
    }
    if metrics["epsilon"] is not None and row.get(EPSILON_ACCOUNTANT):
        metrics["epsilon_accountant"] = str(row[EPSILON_ACCOUNTANT])
    if row["note"]:
        metrics["note"] = row["note"]
    if number(row[EPSILON_RUN]) is None and str(row[EPSILON_RUN]).strip() not in ("", "-"):
        metrics["privacy"] = str(row[EPSILON_RUN])  # no ε: the label MLflow shows too
    return {k: v for k, v in metrics.items() if v is not None}


def evaluate(table: pd.DataFrame) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]:
    """``(metrics, group accuracy rows, ε vs accuracy rows)`` of a results table."""
    rows = _method_rows(table)
    methods = {m: method_metrics(row) for m, row in rows.items()}
    metrics: dict[str, Any] = {}
    totals = [number(table.at[i, EPSILON_METHOD]) for i in table.index
              if str(i).startswith(TOTAL_ROW)]
    if totals and totals[0] is not None:
        metrics["epsilon_total"] = totals[0]
        accountants = [table.at[i, EPSILON_ACCOUNTANT] for i in table.index
                       if str(i).startswith(TOTAL_ROW) and EPSILON_ACCOUNTANT in table.columns]
        if accountants and accountants[0]:
            metrics["epsilon_total_accountant"] = accountants[0]
    if EPSILON_TEST in table.columns:
        test_totals = [number(table.at[i, EPSILON_TEST]) for i in table.index
                       if str(i).startswith(TOTAL_ROW)]
        if test_totals and test_totals[0] is not None:
            metrics["epsilon_test_total"] = test_totals[0]
    else:
        metrics["test_metrics"] = TEST_METRICS_LABEL
    for key in ("worst", "accuracy_gap", "cost_gap", "epsilon", "epsilon_run", "epsilon_test",
                "epsilon_accountant", "group_accuracy", "privacy", "note"):
        if per_method := {m: v[key] for m, v in methods.items() if key in v}:
            metrics[key] = per_method
    groups = pd.DataFrame(
        [{"method": m, "group": g, "method_group": f"{m} · {g}", "accuracy": acc}
         for m, row in rows.items() for g, acc in _group_accuracies(row).items()],
        columns=["method", "group", "method_group", "accuracy"])
    curve = pd.DataFrame(
        [{"method": m, "epsilon": v["epsilon"], "worst_group_accuracy": v["worst"]}
         for m, v in methods.items() if "epsilon" in v and "worst" in v],
        columns=["method", "epsilon", "worst_group_accuracy"])
    return metrics, groups, curve


def fairness_details(rows: pd.DataFrame) -> dict[str, dict[str, dict[str, float]]]:
    """``{measure: {method: {group: mean}}}`` of a :data:`FAIRNESS_CSV` (the disparities and
    their privacy cost under group ``all``); an undefined mean is left out."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for row in rows.itertuples(index=False):
        value = number(row.mean)
        if value is not None:
            out.setdefault(str(row.measure), {}).setdefault(str(row.method), {})[
                str(row.group)] = round(value, 4)
    return out


def write_outputs(results_csv: str | Path, out_dir: str | Path) -> dict[str, Path]:
    """Write ``metrics.json`` (:data:`SHORT`: DVC's metrics), ``details.json`` (every metric
    of :func:`evaluate`), ``group_accuracy.csv`` and ``epsilon_accuracy.csv`` under ``out_dir``
    from ``results_csv``; returns their paths."""
    metrics, groups, curve = evaluate(read_results(results_csv))
    measures = Path(results_csv).with_name(FAIRNESS_CSV)
    if measures.exists():
        metrics["fairness"] = fairness_details(pd.read_csv(measures, keep_default_na=False))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in ("metrics.json", "details.json",
                                           "group_accuracy.csv", "epsilon_accuracy.csv")}
    for name, content in (("metrics.json", {k: metrics[k] for k in SHORT if k in metrics}),
                          ("details.json", metrics)):
        paths[name].write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n",
                               encoding="utf-8")
    groups.to_csv(paths["group_accuracy.csv"], index=False)
    curve.to_csv(paths["epsilon_accuracy.csv"], index=False)
    return paths
