"""dpfair.fairness.tables: the papers' table layouts on the hand-computed ``runs`` (conftest.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpfair.fairness.tables import comparison_stats, comparison_table, format_table


def test_comparison_table_esipova_layout(runs: pd.DataFrame) -> None:
    table = comparison_table(runs, ("a", "b"), labels=("2", "8"))
    # the column layout of Esipova et al. 2023 Table 2 (reference/published.yaml)
    assert list(table.columns) == [
        "acc_2", "acc_8", "pi_2", "pi_8", "pi_gap", "loss_2", "loss_8", "R_2", "R_8", "R_gap"
    ]
    assert list(table.index) == ["nonprivate", "dpsgd"]
    # nonprivate: acc a (.90, .92) -> 91.0 +- 1.0 (std .01414 / sqrt 2); no pi / R
    assert table.loc["nonprivate"].tolist() == [
        "91.0 ± 1.0", "79.0 ± 1.0", "-", "-", "-", "0.20 ± 0.00", "0.60 ± 0.10", "-", "-", "-"
    ]
    # dpsgd: pi_a per seed .91-.85, .91-.87 = .06, .04; pi_b .19, .29;
    # pi_a - pi_b = -.13, -.25 -> |mean| .19, se .06; R_a .1, .3; R_b .3, .5; R gap .2 +- 0
    assert table.loc["dpsgd"].tolist() == [
        "86.0 ± 1.0", "55.0 ± 5.0", "5.0 ± 1.0", "24.0 ± 5.0", "19.0 ± 6.0",
        "0.40 ± 0.10", "1.00 ± 0.10", "0.20 ± 0.10", "0.40 ± 0.10", "0.20 ± 0.00",
    ]
    md = table.to_markdown()
    assert "| dpsgd" in md and "19.0 ± 6.0" in md
    csv = table.to_csv()
    assert csv.splitlines()[0] == "method,acc_2,acc_8,pi_2,pi_8,pi_gap,loss_2,loss_8,R_2,R_8,R_gap"


def test_comparison_table_paired_reference(runs: pd.DataFrame) -> None:
    table = comparison_table(runs, ("a", "b"), paired_reference=True)
    # same-seed reference: pi_a .90-.85, .92-.87 = .05, .05; pi_b .20, .28
    assert table.loc["dpsgd", "pi_a"] == "5.0 ± 0.0"
    assert table.loc["dpsgd", "pi_b"] == "24.0 ± 4.0"
    assert table.loc["dpsgd", "acc_a"] == "86.0 ± 1.0"  # accuracies unchanged


def test_comparison_table_xu_layout(runs: pd.DataFrame) -> None:
    table = comparison_table(runs, ("all", "a", "b"), labels=("total", "M", "F"), layout="xu")
    assert list(table.columns) == [
        "acc_total", "acc_M", "acc_F", "delta_total", "delta_M", "delta_F", "delta_gap",
        "equal_cost",
    ]
    # Delta = private - reference mean: total .71 - .87, M .86 - .91, F .55 - .79
    assert table.loc["dpsgd", "delta_total"] == "-0.1600 ± 0.0100"
    assert table.loc["dpsgd", "delta_M"] == "-0.0500 ± 0.0100"
    assert table.loc["dpsgd", "delta_F"] == "-0.2400 ± 0.0500"
    assert table.loc["dpsgd", "delta_gap"] == "0.1900"  # over M, F only (not total)
    assert table.loc["dpsgd", "equal_cost"] == "no"
    assert table.loc["nonprivate", "equal_cost"] == "-"
    lenient = comparison_table(runs, ("a", "b"), layout="xu", tau=0.2)
    assert lenient.loc["dpsgd", "equal_cost"] == "yes"


def test_comparison_stats_max_gap_and_errors(runs: pd.DataFrame) -> None:
    stats_ = comparison_stats(runs, ("a", "b"), max_gap_groups=("a", "b", "all"))
    # pi_all per seed: .87 - .70, .87 - .72 = .17, .15 -> mean .16; gaps vs a .11, vs b .08;
    # the largest pair gap is (a, b) = .19
    assert stats_.loc["dpsgd", ("pi_gap_max", "mean")] == pytest.approx(0.19)
    # R_a .2, R_b .4, R_all .3 -> largest pair gap (a, b) = .2 with se 0
    assert stats_.loc["dpsgd", ("R_gap_max", "mean")] == pytest.approx(0.2)
    assert stats_.loc["dpsgd", ("R_gap_max", "se")] == pytest.approx(0.0, abs=1e-12)
    assert stats_.loc["dpsgd", ("pi_gap", "n")] == 2
    # worst group per seed: dpsgd min(.85, .60, .70) = .60, min(.87, .50, .72) = .50
    assert stats_.loc["dpsgd", ("acc_worst_group", "mean")] == pytest.approx(0.55)
    assert stats_.loc["dpsgd", ("acc_worst_group", "se")] == pytest.approx(0.05)
    assert stats_.loc["nonprivate", ("acc_worst_group", "mean")] == pytest.approx(0.79)
    assert "acc_worst_group" not in comparison_stats(runs, ("a", "b")).columns.get_level_values(0)
    with pytest.raises(ValueError, match="reference method 'sgd'"):
        comparison_table(runs, ("a", "b"), reference="sgd")
    with pytest.raises(ValueError, match="groups \\['c'\\]"):
        comparison_table(runs, ("a", "c"))
    with pytest.raises(ValueError, match="named pair"):
        comparison_table(runs, ("a", "b", "all"))


def test_format_table_cells() -> None:
    cols = pd.MultiIndex.from_product([["pi_M", "loss_M"], ["mean", "se", "n"]])
    frame = pd.DataFrame([[-0.0004, 0.001, 5, 0.51234, np.nan, 1]], index=["m"], columns=cols)
    frame.columns = frame.columns.set_names(["column", "stat"])
    out = format_table(frame, decimals={"loss": 3})
    # -0.04 % rounds to 0.0 (not "-0.0"); a single seed has no SE
    assert out.loc["m"].tolist() == ["0.0 ± 0.1", "0.512"]
    assert format_table(frame, percent=False).loc["m", "pi_M"] == "-0.0004 ± 0.0010"


def test_groups_layout_shows_every_group_by_name(runs: pd.DataFrame) -> None:
    """Three groups (``all`` stands in for a third): each one's accuracy and privacy cost, the
    worst group, the largest accuracy and cost gaps; the named pair adds its own gaps."""
    stats_ = comparison_stats(runs, ("a", "b", "all"), layout="groups")
    assert list(dict.fromkeys(stats_.columns.get_level_values(0))) == [
        "acc_a", "acc_b", "acc_all", "pi_a", "pi_b", "pi_all", "acc_worst_group",
        "acc_gap_max", "pi_gap_max"]
    dpsgd = stats_.loc["dpsgd"]
    # pi per seed: a .06, .04; b .19, .29; all .17, .15 (reference means .91, .79, .87)
    assert [dpsgd[(f"pi_{g}", "mean")] for g in ("a", "b", "all")] == pytest.approx(
        [0.05, 0.24, 0.16])
    # accuracy spread per seed: .85 - .60 = .25, .87 - .50 = .37 -> .31 +- .06
    assert dpsgd[("acc_gap_max", "mean")] == pytest.approx(0.31)
    assert dpsgd[("acc_gap_max", "se")] == pytest.approx(0.06)
    assert dpsgd[("pi_gap_max", "mean")] == pytest.approx(0.19)
    assert np.isnan(stats_.loc["nonprivate", ("pi_b", "mean")])
    paired = comparison_table(runs, ("a", "b", "all"), layout="groups", pair=("a", "b"))
    assert paired.loc["dpsgd", "pi_gap"] == "19.0 ± 6.0"
    assert paired.loc["dpsgd", "acc_all"] == "71.0 ± 1.0"
    no_costs = comparison_stats(runs, ("a", "b", "all"), layout="groups", costs=False)
    assert not [c for c in no_costs.columns.get_level_values(0) if c.startswith("pi_")]


@pytest.mark.parametrize("paired", [False, True])
def test_largest_gaps_are_the_largest_of_every_pairs_table(paired: bool) -> None:
    """``pi_gap_max`` / ``R_gap_max`` of many groups: the pair whose own esipova table has
    the largest |mean gap|, that table's cell exactly (mean, SE, seeds), a NaN included."""
    import itertools

    from dpfair import fairness as F

    rng = np.random.default_rng(5)
    groups = [f"g{k}" for k in range(6)]
    rows = [{"method": m, "seed": s, "group": g, "metric": k, "value": float(rng.uniform())}
            for m in ("nonprivate", "dpsgd", "dpsgd_f") for s in range(3) for g in groups
            for k in ("accuracy", "loss")]
    rows[-1]["value"] = float("nan")  # one seed's loss of one group
    runs = F.runs_frame(rows)
    stats = comparison_stats(runs, groups[:2], max_gap_groups=groups, paired_reference=paired)
    for col, gap in (("pi_gap_max", "pi_gap"), ("R_gap_max", "R_gap")):
        for m in ("dpsgd", "dpsgd_f"):
            cells = [comparison_stats(runs, pair, paired_reference=paired).loc[m, gap]
                     for pair in itertools.combinations(groups, 2)]
            best = max(cells, key=lambda c: c["mean"])
            assert stats.loc[m, col].tolist() == pytest.approx(best.tolist(), rel=0, abs=0)
        assert np.isnan(stats.loc["nonprivate", (col, "mean")])
