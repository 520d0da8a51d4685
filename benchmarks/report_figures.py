"""The reproduction report's figures, read back from its tables, and the prose filled from them.

Pure text helpers of ``benchmarks/reproduce.py``. Every table section of the report (rendered
now or carried over) is parsed into :class:`Figures`: its cells by ``row.column`` (Zhao's rows
are ``method@ε``), its seed count, its wall time. Prose (discussions, ⚠ reasons) names a figure
by a placeholder instead of typing it, so a rerun cannot leave a stale number behind:

* ``[[NAME:row.column]]``: the cell of table NAME's main table ("Ours (mean ± SE ...)", or
  Zhao's "Best point" table), as printed (``56.6 ± 1.0``); ``|mean`` or ``|se`` for one part;
* ``[[NAME:row.column|published]]``: the published side of the "Ours / published" cell
  (``|published mean``, ``|published se``), ``|ours``: our side of it (losses and excess
  risks print a third decimal there);
* ``[[NAME/tuning:row.column]]``: Zhao's private-tuning table;
* ``[[NAME:rowA.column vs rowB.column]]``: the difference of the two means and how many
  combined SEs it is (``+0.0017, 0.8 combined SEs``); ``[[NAME:row.column|vs published]]``
  the same for ours against the published cell;
* ``[[NAME:wall]]``: the table's wall time in minutes; ``[[NAME:seeds]]``: its seed count;
  ``[[NAME:flagged]]``: its "N of M" flagged cells; ``[[NAME:flagged kinds]]``: the same with
  the flagged cells listed by kind (accuracies, losses, ...); ``[[NAME:verdict]]``: one line
  that counts them; ``[[NAME:accountant]]``: the accountant of its ε; ``[[wall-total]]``: the
  wall times of every table that ``reproduce.py`` ran, summed.

SE distances use the unrounded means and SEs a rendered table keeps in an HTML comment
(:data:`EXACT`); a carried section without them falls back to its printed cells and says so
("of printed cells").

An unknown row or column of a table is an error (:class:`FigureError`): the renderer refuses
to write prose it cannot fill. A table that is not in the report at all (a report of some
tables only) prints as ``[figure of a table not in this report: `NAME`]``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from report_notes import markdown_flags

PLACEHOLDER = re.compile(r"\[\[([^\]]+)\]\]")
EXACT = "<!-- unrounded (mean, SE) per cell: "
KIND_NAMES = {"acc": "accuracy", "pi": "privacy cost", "loss": "loss", "R": "excess risk",
              "delta": "Δ"}
MISSING = "figure of a table not in this report:"
_KINDS = {"Ours (mean": "main", "Best point": "main", "Ours / published": "published",
          "Private tuning": "tuning"}


class FigureError(KeyError):
    """A placeholder names a figure that no table of the report has."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class Figures:
    """One table section's figures: cells per table kind (``main``, ``published``,
    ``tuning``) by ``row.column``, the seed count and the wall time in minutes."""

    tables: dict[str, dict[str, str]] = field(default_factory=dict)
    seeds: int | None = None
    wall_min: float | None = None
    flagged: str | None = None
    text: str = ""
    accountant: str | None = None
    #: unrounded (mean, SE) by ``row.column``: ``ours`` and ``published`` (rendered tables)
    exact: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)

    @property
    def qualifier(self) -> str:
        """How far the runs behind these figures go: GPU full length, shortened on the CPU,
        a quick smoke test; the seed count (one seed: no SE)."""
        n = self.seeds
        seeds = "seeds ?" if n is None else ("1 seed, no SE" if n == 1 else f"{n} seeds")
        if "QUICK MODE" in self.text:
            return f"QUICK MODE, {seeds}"
        if "RECORDED ON A GPU" in self.text:
            return f"full length on a GPU, {seeds}"
        m = re.search(r"SHORTENED ON CPU\*\* \(no GPU in this run\): (\d+) epochs instead "
                      r"of the paper's (\d+)", self.text)
        if m:
            return f"SHORTENED on CPU to {m.group(1)} of {m.group(2)} epochs, {seeds}"
        if "Best point of the" in self.text:
            return f"point selected on one seed, {seeds}"
        return seeds

    def value(self, kind: str, key: str, cell: str) -> tuple[tuple[float, float], bool]:
        """``(mean, SE)`` of a cell and whether it is unrounded: from :data:`EXACT` where the
        section keeps it (``kind``: ``ours`` or ``published``), else parsed from ``cell``."""
        found = self.exact.get(kind, {}).get(key)
        if found is not None:
            mean, se = (math.nan if v is None else float(v) for v in found)
            return (mean, se), True
        return mean_se(cell), False

    def cell(self, kind: str, key: str) -> str:
        try:
            return self.tables[kind][key]
        except KeyError:
            known = sorted(self.tables.get(kind, {}))[:8]
            raise FigureError(f"no cell {key!r} in the {kind} table (cells: {known} ...)") \
                from None


