"""Tables of the practitioners' measures (:mod:`dpfair.fairness.rates`) over many runs: mean ±
SE over seeds per method, and their privacy cost against the non-private reference.

The privacy cost of a disparity ``d`` is ``Δd = mean_s d(θ~_s) - mean d(θ*)``, the change DP
training makes to it, read like π (Esipova et al. 2023, Sec. 3.1, Eq. 1) but signed so that
a positive cost is a less fair model: for a difference (fairest at 0) the increase, for the
demographic-parity ratio (fairest at 1) the decrease. Inputs are the canonical records of
:func:`dpfair.fairness.records.runs_frame`; cells are :func:`dpfair.fairness.tables.format_table`'s
``"mean ± se"`` strings, 3 decimals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from dpfair.fairness.metrics import ALL
from dpfair.fairness.rates import (
    DISPARITIES,
    HIGHER_IS_FAIRER,
    MEASURES,
    SHORT,
    positive_classes,
    suffix,
)
from dpfair.fairness.records import mean_se, methods_in_order
from dpfair.fairness.tables import format_cell

DIGITS = 3
COST = "Δ {}"  # the column of a disparity's privacy cost (its short name, rates.SHORT)


def disparity_stats(runs: pd.DataFrame, reference: str | None) -> dict[str, dict[str, float]]:
    """Method -> ``{<disparity>: mean over seeds, "<disparity>_privacy_cost": Δd}`` (the cost
    only for the methods other than ``reference``, when it ran): what MLflow and DVC get."""
    out: dict[str, dict[str, float]] = {}
    for method, d, values in _disparities(runs):
        out.setdefault(method, {})[d] = mean_se(values)[0]
    if reference is not None and reference in out:
        for method, d, values in _disparities(runs):
            if method != reference and d in out[reference]:
                out[method][f"{d}_privacy_cost"] = mean_se(_cost(values, d, out[reference][d]))[0]
    return out


def disparity_table(runs: pd.DataFrame, reference: str | None) -> pd.DataFrame:
    """Method x (each disparity, its privacy cost) table of ``"mean ± se"`` over seeds, the
    columns named by :data:`dpfair.fairness.rates.SHORT`; empty when the runs released no
    disparity."""
    rows: dict[str, dict[str, str]] = {}
    for method, d, values in _disparities(runs):
        rows.setdefault(method, {})[SHORT[d]] = format_cell(*mean_se(values), DIGITS)
    if reference is not None and reference in rows:
        means = {d: mean_se(v)[0] for m, d, v in _disparities(runs) if m == reference}
        for method, d, values in _disparities(runs):
            if method != reference:
                rows[method][COST.format(SHORT[d])] = format_cell(
                    *mean_se(_cost(values, d, means[d])), DIGITS)
    if not rows:
        return pd.DataFrame()
    order = methods_in_order(runs, reference) if reference in rows else list(rows)
    columns = [c for d in DISPARITIES for c in (SHORT[d], COST.format(SHORT[d]))]
    table = pd.DataFrame.from_dict(rows, orient="index").reindex(order)
    return table[[c for c in columns if c in table.columns]].fillna("-")


def group_rate_table(runs: pd.DataFrame, groups: Sequence[str], suffix: str = ""
                     ) -> pd.DataFrame:
    """``method · group`` x measure table of ``"mean ± se"`` over seeds for the positive
    class of ``suffix`` (:func:`dpfair.fairness.rates.suffix`); empty when no rate was
    released."""
    names = [f"{m}{suffix}" for m in MEASURES]
    sel = runs[runs["metric"].isin(names) & runs["group"].isin(list(groups))]
    if sel.empty:
        return pd.DataFrame()
    cells = sel.groupby(["method", "group", "metric"], sort=False)["value"].apply(
        lambda v: format_cell(*mean_se(v), DIGITS)).unstack("metric")
    cells = cells.reindex(columns=[n for n in names if n in cells.columns])
    cells.index = [f"{m} · {g}" for m, g in cells.index]
    return cells.rename(columns=lambda c: c.removesuffix(suffix)) if suffix else cells


def long_summary(runs: pd.DataFrame, reference: str | None) -> pd.DataFrame:
    """Every measure of :mod:`dpfair.fairness.rates` the runs released, mean and SE over seeds,
    as rows ``method, group, measure, mean, se`` (disparities under group :data:`ALL`, with
    their privacy cost as ``<disparity>_privacy_cost``): the results directory's
    ``fairness.csv``, which DVC's details read."""
    rates_only = runs[runs["metric"].map(
        lambda m: m.split("_class")[0] in (*MEASURES, *DISPARITIES))]
    rows = [{"method": m, "group": g, "measure": k, **_stats(v)}
            for (m, g, k), v in rates_only.groupby(["method", "group", "metric"],
                                                   sort=False)["value"]]
    if reference is not None:
        means = {d: mean_se(v)[0] for m, d, v in _disparities(runs) if m == reference}
        rows += [{"method": m, "group": ALL, "measure": f"{d}_privacy_cost",
                  **_stats(_cost(v, d, means[d]))}
                 for m, d, v in _disparities(runs) if m != reference and d in means]
    return pd.DataFrame(rows, columns=["method", "group", "measure", "mean", "se"])


