"""The terminal's results table fits 120 columns, with short headers and a legend, however
many groups and however long the labels (the full table stays in results.md)."""

from __future__ import annotations

import io

import pandas as pd
from rich.console import Console

from dpfair.cli.results import WIDTH, compact_table
from dpfair.privacy.accounting import ACCOUNTANT_PLD, ACCOUNTANT_PROFILE
from dpfair.release.plan import EPSILON_ACCOUNTANT, EPSILON_METHOD, EPSILON_RUN


def _frame(groups: list[str]) -> pd.DataFrame:
    cell = "84.1 ± 12.3"
    columns = {**{f"acc_{g}": cell for g in groups}, "acc_worst_group": cell,
               **{f"pi_{g}": cell for g in groups}, "pi_gap_max": cell,
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
        assert "acc worst" in text and "ε run" in text and "loss" not in text
        assert "run total" in text and any("ε method" in line for line in legend)
        assert max(len(line) for line in legend) <= WIDTH
        named = " ".join(legend)  # each accountant once, whole
        assert named.count(ACCOUNTANT_PLD) == 1 and named.count("Koskela, Redberg") == 1
