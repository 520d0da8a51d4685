"""The canonical table of many runs' results and its per-seed views.

Results of many runs travel in one canonical long format, built by :func:`runs_frame`: a
``pandas.DataFrame`` with one row per (method, seed, group, metric) and columns

=========  =======  ==================================================================
column     dtype    meaning
=========  =======  ==================================================================
method     str      training method, e.g. ``"dpsgd"``; the reference is ``"nonprivate"``
seed       int      random seed; runs of different methods with equal seeds are *paired*
group      str      group name, ``"all"`` (:data:`ALL`) for the whole test set, or
                    ``"class:<name>"`` for a class
metric     str      ``"accuracy"`` (a fraction in [0, 1]), ``"loss"``, ``"count"``,
                    ``"macro_accuracy"``, ``"worst_group_accuracy"``, ... (the constants
                    of :mod:`dpfair.fairness.metrics`)
value      float    the number; NaN when undefined (e.g. a group absent from the test set)
=========  =======  ==================================================================

Other columns (dataset, epsilon, ...) are kept but ignored. One run's rows come from
:meth:`dpfair.fairness.metrics.GroupMetrics.to_records`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt
import pandas as pd

from dpfair.fairness.metrics import ACCURACY, ALL, LOSS, RECORD_COLUMNS


def runs_frame(records: Iterable[Mapping[str, object]] | pd.DataFrame) -> pd.DataFrame:
    """The canonical long table of per-run results (see the module docstring).

    Accepts a list of dicts or a DataFrame with at least the columns ``method, seed, group,
    metric, value``; casts their types, keeps extra columns, and rejects duplicate
    (method, seed, group, metric) rows (filter by dataset or epsilon first).
    """
    frame = pd.DataFrame(records if isinstance(records, pd.DataFrame) else list(records))
    if frame.empty:
        raise ValueError("no run records: no training finished, there is nothing to summarise")
    missing = [c for c in RECORD_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(
            f"run records lack columns {missing} (they have {list(frame.columns)}); "
            f"need {list(RECORD_COLUMNS)}"
        )
    frame = frame.astype(
        {"method": str, "seed": np.int64, "group": str, "metric": str, "value": np.float64}
    )
    keys = list(RECORD_COLUMNS[:-1])
    dup = frame.duplicated(keys, keep=False)
    if dup.any():
        first = frame.loc[dup, keys].iloc[0].to_dict()
        raise ValueError(f"{int(dup.sum())} duplicate run records, e.g. {first}")
    return frame.reset_index(drop=True)


def mean_se(values: npt.ArrayLike) -> tuple[float, float]:
    """Mean and standard error ``std(ddof=1) / sqrt(n)`` over seeds, NaN ignored.

    The SE is NaN with fewer than two values (Esipova et al. 2023 report mean +- one SE
    over 5 seeds, Sec. 6.1).
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[~np.isnan(v)]
    if v.size == 0:
        return math.nan, math.nan
    se = float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else math.nan
    return float(v.mean()), se


def metric_by_seed(runs: pd.DataFrame, metric: str, group: str = ALL) -> pd.Series:
    """One metric of one group as a series indexed by ``(method, seed)``, named ``metric``
    (the input of :func:`dpfair.fairness.significance.wilcoxon_vs_baseline`, e.g. macro
    accuracy of :data:`ALL`)."""
    sel = runs[(runs["metric"] == metric) & (runs["group"] == group)]
    if sel.empty:
        raise ValueError(f"no {metric!r} records for group {group!r}")
    return sel.set_index(["method", "seed"])["value"].rename(metric)


def methods_in_order(runs: pd.DataFrame, reference: str) -> list[str]:
    """The reference method first, then the others in order of first appearance."""
    methods = list(dict.fromkeys(runs["method"]))
    if reference not in methods:
        raise ValueError(f"reference method {reference!r} not in runs (methods: {methods})")
    return [reference] + [m for m in methods if m != reference]


