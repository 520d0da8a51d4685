"""Figures and the comparison with published numbers.

Every figure function takes plain data (the canonical runs frame of
:func:`dpfair.fairness.runs_frame`, or dicts of arrays), writes one PNG with matplotlib's
Agg renderer (``Figure`` objects, never pyplot: safe without a display and in threads) and
returns its path. Error bars and bands are one standard error over seeds. Figures are sized
for a browser and MLflow's artifact viewer: at most :data:`MAX_WIDTH_PX` pixels wide (more
bars get narrower, more panels more rows), each answering one question.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import numpy.typing as npt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.ticker import MaxNLocator

from dpfair import fairness
from dpfair.fairness import rates

DPI = 150
MAX_WIDTH_PX = 1600
MAX_WIDTH_IN = MAX_WIDTH_PX / DPI
PANEL_COLUMNS = 2  # panels per row of a multi-panel figure
MAX_LABELLED_BARS = 24  # value labels on the bars up to this many bars (else they overlap)
#: a multi-panel figure's fixed margins and gaps (inches): y tick labels and label left
#: and between columns, x tick labels and label below and between rows (with the next panel's
#: title), the panel titles under the figure's title
PANEL_MARGINS_IN = {"left": 0.85, "right": 0.2, "bottom": 0.65, "wgap": 0.85, "hgap": 1.0,
                    "title_pad": 0.1, "panel_title": 0.45}
TITLE_LINE_IN = 0.24  # one line of the figure's title (12 pt)
History = Mapping[int, Mapping[str, float]]  # epoch -> group -> test accuracy (fraction)


def _groups_of(runs: pd.DataFrame, groups: Sequence[str] | None) -> list[str]:
    """The named groups, or every group except ``all`` and ``class:*`` in record order."""
    if groups is not None:
        return list(groups)
    names = dict.fromkeys(runs.loc[runs["metric"] == fairness.ACCURACY, "group"])
    return [g for g in names if g != fairness.ALL and not g.startswith("class:")]


def _colors(names: Sequence[str]) -> dict[str, tuple]:
    cmap = matplotlib.colormaps["tab10"]
    return {n: cmap(i % 10) for i, n in enumerate(names)}


def _save(fig: Figure, path: str | Path) -> Path:
    """Write the figure as PNG (Agg renderer; no pyplot, so no global figure state)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    return path


def _method_colors(runs: pd.DataFrame) -> dict[str, tuple]:
    """One color per method of the runs, in record order, the same in every figure."""
    return _colors(list(dict.fromkeys(runs["method"])))


def _bar_figure(groups: Sequence[str], methods: Sequence[str]) -> tuple[Figure, Axes]:
    """A bar chart as wide as its bars need, at most :data:`MAX_WIDTH_IN`."""
    width = min(MAX_WIDTH_IN, max(7.0, 2.5 + 0.3 * len(groups) * (len(methods) + 1)))
    fig = Figure(figsize=(width, 4.5), layout="constrained")
    return fig, fig.subplots()


def _bar_stats(table: pd.DataFrame, groups: Sequence[str], methods: Sequence[str]
               ) -> tuple[np.ndarray, np.ndarray]:
    """``(methods, groups)`` means and SEs over seeds of a ``(method, seed) x groups`` table,
    NaN ignored as :func:`dpfair.fairness.mean_se` (an SE of fewer than two seeds is 0 here:
    no error bar)."""
    cells = table[list(groups)].groupby(level="method")
    mean, se = cells.mean(), cells.std(ddof=1) / np.sqrt(cells.count())
    rows = list(methods)
    return (mean.loc[rows].to_numpy(dtype=np.float64),
            np.nan_to_num(se.loc[rows].to_numpy(dtype=np.float64)))


