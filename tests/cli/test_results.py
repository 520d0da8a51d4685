"""The terminal's results table fits 120 columns, with short headers and a legend, however
many groups and however long the labels (the full table stays in results.md): every group
has a column or is named as left out, the worst group, the pair and the group with the fewest
test rows first, and no other column (the largest gap) passes for a group."""

from __future__ import annotations

import io

import pandas as pd
from rich.console import Console

from dpfair.accounting.accountant import ACCOUNTANT_PLD, ACCOUNTANT_PROFILE
from dpfair.cli.results import WIDTH, compact_table
from dpfair.release.labels import EPSILON_ACCOUNTANT, EPSILON_METHOD, EPSILON_RUN


def _frame(groups: list[str], accuracy: dict[str, str] | None = None) -> pd.DataFrame:
    """A results table as summarise writes it (the groups layout): every group's accuracy and
    cost, the worst group, the largest accuracy gap, the cost gaps, the ε columns."""
    cell = "84.1 ± 12.3"
    columns = {**{f"acc_{g}": (accuracy or {}).get(g, cell) for g in groups},
               "acc_worst_group": cell, "acc_gap_max": "3.2 ± 0.4",
               **{f"pi_{g}": cell for g in groups}, "pi_gap_max": cell, "pi_gap": cell,
               **{f"loss_{g}": "0.37 ± 0.01" for g in groups},
               EPSILON_RUN: "non-private reference: no DP guarantee", EPSILON_METHOD: "5.14",
               EPSILON_ACCOUNTANT: f"run: {ACCOUNTANT_PLD}; method: {ACCOUNTANT_PROFILE}"}
    rows = ["nonprivate", "dpsgd_global_adapt (replayable noise: a test setting)",
            "run total: private releases composed (released without guarantee, not covered: "
            "non-private reference)"]
    return pd.DataFrame([columns] * len(rows), index=rows)


def test_the_table_fits_120_columns_with_a_legend():
    for groups in (["majority", "minority"],
                   [f"a very long group name {i}" for i in range(9)]):
        table, legend = compact_table(_frame(groups), "digits: pipeline run 0123456789abcdef")
        out = io.StringIO()
        Console(file=out, width=200, soft_wrap=True).print(table, width=WIDTH)
        text = out.getvalue()
        assert max(len(line) for line in text.splitlines()) <= WIDTH, text
        assert "worst" in text and "ε" in text and "loss" not in text
        assert "run total" in text and "ε method" in " ".join(legend)
        assert max(len(line) for line in legend) <= WIDTH
        named = " ".join(legend)  # each accountant once, whole
        assert named.count(ACCOUNTANT_PLD) == 1 and named.count("Koskela, Redberg") == 1


def _shown(frame: pd.DataFrame, facts: dict | None) -> tuple[str, list[str]]:
    table, legend = compact_table(frame, "pipeline run 0123456789abcdef", facts)
    out = io.StringIO()
    Console(file=out, width=200, soft_wrap=True).print(table, width=WIDTH)
    text = out.getvalue()
    assert max(len(line) for line in [*text.splitlines(), *legend]) <= WIDTH, text
    return "\n".join(text.splitlines()[1:3]), legend  # the header's two lines, the legend


def _facts(groups: list[str], pair: list[str] | None = None, fewest: str | None = None) -> dict:
    return {"groups": groups, "pair": pair, "fewest_test_rows": fewest}


def _visible_or_named(groups: list[str], header: str, legend: list[str]) -> list[str]:
    """The groups with a column; each other one is named as left out, with the count."""
    shown = [g for g in groups if g in header]
    left = [g for g in groups if g not in shown]
    text = " ".join(legend)
    assert all(g in text.split("left out here")[-1] for g in left), (header, text)
    assert not left or f"{len(left)} of {len(groups)} left out here" in text, text
    return shown


def test_three_and_four_groups_each_have_a_column_and_no_gap_passes_for_a_group():
    """Issue 43: a 3-group table showed ``acc gap_max`` as a group; a 4-group one dropped two
    without a word. With the default run's labels and two seeds' cells every group has its
    column; with long labels and wide cells, those without one are named."""
    labels = ["nonprivate", "dpsgd", "dpsgd_f", "dpsgd_global_adapt",
              "run total: private releases composed"]
    for groups in (["Nord", "Sued", "Ost"], ["w × Nord", "w × Sued", "m × Nord", "m × Sued"]):
        facts = _facts(groups, fewest=groups[-1])
        frame = _frame(groups).iloc[[0, 1, 1, 1, 2]].set_axis(labels).replace(
            "84.1 ± 12.3", "84.1 ± 2.3")
        header, legend = _shown(frame, facts)
        assert _visible_or_named(groups, header, legend) == groups, header
        assert "gap_max" not in header and "left out" not in " ".join(legend)
        header, legend = _shown(_frame(groups), facts)  # long labels, wide cells
        assert groups[-1] in _visible_or_named(groups, header, legend)  # the fewest rows
        assert "gap_max" not in header
        # a run written before groups.json: the groups from the columns, still not the gap
        header, legend = _shown(frame, None)
        assert _visible_or_named(groups, header, legend) == groups and "gap_max" not in header


def test_many_groups_show_the_worst_the_pair_and_the_fewest_and_name_the_others():
    """Ten groups (digits' classes) do not fit: the worst group (by name), both groups of the
    pair and the group with the fewest test rows have columns; the legend says which is which,
    how many groups are left out, which, and where every group is."""
    groups = [f"class {d}" for d in range(10)]
    accuracy = {g: "90.0 ± 1.0" for g in groups} | {"class 8": "12.5 ± 3.0"}
    header, legend = _shown(_frame(groups, accuracy),
                            _facts(groups, pair=["class 2", "class 8"], fewest="class 5"))
    text = " ".join(legend)
    for group in ("class 8", "class 2", "class 5"):
        assert group in header, header
    assert "worst class 8 (every method)" in text and "pair class 2 vs class 8" in text
    assert "fewest test rows class 5" in text
    shown = [g for g in groups if g in header]
    left = [g for g in groups if g not in shown]
    assert left and f"{len(left)} of 10 left out here" in text, text
    assert all(g in text for g in left) and "dpfair results --full" in text


def test_the_fairness_measures_experiment_show_names_have_columns_and_a_legend():
    """``experiment.show: [dp_ratio, eo_diff]`` adds their columns (and privacy cost) to
    results.csv; the terminal shows them before any group it has no room for."""
    groups = [f"region {i}" for i in range(6)]
    frame = _frame(groups)
    for column in ("dp_ratio", "Δ dp_ratio", "eo_diff", "Δ eo_diff"):
        frame[column] = "0.812 ± 0.031"
    header, legend = _shown(frame, _facts(groups))
    assert "dp" in header and "ratio" in header and "Δ eo" in header and "diff" in header
    assert "demographic parity" in " ".join(legend)
    header, legend = _shown(_frame(groups), _facts(groups))
    assert "ratio" not in header and "demographic parity" not in " ".join(legend)
    every = _frame(groups)  # all four and their costs: more than 120 columns hold
    for name in ("dp_diff", "dp_ratio", "eo_diff", "eop_diff"):
        every[name] = every[f"Δ {name}"] = "0.1 ± 0.01"
    header, legend = _shown(every, _facts(groups))
    assert "dp" in header and "not shown for want of room: " in " ".join(legend)
    assert "eop_diff" in " ".join(legend).split("want of room")[1]
