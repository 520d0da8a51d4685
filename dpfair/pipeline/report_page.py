"""The run's report page: ``report.html``, one self-contained file at the parent run's
artifact root (MLflow shows it in its artifact viewer, one click from the run the printed link
opens) with what results.md says and every figure of the run, the per-group fairness measures
among them, embedded. It holds nothing results.md and the figures do not: the same release."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path

import pandas as pd

__all__ = ["REPORT_PAGE", "write_report_page"]

REPORT_PAGE = "report.html"
_STYLE = ("body{font-family:sans-serif;max-width:1600px;margin:1em auto;padding:0 1em}"
          "table{border-collapse:collapse;font-size:13px;margin:.5em 0 1.5em}"
          "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
          "img{max-width:100%;margin-bottom:1.5em}")


def write_report_page(title: str, table: pd.DataFrame, measures: Mapping[str, pd.DataFrame],
                      notes: Sequence[str], figures: Mapping[str, str | Path],
                      path: str | Path) -> Path:
    """Write the page: the results ``table``, the fairness ``measures`` (title -> table),
    the ``notes`` on what ε covers, then every figure (name -> PNG), and return its path."""
    parts = [f"<h1>{escape(title)}</h1>", "<h2>Results</h2>", table.to_html(),
             *(f"<h2>{escape(name)}</h2>{t.to_html()}" for name, t in measures.items()),
             "<h2>What ε covers</h2>", *(f"<p>{escape(n)}</p>" for n in notes)]
    for name, png in figures.items():
        data = base64.b64encode(Path(png).read_bytes()).decode("ascii")
        label = escape(name.replace("_", " "))
        parts.append(f'<h2>{label}</h2><img alt="{label}" src="data:image/png;base64,{data}">')
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>")
    out = Path(path)
    out.write_text(page, encoding="utf-8")
    return out
