"""The results table as a terminal shows it: a few short columns that fit 120 characters, with
a legend; the full table (every group, loss and cost column, the notes) stays in
``results.md`` beside ``results.csv``, and in MLflow.

Every group has a column when they all fit; otherwise the groups that matter: each method's
worst group, the two of ``experiment.pair`` and the group with the fewest test rows (the
facts of ``groups.json``, :func:`dpfair.pipeline.summary.group_facts`), and the legend names
the groups left out and where they are.

Units: accuracies and costs in percent (a human display; MLflow and DVC hold fractions), each
cell ``mean ± SE`` over seeds, as in the full table.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table

from dpfair.accounting.accountant import ACCOUNTANT_NONE
from dpfair.cli.console import WIDTH, console, percent, score
from dpfair.fairness.rate_tables import COST
from dpfair.fairness.rates import SHORT
from dpfair.pipeline.dvc_outputs import ACC_GAP, GROUPS_JSON, TOTAL_ROW, WORST, number
from dpfair.release.labels import EPSILON_ACCOUNTANT, EPSILON_METHOD, EPSILON_RUN, EPSILON_TEST

__all__ = ["WIDTH", "compact_table", "group_table", "print_results"]

_LABEL = 24  # the longest method label shown (the full one is in results.md)
_GROUP = 12  # the longest group name in a header
_LEFT = 12  # the most groups left out that the legend names
_FULL = "see results.md, `dpfair results --full`"


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


def _mean(cell: str) -> str:
    """A fairness measure's ``"mean ± se"`` cell as its mean (3 decimals) or ``-``."""
    value = number(cell)
    return "-" if value is None else f"{value:.3f}"


def _groups(frame: pd.DataFrame, facts: Mapping[str, Any] | None) -> list[str]:
    """The groups of the table, in the dataset's order: those of ``groups.json``, else (a run
    written before it) every ``acc_<group>`` column but the worst group's and the gap's."""
    if facts and facts.get("groups"):
        return [str(g) for g in facts["groups"] if f"acc_{g}" in frame.columns]
    return [str(c).removeprefix("acc_") for c in frame.columns
            if str(c).startswith("acc_") and c not in (WORST, ACC_GAP)]


def _method_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[[not str(label).startswith(TOTAL_ROW) for label in frame.index]]


def _worst(frame: pd.DataFrame, groups: Sequence[str]) -> dict[str, str]:
    """Method label -> its group with the lowest mean test accuracy."""
    out = {}
    for label, row in _method_rows(frame).iterrows():
        means = {g: number(row[f"acc_{g}"]) for g in groups}
        known = {g: v for g, v in means.items() if v is not None}
        if known:
            out[str(label)] = min(known, key=lambda g: known[g])
    return out


def _chosen(groups: Sequence[str], worst: Mapping[str, str], pair: Sequence[str],
            fewest: str | None) -> list[str]:
    """The groups that matter, most important first: worst, pair, fewest test rows."""
    wanted = [*worst.values(), *pair, *([fewest] if fewest else [])]
    return [g for g in dict.fromkeys(wanted) if g in groups]


def _ranked(frame: pd.DataFrame, groups: Sequence[str], chosen: Sequence[str]) -> list[str]:
    """Every group in the order it gets a column: ``chosen`` first, then the others by their
    lowest accuracy over the methods (least accurate first)."""
    def lowest(group: str) -> float:
        values = [number(cell) for cell in _method_rows(frame)[f"acc_{group}"]]
        return min((v for v in values if v is not None), default=float("inf"))

    return [*chosen, *sorted((g for g in groups if g not in chosen), key=lowest)]


def _measures(frame: pd.DataFrame) -> list[str]:
    """The fairness-measure columns of the table (``experiment.show``), in order."""
    return [str(c) for c in frame.columns
            if str(c).removeprefix(COST.format("")) in SHORT.values()]


def _columns(frame: pd.DataFrame, groups: Sequence[str], measures: Sequence[str]
             ) -> list[tuple[str, str]]:
    """``(column, short header)`` of the compact table, in order (headers on two lines: the
    quantity over the group, so a column is as wide as its cells)."""
    chosen = [(f"acc_{g}", f"acc\n{_short(g, _GROUP)}") for g in groups]
    if WORST in frame.columns:
        chosen.append((WORST, "acc\nworst"))
    gap = next((c for c in ("pi_gap_max", "pi_gap") if c in frame.columns), None)
    if gap is not None:
        chosen.append((gap, "cost\ngap"))
    chosen += [(c, c.replace("_", "\n", 1)) for c in measures]
    chosen += [(c, h) for c, h in ((EPSILON_RUN, "ε\nrun"), (EPSILON_METHOD, "ε\nmethod"),
                                   (EPSILON_TEST, "ε\ntest")) if c in frame.columns]
    return chosen


def _table(frame: pd.DataFrame, title: str, groups: Sequence[str],
           measures: Sequence[str] = ()) -> Table:
    columns = _columns(frame, groups, measures)
    labels = ["run total" if str(label).startswith(TOTAL_ROW) else _short(str(label), _LABEL)
              for label in frame.index]
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("method", min_width=max(map(len, labels), default=6), overflow="fold")
    for _, header in columns:
        table.add_column(header, justify="right", no_wrap=True)
    for label, (_, row) in zip(labels, frame.iterrows(), strict=True):
        cells = [str(row[c]) for c, _ in columns]
        cells = [_epsilon(cell) if header.startswith("ε") else
                 _mean(cell) if column in measures else cell
                 for cell, (column, header) in zip(cells, columns, strict=True)]
        table.add_row(label, *cells, style="bold" if label == "run total" else None)
    return table