def _grouped_bars(
    table: pd.DataFrame,
    groups: Sequence[str],
    methods: Sequence[str],
    colors: Mapping[str, tuple],
    ax: Axes,
    *,
    legend: bool = True,
) -> list[BarContainer]:
    """Bars of mean +- SE over seeds: one cluster per group (column), one bar per method (its
    container returned); the legend beside the axes unless ``legend`` is False (a multi-panel
    figure has one, :func:`_finish_panels`)."""
    means, ses = _bar_stats(table, groups, methods)
    width = 0.8 / len(methods)
    x = np.arange(len(groups))
    bars = []
    for i, m in enumerate(methods):
        pos = x - 0.4 + width * (i + 0.5)
        bars.append(ax.bar(pos, means[i], width, yerr=ses[i], capsize=3, label=m,
                           color=colors[m]))
        if len(groups) * len(methods) > MAX_LABELLED_BARS:
            continue
        for p, v, e in zip(pos, means[i], ses[i], strict=True):
            top = max(v, 0.0) + e  # above the error bar, also for negative bars
            ax.annotate(f"{v:.1f}", (p, top), ha="center", va="bottom", fontsize=7,
                        xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x, [str(g) for g in groups])
    if legend:
        ax.legend(title="method", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return bars


def _refill_bars(ax: Axes, bars: Sequence[BarContainer], table: pd.DataFrame,
                 groups: Sequence[str], methods: Sequence[str]) -> None:
    """New means and SEs in the unlabelled bars of :func:`_grouped_bars` (the same groups and
    methods), the y range fitted to them as autoscaling does (bars stick to 0, 5% margins)."""
    means, ses = _bar_stats(table, groups, methods)
    for container, v, e in zip(bars, means, ses, strict=True):
        for rect, height in zip(container.patches, v, strict=True):
            rect.set_height(height)
        _, (low, high), (stems,) = container.errorbar.lines
        x = low.get_xdata()
        low.set_ydata(v - e)
        high.set_ydata(v + e)
        stems.set_segments(np.stack([np.stack([x, v - e], axis=1),
                                     np.stack([x, v + e], axis=1)], axis=1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a panel of NaN only
        bottom = min(0.0, float(np.nanmin(means - ses)))
        top = max(0.0, float(np.nanmax(means + ses)))
    if math.isfinite(bottom) and math.isfinite(top) and top > bottom:
        pad = 0.05 * (top - bottom)
        ax.set_ylim(bottom - pad if bottom < 0 else 0.0, top + pad if top > 0 else 0.0)


def plot_group_accuracy(
    runs: pd.DataFrame,
    path: str | Path,
    *,
    groups: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    title: str = "Test accuracy per group",
) -> Path:
    """Per-group test accuracy (%) per method, bars with 1 SE over seeds."""
    groups = _groups_of(runs, groups)
    table = fairness.metric_table(runs, fairness.ACCURACY, groups) * 100.0
    methods = list(methods or dict.fromkeys(runs["method"]))
    fig, ax = _bar_figure(groups, methods)
    _grouped_bars(table, groups, methods, _method_colors(runs), ax)
    ax.set(xlabel="group", ylabel="test accuracy (%)", title=f"{title}\nmean ± 1 SE over seeds")
    ax.set_ylim(0, 105)
    return _save(fig, path)


def plot_privacy_cost(
    runs: pd.DataFrame,
    path: str | Path,
    *,
    reference: str = "nonprivate",
    groups: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    title: str = "Privacy cost per group",
) -> Path:
    """Privacy cost ``pi_k = acc_k(theta*) - E[acc_k(theta~)]`` (Esipova et al. 2023, Eq. 1)
    in percentage points per group and private method, bars with 1 SE over seeds."""
    groups = _groups_of(runs, groups)
    table = fairness.cost_by_seed(runs, groups, kind="pi", reference=reference) * 100.0
    methods = list(methods or dict.fromkeys(table.index.get_level_values("method")))
    fig, ax = _bar_figure(groups, methods)
    _grouped_bars(table, groups, methods, _method_colors(runs), ax)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set(
        xlabel="group",
        ylabel="privacy cost π (accuracy points lost, %)",
        title=f"{title} vs {reference}\nmean ± 1 SE over seeds; lower is better",
    )
    return _save(fig, path)


def plot_rate_figures(runs: pd.DataFrame, out: Path, groups: Sequence[str],
                      classes: Sequence[str], methods: Sequence[str]) -> dict[str, Path]:
    """For each positive class (``fairness_rates[_class<c>].png``, keyed by figure name), one
    panel per fairness measure of :mod:`dpfair.fairness.rates` that the runs released
    (selection rate, error rates, precision, calibration error), bars of mean ± 1 SE over
    seeds per group and method, in percent; none when the runs released no rate. The panels
    are drawn once and refilled for the next class (the same measures and methods)."""
    found: dict[str, Path] = {}
    colors = _method_colors(runs)
    drawn: tuple[object, Figure, list[Axes], list[list[BarContainer]], Text] | None = None
    for c in rates.positive_classes(len(classes)):
        end = rates.suffix(c, len(classes))
        present = [f"{m}{end}" for m in rates.MEASURES if (runs["metric"] == f"{m}{end}").any()]
        if not present:
            continue
        tables = [fairness.metric_table(runs, m, groups) * 100.0 for m in present]
        shown = [[m for m in methods if m in t.index] for t in tables]
        title = (f"Selection and error rates per group (positive class {classes[c]!r})\n"
                 "mean ± 1 SE over seeds")
        layout = ([m.removesuffix(end) for m in present], shown)
        unlabelled = len(groups) * max(map(len, shown)) > MAX_LABELLED_BARS
        if drawn is not None and drawn[0] == layout and unlabelled:
            _, fig, axes, bars, heading = drawn
            for ax, bar, table, names in zip(axes, bars, tables, shown, strict=True):
                _refill_bars(ax, bar, table, groups, names)
            heading.set_text(title)
        else:
            fig, axes = _panels(len(present))
            bars = []
            for ax, measure, table, names in zip(axes, layout[0], tables, shown, strict=True):
                bars.append(_grouped_bars(table, groups, names, colors, ax, legend=False))
                ax.set(title=measure.replace("_", " "), xlabel="group", ylabel="%")
            heading = _finish_panels(fig, axes, title, legend="method")
            drawn = (layout, fig, axes, bars, heading)
        found[f"fairness_rates{end}"] = _save(fig, out / f"fairness_rates{end}.png")
    return found


def _history_matrix(runs: Sequence[History], group: str) -> tuple[np.ndarray, np.ndarray]:
    """Epochs (union over runs) and a runs x epochs matrix, NaN where a run lacks the epoch.

    Epoch keys may be ints or their strings (histories read back from JSON)."""
    by_epoch = [{int(e): accs for e, accs in run.items()} for run in runs]
    epochs = np.array(sorted({e for run in by_epoch for e in run}))
    values = np.full((len(runs), epochs.size), np.nan)
    for i, run in enumerate(by_epoch):
        for j, e in enumerate(epochs):
            values[i, j] = run.get(int(e), {}).get(group, np.nan)
    return epochs, values


def _mean_band(ax: Axes, x: np.ndarray, values: np.ndarray, label: str, color: tuple) -> None:
    """Mean line over rows (seeds) and a 1 SE band where at least two rows have a value
    (a point where every row is NaN is left as a gap)."""
    values = np.atleast_2d(values)
    n = np.sum(~np.isnan(values), axis=0)
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
        mean = np.nanmean(values, axis=0)
        se = np.where(n > 1, np.nanstd(values, axis=0, ddof=1) / np.sqrt(n), np.nan)
    ax.plot(x, mean, label=label, color=color, linewidth=1.6)
    if values.shape[0] > 1:
        ax.fill_between(x, mean - se, mean + se, color=color, alpha=0.25, linewidth=0)


def plot_training_curves(
    histories: Mapping[str, Sequence[History]],
    path: str | Path,
    *,
    groups: Sequence[str] | None = None,
    title: str = "Test accuracy per group during training",
) -> Path:
    """One panel per method: per-group test accuracy (%) per epoch, mean over seeds with a
    1 SE band. ``histories[method]`` is a list (one per seed) of ``{epoch: {group: acc}}``."""
    methods = list(histories)
    if groups is None:
        seen = (g for runs in histories.values() for run in runs for ep in run.values() for g in ep)
        groups = list(dict.fromkeys(seen))
    colors = _colors(groups)
    fig, axes = _panels(len(methods), sharey=True)
    for i, (ax, m) in enumerate(zip(axes, methods, strict=True)):
        for g in groups:
            epochs, values = _history_matrix(histories[m], g)
            _mean_band(ax, epochs, values * 100.0, str(g), colors[g])
        n = len(histories[m])
        ax.set(title=f"{m} ({n} seed{'s' if n != 1 else ''})", xlabel="epoch")
        if i % PANEL_COLUMNS == 0:  # first column of _panels' grid
            ax.set_ylabel("test accuracy (%)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0].legend(title="group", fontsize=8)
    _finish_panels(fig, axes, f"{title} (mean ± 1 SE band over seeds)")
    return _save(fig, path)


def _panels(n: int, *, sharey: bool = False) -> tuple[Figure, list[Axes]]:
    """``n`` panels, at most :data:`PANEL_COLUMNS` per row and :data:`MAX_WIDTH_IN` wide in
    all; unused cells of the grid are hidden. No layout engine: :func:`_finish_panels` places
    them at fixed margins, so the figure is drawn once when saved (a layout engine draws it a
    second time to place it, the larger part of a many-panel figure's cost)."""
    ncols = min(n, PANEL_COLUMNS)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(min(MAX_WIDTH_IN, 5.0 * ncols), 3.6 * nrows))
    axes = fig.subplots(nrows, ncols, sharey=sharey, squeeze=False)
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _finish_panels(fig: Figure, axes: Sequence[Axes], title: str,
                   legend: str | None = None) -> Text:
    """The title on top (returned) and the panels at fixed margins (:data:`PANEL_MARGINS_IN`:
    room for tick labels, axis labels and panel titles); with ``legend`` (its title) one legend
    of the first panel's entries right of the panels, the right margin as wide as it is."""
    width, height = fig.get_size_inches()
    margin = PANEL_MARGINS_IN
    lines = title.count("\n") + 1
    top = margin["title_pad"] + TITLE_LINE_IN * lines + margin["panel_title"]
    heading = fig.suptitle(title, y=1.0 - margin["title_pad"] / height, va="top")
    right = margin["right"]
    if legend is not None:
        handles, labels = axes[0].get_legend_handles_labels()
        box = fig.legend(handles, labels, title=legend, fontsize=8, loc="upper right",
                         bbox_to_anchor=(1.0, 1.0 - top / height))
        right += box.get_window_extent().width / fig.dpi
    nrows, ncols = axes[0].get_subplotspec().get_gridspec().get_geometry()
    panel_w = (width - margin["left"] - right - (ncols - 1) * margin["wgap"]) / ncols
    panel_h = (height - top - margin["bottom"] - (nrows - 1) * margin["hgap"]) / nrows
    fig.subplots_adjust(left=margin["left"] / width, right=1.0 - right / width,
                        bottom=margin["bottom"] / height, top=1.0 - top / height,
                        wspace=margin["wgap"] / panel_w, hspace=margin["hgap"] / panel_h)
    return heading


def _series_panels(
    panels: Mapping[str, Mapping[str, npt.ArrayLike]],
    path: str | Path,
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    every: int,
    log_y: bool,
    legend_title: str,
) -> Path:
    """One panel per key of ``panels``; one line (mean +- SE band for 2-D seeds x steps
    arrays) per series, x = ``every * index``."""
    fig, axes = _panels(len(panels))
    banded = False
    for ax, (name, series) in zip(axes, panels.items(), strict=True):
        colors = _colors(list(series))
        for label, values in series.items():
            values = np.atleast_2d(np.asarray(values, dtype=np.float64))
            banded |= values.shape[0] > 1
            _mean_band(ax, every * np.arange(values.shape[1]), values, str(label), colors[label])
        if log_y:
            ax.set_yscale("log")
        ax.set(title=name, xlabel=xlabel, ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend(title=legend_title, fontsize=8)
    _finish_panels(fig, axes, f"{title} (mean ± 1 SE band over seeds)" if banded else title)
    return _save(fig, path)


def plot_clip_bounds(
    trajectories: Mapping[str, Mapping[str, npt.ArrayLike]],
    path: str | Path,
    *,
    every: int = 1,
    log_y: bool = False,
    title: str = "Clipping bounds during training",
) -> Path:
    """Clip-bound trajectories: one panel per method, one line per bound.

    ``trajectories[method][label]`` is a 1-D array over logged steps or a 2-D seeds x steps
    array (mean +- 1 SE band), e.g. ``{"dpsgd_f": {"C_k class 2": ..., "C_k class 8": ...},
    "dpsgd_global_adapt": {"Z": ...}}`` (Xu et al. 2021 Fig. 2; Esipova et al. 2023 Alg. 2).
    Step of entry i is ``every * i``.
    """
    return _series_panels(
        trajectories, path, xlabel="training step", ylabel="clipping bound (gradient L2 norm)",
        title=title, every=every, log_y=log_y, legend_title="bound",
    )


def plot_misalignment(
    r_dir: Mapping[str, npt.ArrayLike],
    r_mag: Mapping[str, npt.ArrayLike],
    path: str | Path,
    *,
    every: int = 1,
    log_y: bool = False,
    title: str = "Gradient misalignment during training",
) -> Path:
    """Direction and magnitude error terms ``R^dir_a`` and ``R^mag_a`` per group over
    training (Esipova et al. 2023, Sec. 4, Prop. 2): two panels, one line per group;
    values as in :func:`plot_clip_bounds` (1-D or seeds x steps)."""
    return _series_panels(
        {"direction error R_dir": r_dir, "magnitude error R_mag": r_mag}, path,
        xlabel="training step", ylabel="excess-risk term (loss units)", title=title,
        every=every, log_y=log_y, legend_title="group",
    )


def comparison_with_published(
    ours: pd.DataFrame,
    published: Mapping[str, object],
    *,
    columns: Sequence[str] | None = None,
    method_map: Mapping[str, str] | None = None,
    column_map: Mapping[str, str] | None = None,
    percent: bool = True,
    n_se: float = 2.0,
) -> pd.DataFrame:
    """Our numbers next to a paper's, flagging differences beyond ``n_se`` combined SEs.

    ``ours`` is :func:`dpfair.fairness.comparison_stats` (fractions; with ``percent`` the
    accuracy-scale columns are times 100 to match Esipova et al.'s tables). ``published`` is
    a table of ``reference/published.yaml``: ``{"columns": [...], method: {"mean": [...],
    "se": [...]}, ...}``; a method given as a plain list has unknown SE. ``method_map`` and
    ``column_map`` translate published names to ours (e.g. ``{"sgd": "nonprivate"}``).

    One row per (method, column) with a published value: ``ours_mean, ours_se,
    published_mean, published_se, diff, combined_se = sqrt(se_ours^2 + se_pub^2)``
    (a missing SE counts as 0), ``z = diff / combined_se`` and ``differs = |diff| > n_se *
    combined_se`` (NA when there is no SE at all, or our value is missing).
    """
    columns = list(columns or published["columns"])
    method_map, column_map = dict(method_map or {}), dict(column_map or {})
    rows = []
    for pub_method, entry in published.items():
        if pub_method == "columns":
            continue
        means, ses = _published_entry(entry, len(columns))
        method = method_map.get(pub_method, pub_method)
        for col, pub_mean, pub_se in zip(columns, means, ses, strict=True):
            if pub_mean is None:
                continue
            ours_col = column_map.get(col, col)
            mean, se = _ours_cell(ours, method, ours_col, percent)
            rows.append(_compare_row(method, ours_col, mean, se, pub_mean, pub_se, n_se))
    frame = pd.DataFrame(rows)
    frame["differs"] = frame["differs"].astype("boolean")
    return frame


def _published_entry(entry: object, n: int) -> tuple[list, list]:
    if isinstance(entry, Mapping):
        return list(entry["mean"]), list(entry.get("se") or [None] * n)
    return list(entry), [None] * n  # type: ignore[call-overload]


def _ours_cell(ours: pd.DataFrame, method: str, column: str, percent: bool) -> tuple[float, float]:
    if method not in ours.index or (column, "mean") not in ours.columns:
        return math.nan, math.nan
    scale = 100.0 if percent and column.split("_")[0] in ("acc", "pi", "delta") else 1.0
    return (float(ours.at[method, (column, "mean")]) * scale,
            float(ours.at[method, (column, "se")]) * scale)


def _compare_row(
    method: str, column: str, mean: float, se: float, pub_mean: float, pub_se: float | None,
    n_se: float,
) -> dict[str, object]:
    diff = mean - pub_mean
    parts = [s for s in (se, pub_se) if s is not None and not math.isnan(s)]
    combined = math.sqrt(sum(s * s for s in parts)) if parts else math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        z = float(np.divide(diff, combined))
    undecided = math.isnan(diff) or math.isnan(combined)
    return {
        "method": method, "column": column, "ours_mean": mean, "ours_se": se,
        "published_mean": pub_mean, "published_se": math.nan if pub_se is None else pub_se,
        "diff": diff, "combined_se": combined, "z": z,
        "differs": pd.NA if undecided else bool(abs(diff) > n_se * combined),
    }