def measure_tables(runs: pd.DataFrame, groups: Sequence[str], classes: Sequence[str],
                   reference: str | None) -> dict[str, pd.DataFrame]:
    """results.md's sections of these measures: the disparities with their privacy cost
    against ``reference`` (:func:`disparity_table`), then the rates per group for each
    positive class (:func:`group_rate_table`); none when the runs released none
    (``test_metrics.fairness: false``)."""
    worst = " (worst over the classes, one-vs-rest)" if len(classes) > 2 else ""
    tables = {f"Fairness measures across groups{worst} (mean ± SE over seeds; dp: "
              "demographic parity, eo: equalized odds, eop: equal opportunity; Δ: the privacy "
              "cost, the change against the non-private reference, > 0 less fair)":
              disparity_table(runs, reference)}
    for c in positive_classes(len(classes)):
        tables[f"Selection and error rates per group (positive class {classes[c]!r})"] = \
            group_rate_table(runs, groups, suffix(c, len(classes)))
    return {title: table for title, table in tables.items() if not table.empty}


def with_shown(table: pd.DataFrame, runs: pd.DataFrame, shown: Sequence[str],
               reference: str | None) -> pd.DataFrame:
    """A results ``table`` (indexed by method) with the columns of the measures
    ``experiment.show`` names (:data:`dpfair.fairness.rates.SHORT`) and their privacy cost,
    which the terminal's table shows (:mod:`dpfair.cli.results`)."""
    measures = disparity_table(runs, reference)
    columns = [c for name in shown for c in (name, COST.format(name))
               if c in measures.columns]
    return table.join(measures[columns]).fillna({c: "-" for c in columns}) if columns else table


def _stats(values: pd.Series) -> dict[str, float]:
    mean, se = mean_se(values)
    return {"mean": mean, "se": se}


def _disparities(runs: pd.DataFrame) -> list[tuple[str, str, pd.Series]]:
    """(method, disparity, its values over seeds) of the unsuffixed disparities."""
    sel = runs[(runs["group"] == ALL) & runs["metric"].isin(DISPARITIES)]
    return [(str(m), str(d), v.set_index("seed")["value"])
            for (m, d), v in sel.groupby(["method", "metric"], sort=False)]


def _cost(values: pd.Series, disparity: str, reference_mean: float) -> pd.Series:
    """Each seed's privacy cost of ``disparity`` (module docstring); NaN stays NaN."""
    if math.isnan(reference_mean):
        return values * math.nan
    sign = -1.0 if disparity in HIGHER_IS_FAIRER else 1.0
    return sign * (values - reference_mean)
