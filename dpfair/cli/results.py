"""The results table as a terminal shows it: a few short columns that fit 120 characters, with
a legend; the full table (every group, loss and cost column, the notes) stays in
``results.md`` beside ``results.csv``, and in MLflow.

Units: accuracies and costs in percent (a human display; MLflow and DVC hold fractions), each
cell ``mean ± SE`` over seeds, as in the full table.
"""

from __future__ import annotations

import textwrap

import pandas as pd
from rich.table import Table

from dpfair.release.plan import EPSILON_ACCOUNTANT, EPSILON_METHOD, EPSILON_RUN, EPSILON_TEST

__all__ = ["WIDTH", "compact_table"]

WIDTH = 120  # the terminal width the table is built for
_MAX_GROUPS = 4  # per-group accuracy columns shown; beyond, the worst group alone
_LABEL = 28  # the longest method label shown (the full one is in results.md)
_GROUP = 12  # the longest group name in a header


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _epsilon(cell: str) -> str:
    """An ε cell in short: the number, ``∞``, or ``none`` for a label (no DP guarantee)."""
    head = cell.split(" ")[0]
    try:
        float(head)
    except ValueError:
        return "∞" if head == "∞" else "none" if cell else ""
    return head


def _columns(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """``(column, short header)`` of the compact table, in order."""
    groups = [c for c in frame.columns if c.startswith("acc_") and c != "acc_worst_group"]
    if len(groups) > _MAX_GROUPS:
        groups = groups[:2]
    chosen = [(c, f"acc {_short(c.removeprefix('acc_'), _GROUP)}") for c in groups]
    if "acc_worst_group" in frame.columns:
        chosen.append(("acc_worst_group", "acc worst"))
    gap = next((c for c in ("pi_gap_max", "pi_gap") if c in frame.columns), None)
    if gap is not None:
        chosen.append((gap, "cost gap"))
    chosen += [(c, h) for c, h in ((EPSILON_RUN, "ε run"), (EPSILON_METHOD, "ε method"),
                                   (EPSILON_TEST, "ε test")) if c in frame.columns]
    return chosen


def compact_table(frame: pd.DataFrame, title: str) -> tuple[Table, list[str]]:
    """The terminal table of a results table (``results.csv`` read with its row labels as
    index, cells as strings) and its legend lines."""
    columns = _columns(frame)
    labels = ["run total" if str(label).startswith("run total") else _short(str(label), _LABEL)
              for label in frame.index]
    table = Table(title=title)
    table.add_column("method", min_width=max(map(len, labels), default=6), overflow="fold")
    for _, header in columns:
        table.add_column(header, justify="right", no_wrap=True)
    for label, (_, row) in zip(labels, frame.iterrows(), strict=True):
        cells = [str(row[c]) for c, _ in columns]
        cells = [_epsilon(cell) if header.startswith("ε") else cell
                 for cell, (_, header) in zip(cells, columns, strict=True)]
        table.add_row(label, *cells, style="bold" if label == "run total" else None)
    legend = ["acc <group>: the group's test accuracy, % (mean ± SE over seeds); acc worst: "
              "the worst group's",
              "cost gap: the largest gap between groups' privacy costs (accuracy points lost "
              "to DP; Esipova et al. 2023, Eq. 1)",
              "ε run: one training run; ε method: everything released for the method (search "
              "+ all seeds); none: no DP guarantee",
              "run total: every release of the run composed"
              + ("; ε test: the noisy test metrics'" if EPSILON_TEST in frame.columns else "")]
    return table, legend + _accountants(frame)


def _accountants(frame: pd.DataFrame) -> list[str]:
    """Legend lines naming the accountants of the ε figures (each row's is in results.md)."""
    if EPSILON_ACCOUNTANT not in frame.columns:
        return []
    names = dict.fromkeys(name.split(": ", 1)[-1] for cell in frame[EPSILON_ACCOUNTANT]
                          for name in str(cell).split("; ") if name)
    return textwrap.wrap("ε accountants (each row's in results.md): " + "; ".join(names),
                         WIDTH)
