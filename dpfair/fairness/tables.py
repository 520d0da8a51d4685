"""Comparison tables of many runs in the papers' layouts: mean ± SE per method and column.

``comparison_stats`` holds the numbers (fractions), ``format_table`` renders them as
``"mean ± se"`` strings, ``comparison_table`` does both. Two layouts: Esipova et al. 2023's
Tables 2-5 (accuracy, privacy cost pi, loss and excess risk R of a named pair of groups, and
their gaps) and Xu et al. 2021's Table 1 (accuracy, Delta and the equal-cost verdict). The
definitions are those of :mod:`dpfair.fairness.costs`; the input is the canonical runs frame
of :func:`dpfair.fairness.records.runs_frame`. A third layout, ``groups``, shows every group of
a dataset by name (what a pipeline run reports, :mod:`dpfair.pipeline.summary`), with the
named pair's gaps when one is given.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd

from dpfair.fairness.costs import XU_TAU, equal_cost_of_privacy
from dpfair.fairness.metrics import ACCURACY, ALL
from dpfair.fairness.records import (
    cost_by_seed,
    mean_se,
    methods_in_order,
    metric_table,
    seed_table,
)

Stats = dict[str, dict[str, tuple[float, float, int]]]  # column -> method -> (mean, se, n)


def _cell_stats(values: pd.Series) -> tuple[float, float, int]:
    return _array_stats(values.to_numpy())


def _array_stats(values: np.ndarray) -> tuple[float, float, int]:
    """Mean, SE (:func:`mean_se`) and number of the values that are not NaN."""
    mean, se = mean_se(values)
    return mean, se, int(np.count_nonzero(~np.isnan(values)))


def comparison_stats(
    runs: pd.DataFrame,
    groups: Sequence[str],
    *,
    reference: str = "nonprivate",
    labels: Sequence[str] | None = None,
    layout: Literal["esipova", "xu", "groups"] = "esipova",
    paired_reference: bool = False,
    tau: float = XU_TAU,
    max_gap_groups: Sequence[str] | None = None,
    pair: Sequence[str] | None = None,
    costs: bool = True,
) -> pd.DataFrame:
    """Numbers behind :func:`comparison_table`: index method, columns ``(column, stat)``
    with stat in ``mean, se, n``; accuracies and costs as fractions.

    ``layout="esipova"`` (Tables 2-5 of Esipova et al. 2023): ``acc_a, acc_b, pi_a, pi_b,
    pi_gap, loss_a, loss_b, R_a, R_b, R_gap`` for the named pair ``groups=(a, b)``. The gap
    follows Eq. 1's expectation: ``pi_gap = |mean_s(pi_a,s - pi_b,s)|`` with the SE of the
    per-seed difference (so ``pi_gap = |pi_a - pi_b|`` of the table's means). With
    ``max_gap_groups``, also ``acc_worst_group`` (each seed's lowest accuracy among those
    groups, mean and SE over seeds) and ``pi_gap_max`` / ``R_gap_max``: the largest such gap
    over all pairs of those groups (its SE that of the maximising pair).

    ``layout="xu"`` (Table 1 of Xu et al. 2021): ``acc_<g>`` and ``delta_<g>`` (private
    minus reference accuracy, seed means) for every group in ``groups`` (include
    :data:`ALL` for the "Total" column), ``delta_gap = max |Delta_i - Delta_j|`` over the
    non-``all`` groups and ``equal_cost`` (1.0 when ``delta_gap <= tau``, else 0.0).

    ``layout="groups"`` (every group by name): ``acc_<g>`` and, with ``costs``, the privacy
    cost ``pi_<g>`` (Esipova et al. 2023, Sec. 3.1) for every group in ``groups``, then
    ``acc_worst_group``, ``acc_gap_max`` (each seed's largest accuracy difference between two
    groups, mean and SE over seeds) and ``pi_gap_max``; with ``pair=(a, b)`` also that pair's
    ``pi_gap`` and ``R_gap`` (Eq. 1-2, as in the esipova layout). Without ``costs`` (no
    reference run) no privacy cost is shown, and ``reference`` only orders the rows.
    """
    labels = list(labels or groups)
    if len(labels) != len(groups):
        raise ValueError(f"{len(labels)} labels for {len(groups)} groups")
    if layout == "esipova":
        if len(groups) != 2:
            raise ValueError(f"the esipova layout compares a named pair, got groups {groups}")
        cols = _esipova_stats(runs, tuple(groups), tuple(labels), reference, paired_reference)
        if max_gap_groups is not None:
            cols.update(_worst_group_stats(runs, max_gap_groups))
            cols.update(_max_gap_stats(runs, max_gap_groups, reference, paired_reference))
    elif layout == "groups":
        cols = _groups_stats(runs, list(groups), reference, paired_reference, costs)
        if pair is not None:
            paired = _esipova_stats(runs, (pair[0], pair[1]), (pair[0], pair[1]), reference,
                                    paired_reference)
            cols.update({k: paired[k] for k in ("pi_gap", "R_gap")})
    elif layout == "xu":
        cols = _xu_stats(runs, list(groups), labels, reference, tau)
    else:
        raise ValueError(f"unknown layout {layout!r}; use 'esipova', 'xu' or 'groups'")
    methods = methods_in_order(runs, reference)
    frame = pd.DataFrame(
        {(col, stat): [cols[col][m][i] for m in methods] for col in cols
         for i, stat in enumerate(("mean", "se", "n"))},
        index=pd.Index(methods, name="method"),
    )
    frame.columns = pd.MultiIndex.from_tuples(frame.columns, names=["column", "stat"])
    return frame


def _esipova_stats(
    runs: pd.DataFrame,
    groups: tuple[str, str],
    labels: tuple[str, str],
    reference: str,
    paired: bool,
) -> Stats:
    per_seed = seed_table(
        runs, groups, reference=reference, labels=labels, paired_reference=paired
    )
    cols: Stats = {}
    for col in per_seed.columns:
        cols[col] = {m: _cell_stats(v) for m, v in per_seed[col].groupby(level="method")}
    for gap, kind in (("pi_gap", "pi"), ("R_gap", "R")):
        diff = per_seed[f"{kind}_{labels[0]}"] - per_seed[f"{kind}_{labels[1]}"]
        cols[gap] = {m: _abs_mean(_cell_stats(v)) for m, v in diff.groupby(level="method")}
    return cols


def _abs_mean(cell: tuple[float, float, int]) -> tuple[float, float, int]:
    return abs(cell[0]), cell[1], cell[2]


def _worst_group_stats(runs: pd.DataFrame, groups: Sequence[str]) -> Stats:
    """``acc_worst_group``: per seed the lowest test accuracy among ``groups``."""
    worst = metric_table(runs, ACCURACY, list(groups)).min(axis=1)
    return {"acc_worst_group": {m: _cell_stats(v) for m, v in worst.groupby(level="method")}}


def _groups_stats(runs: pd.DataFrame, groups: list[str], reference: str, paired: bool,
                  costs: bool) -> Stats:
    """Every group's accuracy (and privacy cost), the worst group and the largest gaps."""
    acc = metric_table(runs, ACCURACY, groups)
    cols: Stats = {f"acc_{g}": {m: _cell_stats(v) for m, v in acc[g].groupby(level="method")}
                   for g in groups}
    if costs:
        pi = cost_by_seed(runs, groups, kind="pi", reference=reference,
                          paired_reference=paired)
        for g in groups:
            cells = {m: _cell_stats(v) for m, v in pi[g].groupby(level="method")}
            cols[f"pi_{g}"] = {m: cells.get(m, (math.nan, math.nan, 0))
                               for m in methods_in_order(runs, reference)}
    cols.update(_worst_group_stats(runs, groups))
    spread = acc.max(axis=1) - acc.min(axis=1)
    cols["acc_gap_max"] = {m: _cell_stats(v) for m, v in spread.groupby(level="method")}
    if costs and len(groups) > 1:
        cols.update({"pi_gap_max": _max_gap_stats(runs, groups, reference, paired)["pi_gap_max"]})
    return cols


def _max_gap_stats(
    runs: pd.DataFrame, groups: Sequence[str], reference: str, paired: bool
) -> Stats:
    """``pi_gap_max`` and ``R_gap_max``: per method the largest mean gap over every pair of
    ``groups`` (as :func:`_esipova_stats` gives a pair's; each kind's per-seed costs formed
    once, every pair's per-seed differences from them)."""
    cols: Stats = {}
    pairs = list(itertools.combinations(range(len(groups)), 2))
    for name, kind in (("pi_gap_max", "pi"), ("R_gap_max", "R")):
        cost = cost_by_seed(runs, groups, kind=kind, reference=reference,
                            paired_reference=paired)[list(groups)]
        seeds = {m: t.to_numpy(dtype=np.float64) for m, t in cost.groupby(level="method")}
        cols[name] = {}
        for m in methods_in_order(runs, reference):
            if m not in seeds:  # the reference: no cost
                cols[name][m] = (math.nan, math.nan, 0)
                continue
            cells = [_abs_mean(_array_stats(seeds[m][:, i] - seeds[m][:, j])) for i, j in pairs]
            means = np.array([c[0] for c in cells])
            best = int(np.nanargmax(means)) if not np.isnan(means).all() else 0
            cols[name][m] = cells[best]
    return cols


def _xu_stats(
    runs: pd.DataFrame, groups: list[str], labels: list[str], reference: str, tau: float
) -> Stats:
    acc = metric_table(runs, ACCURACY, groups)
    ref = acc.loc[reference].mean(axis=0)
    cols: Stats = {}
    for g, lab in zip(groups, labels, strict=True):
        cols[f"acc_{lab}"] = {m: _cell_stats(v) for m, v in acc[g].groupby(level="method")}
    for g, lab in zip(groups, labels, strict=True):
        cols[f"delta_{lab}"] = {
            m: (math.nan, math.nan, 0) if m == reference else _cell_stats(v - ref[g])
            for m, v in acc[g].groupby(level="method")
        }
    parts = [g for g in groups if g != ALL]
    cols["delta_gap"], cols["equal_cost"] = {}, {}
    for m, table in acc.groupby(level="method"):
        if m == reference:
            cols["delta_gap"][m] = cols["equal_cost"][m] = (math.nan, math.nan, 0)
            continue
        verdict = equal_cost_of_privacy(acc.loc[reference][parts], table[parts], tau)
        cols["delta_gap"][m] = (verdict.max_gap, math.nan, len(table))
        cols["equal_cost"][m] = (float(verdict.equal), math.nan, len(table))
    return cols


def format_table(
    stats_frame: pd.DataFrame, *, percent: bool = True, decimals: Mapping[str, int] | None = None
) -> pd.DataFrame:
    """Cells ``"mean ± se"`` from :func:`comparison_stats`; ``"-"`` where undefined.

    With ``percent``, accuracy-scale columns (``acc_*``, ``pi_*``, ``delta_*``) are times
    100, as in Esipova et al.'s tables. ``decimals`` maps a column prefix (``acc``, ``pi``,
    ``loss``, ``R``, ``delta``) to digits; defaults: 1 for percent, 4 for fractions (Xu's
    Table 1), 2 for losses. ``equal_cost`` renders as ``yes``/``no``. The frame renders with
    ``.to_markdown()`` and ``.to_csv()``.
    """
    acc_digits = 1 if percent else 4
    digits = {"acc": acc_digits, "pi": acc_digits, "delta": acc_digits, "loss": 2, "R": 2}
    digits.update(decimals or {})
    columns = list(dict.fromkeys(stats_frame.columns.get_level_values("column")))
    out = pd.DataFrame(index=stats_frame.index, columns=columns, dtype=object)
    for col in columns:
        prefix = col.split("_")[0]
        scale = 100.0 if percent and prefix in ("acc", "pi", "delta") else 1.0
        for m in stats_frame.index:
            mean, se = stats_frame.at[m, (col, "mean")], stats_frame.at[m, (col, "se")]
            if col == "equal_cost":
                out.at[m, col] = "-" if math.isnan(mean) else ("yes" if mean else "no")
            else:
                out.at[m, col] = format_cell(mean * scale, se * scale, digits[prefix])
    return out


def format_cell(mean: float, se: float, digits: int) -> str:
    """``"mean ± se"`` at ``digits`` decimals; the mean alone without an SE; ``-`` for NaN."""
    if math.isnan(mean):
        return "-"
    mean = round(mean, digits) + 0.0  # "+ 0.0" turns a rounded -0.0 into 0.0
    if math.isnan(se):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def comparison_table(
    runs: pd.DataFrame, groups: Sequence[str], *, percent: bool | None = None,
    decimals: Mapping[str, int] | None = None, **options: Any,
) -> pd.DataFrame:
    """Method x column table of ``"mean ± se"`` strings in a paper's layout.

    ``options`` are :func:`comparison_stats`' (``reference``, ``labels``, ``layout``, ...; it
    names the columns); :func:`format_table` makes the cells. ``percent`` defaults to True for
    Esipova's and the groups layout (accuracies in %) and False for Xu's (fractions). Render
    with ``.to_markdown()`` or ``.to_csv(path)``.
    """
    frame = comparison_stats(runs, groups, **options)
    percent = options.get("layout") != "xu" if percent is None else percent
    return format_table(frame, percent=percent, decimals=decimals)