def _rows(block: Sequence[str]) -> dict[str, str]:
    header = [c.strip() for c in block[0].strip().strip("|").split("|")]
    zhao = header[:2] == ["ε", "method"] or header[:2] == ["ε per run", "method"]
    cells = {}
    for line in block[2:]:
        row = [c.strip() for c in line.strip().strip("|").split("|")]
        label = f"{row[1]}@{row[0]}" if zhao else row[0]
        cells.update({f"{label}.{col}": cell for col, cell in zip(header, row, strict=True)})
    return cells


def parse_section(lines: Sequence[str]) -> Figures:
    """The figures of one table section's markdown (a line may hold several)."""
    flat = [ln for chunk in lines for ln in chunk.splitlines()]
    out, kind, block = Figures(text="\n".join(flat)), None, []
    for line in [*flat, ""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block and kind and kind not in out.tables:
            out.tables[kind] = _rows(block)
        block = []
        if line.strip():
            kind = next((k for p, k in _KINDS.items() if line.startswith(p)), None)
        m = re.match(r"Ours \(mean ± SE over (\d+) seed", line) or re.search(
            r"retrained on (\d+) seeds", line)
        if m and out.seeds is None:
            out.seeds = int(m.group(1))
        m = re.match(r"(\d+ of \d+) comparable cells differ", line)
        if m and out.flagged is None:
            out.flagged = m.group(1)
        m = re.search(r"wall time ([\d.]+) min", line)
        if m and out.wall_min is None:
            out.wall_min = float(m.group(1))
        m = re.match(r"Ours \(mean ± SE .*?; ε by (.*?)(, published ε = [^)]*)?\):$", line)
        if m and out.accountant is None:
            out.accountant = m.group(1)
        if line.startswith(EXACT) and not out.exact:
            out.exact = {k: {c: tuple(v) for c, v in cells.items()}
                         for k, cells in json.loads(line[len(EXACT):].removesuffix(" -->")).items()}
    return out


def mean_se(cell: str) -> tuple[float, float]:
    """``"56.6 ± 1.0"`` -> (56.6, 1.0); a cell without SE has SE NaN; ``-`` is NaN."""
    parts = cell.replace("⚠", "").split("±")
    try:
        mean = float(parts[0])
    except ValueError:
        return math.nan, math.nan
    return mean, float(parts[1]) if len(parts) > 1 else math.nan


def _published(cell: str) -> str:
    if " / " not in cell:
        raise FigureError(f"{cell!r} is not an 'ours / published' cell")
    return cell.split(" / ")[-1].replace("⚠", "").strip()


def _part(text: str, part: str) -> str:
    if part == "":
        return text
    pieces = [p.strip() for p in text.split("±")]
    if part == "mean":
        return pieces[0]
    if part == "se" and len(pieces) == 2:
        return pieces[1]
    raise FigureError(f"no {part!r} in {text!r}")


def se_distance(a: tuple[float, float], b: tuple[float, float], exact: bool = False) -> str:
    """``a - b`` and how many combined SEs (``hypot``) it is; a missing SE counts as 0 (as
    the report's ⚠ test counts a published value without SE), both missing or 0 say so.
    ``exact``: both are unrounded (the difference is printed to 4 significant digits),
    else they are printed cells and the distance says so."""
    diff = a[0] - b[0]
    digits = _significant(diff) if exact else max(_decimals(a[0]), _decimals(b[0]))
    of = "" if exact else " of printed cells"
    if math.isnan(a[1]) and math.isnan(b[1]):
        return f"{diff:+.{digits}f}, no SE (single runs)"
    comb = math.hypot(*(0.0 if math.isnan(s) else s for s in (a[1], b[1])))
    if math.isnan(comb):
        return f"{diff:+.{digits}f}, no SE (single runs)"
    if comb == 0:
        return f"{diff:+.{digits}f}, SEs print as 0"
    return f"{diff:+.{digits}f}, {abs(diff) / comb:.1f} combined SEs{of}"


def _significant(value: float) -> int:
    """Decimals that show ``value`` to 3 significant digits (at most 4 decimals)."""
    if value == 0 or not math.isfinite(value):
        return 1
    return max(0, min(4, 2 - math.floor(math.log10(abs(value)))))


def _decimals(value: float) -> int:
    text = f"{value:.6g}"
    return min(4, len(text.split(".")[1])) if "." in text else 0


def figure(spec: str, figures: Mapping[str, Figures]) -> str:
    """The text of one placeholder (module docstring)."""
    if spec == "wall-total":
        return f"{total_wall(figures):.1f}"
    name, _, what = spec.partition(":")
    name, _, kind = name.partition("/")
    kind = kind or "main"
    if name not in figures:  # a report of some tables only (--quick, a test): say so
        return f"[{MISSING} `{name}`]"
    fig = figures[name]
    if what in ("wall", "seeds", "flagged", "accountant"):
        value = {"wall": fig.wall_min, "seeds": fig.seeds, "flagged": fig.flagged,
                 "accountant": fig.accountant}[what]
        if value is None:
            raise FigureError(f"placeholder [[{spec}]]: table {name!r} states no {what}")
        return f"{value:.1f}" if what == "wall" else str(value)
    if what in ("flagged kinds", "verdict"):
        return flagged_kinds(fig) if what == "flagged kinds" else verdict(fig)
    if " vs " in what:
        keys = [k.strip() for k in what.split(" vs ")]
        (a, ea), (b, eb) = (fig.value("ours", k, fig.cell(kind, k)) for k in keys)
        return se_distance(a, b, ea and eb)
    key, _, modifier = what.partition("|")
    words = modifier.split()
    if words == ["vs", "published"]:
        cell = fig.cell("published", key)
        a, ea = fig.value("ours", key, cell.split(" / ")[0])
        b, eb = fig.value("published", key, _published(cell))
        return se_distance(a, b, ea and eb)
    if words[:1] == ["published"]:
        return _part(_published(fig.cell("published", key)), " ".join(words[1:]))
    if words[:1] == ["ours"]:
        ours = fig.cell("published", key).split(" / ")[0].replace("⚠", "").strip()
        return _part(ours, " ".join(words[1:]))
    return _part(fig.cell(kind, key).replace("⚠", "").strip(), modifier.strip())


def _flagged(fig: Figures) -> tuple[str, list[str]]:
    if fig.flagged is None:
        raise FigureError("the table states no flagged count")
    return fig.flagged, markdown_flags(fig.text.splitlines())


def flagged_kinds(fig: Figures) -> str:
    """"N of M comparable cells flagged: k losses (cells), ..." read from the section."""
    count, cells = _flagged(fig)
    by_kind: dict[str, list[str]] = {}
    for cell in cells:
        method, column = cell.rsplit(".", 1)
        kind = KIND_NAMES.get(column.split("_")[0], column)
        by_kind.setdefault(kind, []).append(f"{method} {column}")
    parts = [f"{len(v)} {k if len(v) == 1 else _plural(k)} ({', '.join(v)})"
             for k, v in by_kind.items()]
    return f"{count} comparable cells flagged" + (f": {'; '.join(parts)}" if parts else "")


def _plural(kind: str) -> str:
    return {"accuracy": "accuracies", "loss": "losses", "Δ": "Δ"}.get(kind, kind + "s")


def verdict(fig: Figures) -> str:
    """One line that counts the flagged cells: the table reproduces cell for cell only when
    none is flagged."""
    count, _ = _flagged(fig)
    if count.startswith("0 of"):
        return f"reproduces cell for cell ({count} comparable cells flagged)"
    return f"does not reproduce cell for cell: {count} comparable cells flagged"


def fill(text: str, figures: Mapping[str, Figures]) -> str:
    """``text`` with every placeholder replaced by its figure (:class:`FigureError` if one
    names nothing)."""
    def one(match: re.Match[str]) -> str:
        try:
            return figure(match.group(1), figures)
        except FigureError as exc:
            raise FigureError(f"placeholder [[{match.group(1)}]]: {exc}") from None
    return PLACEHOLDER.sub(one, text)


def total_wall(figures: Mapping[str, Figures]) -> float:
    """The wall times of every table run by ``reproduce.py`` (not the recorded GPU runs),
    summed (minutes)."""
    return sum(f.wall_min for f in figures.values()
               if f.wall_min is not None and "RECORDED ON A GPU" not in f.text)