def _width(table: Table) -> int:
    """The characters of the table's widest line at its natural width."""
    out = io.StringIO()
    Console(file=out, width=10 * WIDTH, soft_wrap=True).print(table)
    return max((len(line) for line in out.getvalue().splitlines()), default=0)


def compact_table(frame: pd.DataFrame, title: str, facts: Mapping[str, Any] | None = None
                  ) -> tuple[Table, list[str]]:
    """The terminal table of a results table (``results.csv`` read with its row labels as
    index, cells as strings) and its legend lines. ``facts``: the run's ``groups.json``
    (group order, pair, fewest test rows); None for a run that has none."""
    groups = _groups(frame, facts)
    worst = _worst(frame, groups)
    pair = [str(g) for g in (facts or {}).get("pair") or []]
    fewest = (facts or {}).get("fewest_test_rows")
    shown: list[str] = []
    measures: list[str] = []
    for measure in _measures(frame):  # experiment.show's, while they fit, before the groups
        if _width(_table(frame, title, [], [*measures, measure])) <= WIDTH:
            measures.append(measure)
    table = _table(frame, title, shown, measures)
    for group in _ranked(frame, groups, _chosen(groups, worst, pair, fewest)):
        wider = _table(frame, title, [g for g in groups if g in {*shown, group}], measures)
        if _width(wider) <= WIDTH:  # the groups that matter first, then the least accurate
            shown, table = [*shown, group], wider
    legend = textwrap.wrap(
        "acc: test accuracy, % (mean ± SE over seeds); cost gap: the largest gap in privacy "
        "cost between groups (Esipova et al. 2023, Eq. 1); ε run: one training run; ε method: "
        "its search + all seeds; none: no DP guarantee; run total: all composed"
        + ("; ε test: the noisy test metrics'" if EPSILON_TEST in frame.columns else "")
        + ("; dp/eo/eop: demographic parity, equalized odds, equal opportunity (diff, ratio: "
           "across groups, fractions, mean over seeds); Δ: their privacy cost against the "
           "reference, > 0 less fair" if measures else "")
        + (f"; not shown for want of room: {', '.join(left)} (results.md)"
           if (left := [m for m in _measures(frame) if m not in measures]) else ""), WIDTH)
    return table, legend + _group_legend(groups, shown, worst, pair, fewest) + _accountants(
        frame)


def _group_legend(groups: Sequence[str], shown: Sequence[str], worst: Mapping[str, str],
                  pair: Sequence[str], fewest: str | None) -> list[str]:
    """Which group is which (worst per method, the pair, the fewest test rows) and, when some
    are left out, how many, which and where they are."""
    parts = []
    if worst:
        by_group: dict[str, list[str]] = {}
        for label, group in worst.items():
            by_group.setdefault(group, []).append(label.split(" (")[0])
        parts.append("worst " + ", ".join(
            f"{g} ({'every method' if len(m) == len(worst) > 1 else ', '.join(m)})"
            for g, m in by_group.items()))
    if len(pair) == 2:
        parts.append(f"pair {pair[0]} vs {pair[1]}")
    if fewest:
        parts.append(f"fewest test rows {fewest}")
    left = [g for g in groups if g not in shown]
    text = "groups: " + "; ".join(parts) if parts else ""
    if left:
        named = ", ".join(left[:_LEFT]) + (f" and {len(left) - _LEFT} more"
                                            if len(left) > _LEFT else "")
        text += (f"{'; ' if text else ''}{len(left)} of {len(groups)} left out here "
                 f"({named}): {_FULL}")
    return textwrap.wrap(text, WIDTH) if text else []


def _accountants(frame: pd.DataFrame) -> list[str]:
    """Legend lines naming the accountants of the ε figures (each row's is in results.md)."""
    if EPSILON_ACCOUNTANT not in frame.columns:
        return []
    names = dict.fromkeys(name.split(": ", 1)[-1] for cell in frame[EPSILON_ACCOUNTANT]
                          for name in str(cell).split("; ") if name)
    names.pop(ACCOUNTANT_NONE, None)  # no ε: the table says none
    return textwrap.wrap("ε by: " + "; ".join(names) + " (each row's: results.md)", WIDTH)


def group_table(title: str, names: list[str], metrics: dict[str, Any]) -> Table:
    """One training run's test metrics per group (``dpfair train``)."""
    table = Table(title=title)
    for col in ("group", "accuracy", "loss", "count"):
        table.add_column(col, justify="right" if col != "group" else "left")
    for k, name in enumerate(names):
        count = metrics.get("group_count")  # not released with noisy test metrics
        table.add_row(name, percent(metrics['group_accuracy'][k]),
                      score(metrics['group_loss'][k]),
                      f"{int(count[k])}" if count is not None else "—")
    return table


def print_results(folder: Path, title: str) -> None:
    """The compact results table (:mod:`dpfair.cli.results`) of a run's results folder
    (``results.csv`` and, written since, ``groups.json``) and its legend."""
    import json

    facts = folder / GROUPS_JSON
    frame = pd.read_csv(folder / "results.csv", index_col=0, dtype=str, keep_default_na=False)
    table, legend = compact_table(frame, title,
                                  json.loads(facts.read_text()) if facts.is_file() else None)
    Console(width=WIDTH, soft_wrap=True).print(table)  # 120 columns, in a pipe too
    for line in legend:
        console.print(line, markup=False, highlight=False)
