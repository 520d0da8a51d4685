"""Fairness of private training: per-run metrics, privacy cost, tables and significance tests.

Modules, bottom to top (ARCHITECTURE.md):

* :mod:`.rates` -- selection and error rates per group and their disparities (demographic
  parity, equalized odds, equal opportunity), Fairlearn's definitions, from exact or noisy
  confusion counts; numpy only.
* :mod:`.metrics` -- one model's test metrics per group and class (:func:`group_metrics`),
  the layer :mod:`dpfair.training` uses; numpy only.
* :mod:`.costs` -- privacy cost pi_k, excess risk R_k, their gaps and Xu's equal cost of
  privacy, on arrays of seeds x groups; numpy only.
* :mod:`.records` -- the canonical long table of many runs (:func:`runs_frame`) and its
  per-seed views; pandas.
* :mod:`.tables` -- mean ± SE comparison tables in the papers' layouts; pandas.
* :mod:`.rate_tables` -- the rates' and disparities' tables over seeds, with their privacy
  cost against the reference; pandas.
* :mod:`.significance` -- one-sided Wilcoxon tests against a baseline; pandas and scipy.

Every public name is available here. The names of the pandas/scipy modules are loaded on
first use, so ``import dpfair.fairness`` (and :mod:`dpfair.training` through it) loads only
numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpfair.fairness.costs import (
    XU_TAU,
    EqualCost,
    equal_cost_of_privacy,
    excess_risk,
    max_gap,
    pair_gap,
    privacy_cost,
)
from dpfair.fairness.metrics import (
    ACCURACY,
    ALL,
    COUNT,
    LOSS,
    MACRO_ACCURACY,
    PROB_FLOOR,
    RECORD_COLUMNS,
    WORST_CLASS_ACCURACY,
    WORST_GROUP_ACCURACY,
    GroupMetrics,
    Record,
    group_metrics,
    intersect_groups,
    metric_records,
    per_sample_nll,
)
from dpfair.lazy import lazy_getattr

if TYPE_CHECKING:  # what the lazy names below are, for type checkers
    from dpfair.fairness.records import cost_by_seed as cost_by_seed
    from dpfair.fairness.records import mean_se as mean_se
    from dpfair.fairness.records import methods_in_order as methods_in_order
    from dpfair.fairness.records import metric_by_seed as metric_by_seed
    from dpfair.fairness.records import metric_table as metric_table
    from dpfair.fairness.records import runs_frame as runs_frame
    from dpfair.fairness.records import seed_table as seed_table
    from dpfair.fairness.significance import ALPHA as ALPHA
    from dpfair.fairness.significance import MIN_PAIRS as MIN_PAIRS
    from dpfair.fairness.significance import higher_is_better as higher_is_better
    from dpfair.fairness.significance import seeds_needed as seeds_needed
    from dpfair.fairness.significance import significance_table as significance_table
    from dpfair.fairness.significance import wilcoxon_vs_baseline as wilcoxon_vs_baseline
    from dpfair.fairness.tables import Stats as Stats
    from dpfair.fairness.tables import comparison_stats as comparison_stats
    from dpfair.fairness.tables import comparison_table as comparison_table
    from dpfair.fairness.tables import format_cell as format_cell
    from dpfair.fairness.tables import format_table as format_table

# name -> submodule, for the names that need pandas or scipy (imported on first access)
_LAZY = {
    **dict.fromkeys(
        ("cost_by_seed", "mean_se", "methods_in_order", "metric_by_seed", "metric_table",
         "runs_frame", "seed_table"),
        "records",
    ),
    **dict.fromkeys(("Stats", "comparison_stats", "comparison_table", "format_cell",
                     "format_table"), "tables"),
    **dict.fromkeys(
        ("ALPHA", "MIN_PAIRS", "higher_is_better", "seeds_needed", "significance_table",
         "wilcoxon_vs_baseline"),
        "significance",
    ),
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "ACCURACY",
    "ALL",
    "COUNT",
    "LOSS",
    "MACRO_ACCURACY",
    "PROB_FLOOR",
    "RECORD_COLUMNS",
    "WORST_CLASS_ACCURACY",
    "WORST_GROUP_ACCURACY",
    "XU_TAU",
    "EqualCost",
    "GroupMetrics",
    "Record",
    "equal_cost_of_privacy",
    "excess_risk",
    "group_metrics",
    "intersect_groups",
    "max_gap",
    "metric_records",
    "pair_gap",
    "per_sample_nll",
    "privacy_cost",
    *_LAZY,
]