def metric_table(runs: pd.DataFrame, metric: str, groups: Sequence[str]) -> pd.DataFrame:
    """One metric as a ``(method, seed) x groups`` table; a group without records is an
    error, a missing value is NaN."""
    sel = runs[(runs["metric"] == metric) & runs["group"].isin(list(groups))]
    table = sel.pivot(index=["method", "seed"], columns="group", values="value")
    absent = [g for g in groups if g not in table.columns]
    if absent:
        raise ValueError(f"no {metric!r} records for groups {absent}")
    return table[list(groups)]


def cost_by_seed(
    runs: pd.DataFrame,
    groups: Sequence[str],
    *,
    kind: Literal["pi", "R"] = "pi",
    reference: str = "nonprivate",
    paired_reference: bool = False,
) -> pd.DataFrame:
    """Per-seed privacy cost or excess risk, ``(method, seed) x groups``, reference excluded.

    ``pi_k,s = acc_k(theta*) - acc_k(theta~_s)`` (Esipova et al. 2023, Sec. 3.1, Eq. 1) or
    ``R_k,s = L_k(theta~_s) - L_k(theta*)`` (Eq. 2); their mean over seeds is ``pi_k``
    (``R_k``). ``theta*`` values are the reference's mean over its seeds or, with
    ``paired_reference=True``, the reference run of the same seed (which must exist).
    """
    metric, sign = {"pi": (ACCURACY, -1.0), "R": (LOSS, 1.0)}[kind]
    table = metric_table(runs, metric, list(groups))
    methods = methods_in_order(runs, reference)
    ref = table.loc[reference]
    private = table.drop(index=reference, level="method")
    if paired_reference:
        seeds = private.index.get_level_values("seed")
        missing = sorted(set(seeds) - set(ref.index))
        if missing:
            raise ValueError(f"paired_reference: no {reference!r} run for seeds {missing}")
        base = ref.loc[seeds].set_axis(private.index)
    else:
        base = ref.mean(axis=0)
    cost = sign * (private - base)
    return cost.loc[[m for m in methods[1:] if m in cost.index.get_level_values("method")]]


def seed_table(
    runs: pd.DataFrame,
    groups: tuple[str, str],
    *,
    reference: str = "nonprivate",
    labels: tuple[str, str] | None = None,
    paired_reference: bool = False,
) -> pd.DataFrame:
    """Per-seed values of the Esipova et al. 2023 table columns for groups ``(a, b)``.

    Index ``(method, seed)``; columns ``acc_a, acc_b, pi_a, pi_b, pi_gap, loss_a, loss_b,
    R_a, R_b, R_gap`` with ``a, b`` the ``labels`` (default: the group names); pi and R as
    in :func:`cost_by_seed` (NaN for the reference), ``pi_gap = |pi_a,s - pi_b,s|`` and
    ``R_gap = |R_a,s - R_b,s|`` (Sec. 3.1) of each seed: the samples a significance test of
    the gaps needs (:func:`dpfair.fairness.significance.significance_table`). The tables
    report instead the gap of the expectations, ``|mean_s(pi_a,s - pi_b,s)|``
    (:func:`dpfair.fairness.tables.comparison_stats`), which can be smaller. Accuracies are
    fractions.
    """
    la, lb = labels or groups
    a, b = groups
    acc = metric_table(runs, ACCURACY, groups)
    loss = metric_table(runs, LOSS, groups)
    kw = {"reference": reference, "paired_reference": paired_reference}
    pi = cost_by_seed(runs, groups, kind="pi", **kw).reindex(acc.index)
    risk = cost_by_seed(runs, groups, kind="R", **kw).reindex(acc.index)
    out = pd.DataFrame(
        {
            f"acc_{la}": acc[a],
            f"acc_{lb}": acc[b],
            f"pi_{la}": pi[a],
            f"pi_{lb}": pi[b],
            "pi_gap": (pi[a] - pi[b]).abs(),
            f"loss_{la}": loss[a],
            f"loss_{lb}": loss[b],
            f"R_{la}": risk[a],
            f"R_{lb}": risk[b],
            "R_gap": (risk[a] - risk[b]).abs(),
        }
    )
    methods = methods_in_order(runs, reference)
    return out.loc[[m for m in methods if m in out.index.get_level_values("method")]]
