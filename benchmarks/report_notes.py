"""The reproduction report's notes: why each ⚠, and sections carried over from a previous report.

Pure text helpers of ``benchmarks/reproduce.py`` (no training, no data): a config's
``flag_notes`` (``cells``: ``method.column`` patterns, ``reason``: a sentence with its figure)
become one line per reason under a table, and a table whose results are not stored keeps its
section of the existing report, with its ⚠ cells read back from the markdown.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CLAIMS = "Checks of the papers' claims"
CARRIED = ("*Carried over unchanged from the previous report: this table was not rerun in the "
           "pass that wrote this file (its machine and date lines are those of its own run).*")
CARRIED_EPSILON = "*ε in this section: "


def markdown_flags(lines: Sequence[str]) -> list[str]:
    """``method.column`` of every ⚠ cell in the markdown tables of a rendered section (Zhao's
    rows are ``method@ε``, its columns lose their `` published`` suffix), each once (a
    released-code table repeats the cells of the table above it)."""
    cells, header = [], None
    for line in (ln for chunk in lines for ln in chunk.splitlines()):  # a table may be one str
        if not line.startswith("|"):
            header = None
            continue
        row = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = row
        elif not set(row[0]) <= set(":-"):
            label = f"{row[1]}@{row[0]}" if header[0] == "ε" else row[0]
            cells += [f"{label}.{col.removesuffix(' published')}"
                      for col, cell in zip(header, row, strict=True) if "⚠" in cell]
    return list(dict.fromkeys(cells))


def previous_sections(path: Path) -> dict[str, list[str]]:
    """The sections of an existing report by table name (``## title (`name`)``), and the
    claims section under ``CLAIMS``: tables whose results are not stored here keep them."""
    if not path.exists():
        return {}
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            m = re.search(r"\(`([^`]+)`\)$", line)
            key = m.group(1) if m else (CLAIMS if line[3:] == CLAIMS else None)
            current = sections.setdefault(key, []) if key else None
        if current is not None:
            current.append(line)
    for key, body in sections.items():
        while body and not body[-1].strip():
            body.pop()
        if key == CLAIMS:
            sections[key] = [ln for ln in body if ln.startswith("- ")]
        else:
            if body[1:2] == [""] and body[2:3] == [CARRIED]:
                del body[2:4]  # carried before: keep one marker
                if body[2:3] and body[2].startswith(CARRIED_EPSILON):
                    del body[2:4]  # and its accountant line, rendered again
            if "Why each ⚠:" in body:  # its reasons are rendered again from the config
                i = body.index("Why each ⚠:")
                j = next((k for k in range(i + 2, len(body)) if not body[k].startswith("- ")),
                         len(body))
                del body[i:j + 1]
    return sections


def flag_reasons(cells: Sequence[str], notes: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per reason of the config's ``flag_notes`` (``cells``: ``method.column``
    patterns, ``reason``: a sentence with its figure) listing the ⚠ cells it explains (the
    first matching note wins); cells no note matches are listed as such, never dropped."""
    if not cells:
        return []
    claimed: dict[int, list[str]] = {}
    unexplained = []
    for cell in cells:
        k = next((i for i, n in enumerate(notes)
                  if any(fnmatch.fnmatchcase(cell, pat) for pat in n["cells"])), None)
        if k is None:
            unexplained.append(cell)
        else:
            claimed.setdefault(k, []).append(cell)
    out = ["Why each ⚠:", ""]
    for k in sorted(claimed):
        out.append(f"- {_cell_list(claimed[k])}: {' '.join(notes[k]['reason'].split())}")
    if unexplained:
        out.append(f"- {_cell_list(unexplained)}: **no reason recorded yet**")
    return out + [""]


def _cell_list(cells: Sequence[str]) -> str:
    by_method: dict[str, list[str]] = {}
    for cell in cells:
        method, column = cell.rsplit(".", 1)
        by_method.setdefault(method, []).append(column)
    return "; ".join(f"{m} ({', '.join(cols)})" for m, cols in by_method.items())
