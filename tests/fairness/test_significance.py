"""dpfair.fairness.significance: one-sided Wilcoxon tests against exact hand-computed p-values."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from dpfair.fairness.records import metric_by_seed, seed_table
from dpfair.fairness.significance import (
    higher_is_better,
    seeds_needed,
    significance_table,
    wilcoxon_vs_baseline,
)


def _series(name: str, method: list[float], baseline: list[float]) -> pd.Series:
    idx = [("m", s) for s in range(len(method))] + [("dpsgd", s) for s in range(len(baseline))]
    return pd.Series(
        method + baseline, index=pd.MultiIndex.from_tuples(idx, names=["method", "seed"]),
        name=name,
    )


def test_wilcoxon_exact_hand_computed() -> None:
    base = [0.50] * 5
    # method better on all 5 seeds: W+ = 1+2+3+4+5 = 15, exact P(W+ >= 15) = 1/2^5
    res = wilcoxon_vs_baseline(_series("accuracy", [0.51, 0.52, 0.53, 0.54, 0.55], base))
    assert res.loc[0, "p_value"] == pytest.approx(1 / 32)
    assert res.loc[0, "statistic"] == 15 and res.loc[0, "n_pairs"] == 5
    # d = +1, +2, -3, +4, +5 (ranks = |d|): W+ = 12; P(W+ >= 12) = P(rank sum of the
    # negatives <= 3) = #{{}, {1}, {2}, {3}, {1,2}} / 32 = 5/32
    res = wilcoxon_vs_baseline(_series("accuracy", [0.51, 0.52, 0.47, 0.54, 0.55], base))
    assert res.loc[0, "p_value"] == pytest.approx(5 / 32)
    # lower is better for a loss: the mirror image gives the same p
    res = wilcoxon_vs_baseline(_series("loss", [0.49, 0.48, 0.53, 0.46, 0.45], base))
    assert res.loc[0, "p_value"] == pytest.approx(5 / 32)
    # a loss worse on 4 of 5 seeds, d = +1, +2, -3, +4, +5: W+ = 12, alternative "less":
    # P(W+ <= 12) = 1 - P(W+ >= 13) = 1 - #{{}, {1}, {2}} / 32 = 29/32
    res = wilcoxon_vs_baseline(_series("loss", [0.51, 0.52, 0.47, 0.54, 0.55], base))
    assert res.loc[0, "p_value"] == pytest.approx(29 / 32)


def test_wilcoxon_pairs_by_seed_and_edge_cases() -> None:
    # baseline has seeds 0..5, method 0..4 (seed 5 unpaired, dropped)
    res = wilcoxon_vs_baseline(_series("acc_8", [0.6] * 5, [0.5] * 6))
    assert res.loc[0, "n_pairs"] == 5 and res.loc[0, "mean_diff"] == pytest.approx(0.1)
    res = wilcoxon_vs_baseline(_series("pi_gap", [0.1] * 4, [0.2] * 4))
    assert math.isnan(res.loc[0, "p_value"]) and "only 4 paired seeds" in res.loc[0, "note"]
    res = wilcoxon_vs_baseline(_series("R_gap", [0.1] * 5, [0.1] * 5))
    assert res.loc[0, "p_value"] == 1.0 and "all paired differences are zero" in res.loc[0, "note"]
    with pytest.raises(ValueError, match="better"):
        wilcoxon_vs_baseline(_series("count", [1.0] * 5, [1.0] * 5))
    res = wilcoxon_vs_baseline(_series("count", [2.0] * 5, [1.0] * 5), better="higher")
    assert res.loc[0, "p_value"] == pytest.approx(1 / 32)


def test_higher_is_better() -> None:
    assert higher_is_better("acc_8") and higher_is_better("macro_accuracy")
    assert higher_is_better("delta_M")
    for col in ("loss_2", "pi_8", "R_W", "pi_gap", "R_gap_max", "delta_gap"):
        assert not higher_is_better(col)


def test_significance_table_and_metric_by_seed(runs: pd.DataFrame) -> None:
    per_seed = seed_table(runs, ("a", "b"))
    p = significance_table(per_seed, baseline="nonprivate", min_pairs=2, alpha=None)
    # dpsgd vs nonprivate on acc_a: d = -.05, -.05, one-sided "greater": W+ = 0, p = 1
    assert p.loc["dpsgd", "acc_a"] == pytest.approx(1.0)
    assert math.isnan(p.loc["dpsgd", "pi_a"])  # the reference has no pi: no pairs
    acc = metric_by_seed(runs, "accuracy", "all")
    assert acc.name == "accuracy" and acc[("dpsgd", 1)] == pytest.approx(0.72)


def test_significance_needs_enough_seeds_to_reach_alpha(runs: pd.DataFrame) -> None:
    assert seeds_needed(0.05) == 5 and seeds_needed(0.01) == 7  # 1/32 < .05; 1/128 < .01
    per_seed = seed_table(runs, ("a", "b"))  # two seeds per method
    table = significance_table(per_seed, baseline="nonprivate", min_pairs=2)
    assert list(table.columns) == ["note"]  # no p-value from 2 seeds (smallest p is 0.25)
    assert "2 paired seeds" in table.loc["dpsgd", "note"]
    assert "at least 5 to reach p < 0.05" in table.loc["dpsgd", "note"]


def test_significance_shows_p_values_with_enough_seeds() -> None:
    values = _series("acc_8", [0.51, 0.52, 0.53, 0.54, 0.55], [0.50] * 5)
    table = significance_table(values.to_frame(), baseline="dpsgd")
    assert "note" not in table.columns
    assert table.loc["m", "acc_8"] == pytest.approx(1 / 32)
