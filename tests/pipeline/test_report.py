"""dpfair.pipeline.report: figures are written and readable; comparison with published numbers.

Set ``DPFAIR_FIGURES_DIR=/tmp/dpfair_figs`` to keep the sample figures for a look.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from dpfair import fairness as F
from dpfair.pipeline import report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# mean test accuracy per group, like Esipova et al. 2023 Table 2 (MNIST, class 8 rare)
ACCURACY = {
    "nonprivate": {"class 2": 0.98, "class 8": 0.84, "class 5": 0.97},
    "dpsgd": {"class 2": 0.89, "class 8": 0.26, "class 5": 0.88},
    "dpsgd_f": {"class 2": 0.895, "class 8": 0.59, "class 5": 0.89},
    "dpsgd_global_adapt": {"class 2": 0.92, "class 8": 0.655, "class 5": 0.91},
}


@pytest.fixture
def fig_dir(tmp_path: Path) -> Path:
    return Path(os.environ.get("DPFAIR_FIGURES_DIR", tmp_path))


@pytest.fixture
def runs() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    recs = []
    for method, accs in ACCURACY.items():
        for seed in range(5):
            for group, acc in accs.items():
                noisy = acc + rng.normal(0, 0.01)
                for metric, value in (("accuracy", noisy), ("loss", 2.5 * (1 - noisy))):
                    recs.append({"method": method, "seed": seed, "group": group,
                                 "metric": metric, "value": value})
    return F.runs_frame(recs)


def _check_png(path: Path, min_width: int = 800) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    image = matplotlib.image.imread(path)
    assert image.shape[1] >= min_width and image.shape[0] >= 500
    assert image[..., :3].std() > 0.05  # not blank


def test_group_accuracy_and_privacy_cost_figures(runs: pd.DataFrame, fig_dir: Path) -> None:
    out = report.plot_group_accuracy(runs, fig_dir / "group_accuracy.png")
    assert out == fig_dir / "group_accuracy.png"
    _check_png(out)
    out = report.plot_privacy_cost(runs, fig_dir / "privacy_cost.png",
                                   groups=["class 2", "class 8"])
    _check_png(out)


def test_training_curves_figure(fig_dir: Path) -> None:
    rng = np.random.default_rng(1)
    histories = {}
    for method, accs in ACCURACY.items():
        runs = []
        for _ in range(3):
            runs.append({
                epoch: {g: a * (1 - math.exp(-epoch / 4)) + rng.normal(0, 0.03)
                        for g, a in accs.items()}
                for epoch in range(1, 21)
            })
        histories[method] = runs
    histories["dpsgd"] = histories["dpsgd"][:1]  # one seed: a line without a band
    # epochs as strings (read back from JSON) and a seed that stopped early
    histories["dpsgd_f"][0] = {str(e): v for e, v in histories["dpsgd_f"][0].items() if e <= 15}
    _check_png(report.plot_training_curves(histories, fig_dir / "training_curves.png"))


def test_clip_bound_and_misalignment_figures(fig_dir: Path) -> None:
    rng = np.random.default_rng(2)
    steps = np.arange(200)
    trajectories = {
        "dpsgd_f": {"C_k class 2": 1 + 0.1 * np.tanh(steps / 50),
                    "C_k class 8": 1 + 1.8 * np.tanh(steps / 50)},
        "dpsgd_global_adapt": {"Z": 50 * np.exp(-steps / 60)[None, :]
                               + rng.normal(0, 1, (5, steps.size))},
    }
    out = report.plot_clip_bounds(trajectories, fig_dir / "clip_bounds.png", every=10)
    _check_png(out)
    r_dir = {"class 2": 0.01 * np.exp(-steps / 80), "class 8": 0.2 * np.exp(-steps / 150)}
    r_mag = {"class 2": 0.05 * np.exp(-steps / 80), "class 8": 0.08 * np.exp(-steps / 80)}
    _check_png(report.plot_misalignment(r_dir, r_mag, fig_dir / "misalignment.png", every=10))


def test_comparison_with_published() -> None:
    recs = []
    values = {("nonprivate", 0): (0.90, 0.80), ("nonprivate", 1): (0.92, 0.78),
              ("dpsgd", 0): (0.85, 0.60), ("dpsgd", 1): (0.87, 0.50)}
    for (method, seed), (acc_a, acc_b) in values.items():
        for group, acc in (("a", acc_a), ("b", acc_b)):
            for metric, value in (("accuracy", acc), ("loss", 1 - acc)):
                recs.append({"method": method, "seed": seed, "group": group,
                             "metric": metric, "value": value})
    ours = F.comparison_stats(F.runs_frame(recs), ("a", "b"))
    published = {
        "columns": ["acc_a", "acc_b", "pi_a"],
        "nonprivate": {"mean": [91.0, 79.0, None], "se": [1.0, 1.0, None]},
        "dpsgd": {"mean": [86.0, 70.0, 5.0], "se": [0.5, 1.0, None]},
        "dpsgd_f": [90.0, 60.0, 3.0],
    }
    cmp = report.comparison_with_published(ours, published)
    rows = cmp.set_index(["method", "column"])
    assert len(cmp) == 8  # 2 + 3 + 3: the None entries are skipped
    assert rows.loc[("nonprivate", "acc_a"), "diff"] == pytest.approx(0.0)
    assert not rows.loc[("nonprivate", "acc_a"), "differs"]
    # ours 55.0 +- 5.0 vs 70.0 +- 1.0: |diff| 15 > 2 sqrt(26) = 10.2
    b = rows.loc[("dpsgd", "acc_b")]
    assert b["combined_se"] == pytest.approx(math.sqrt(26.0))
    assert b["z"] == pytest.approx(-15 / math.sqrt(26.0)) and b["differs"]
    # no published SE: ours alone (pi_a 5.0 +- 1.0 vs 5.0)
    assert rows.loc[("dpsgd", "pi_a"), "combined_se"] == pytest.approx(1.0)
    assert not rows.loc[("dpsgd", "pi_a"), "differs"]
    # a method we did not run: undecided
    assert pd.isna(rows.loc[("dpsgd_f", "acc_a"), "differs"])
    renamed = report.comparison_with_published(
        ours, {"columns": ["acc_2"], "sgd": [91.0]}, method_map={"sgd": "nonprivate"},
        column_map={"acc_2": "acc_a"},
    )
    assert renamed.loc[0, "method"] == "nonprivate" and renamed.loc[0, "column"] == "acc_a"
    assert renamed.loc[0, "diff"] == pytest.approx(0.0)


def test_figures_fit_a_browser_with_many_groups_and_methods(fig_dir: Path) -> None:
    """Ten groups x four methods (the digits pipeline) and five panels stay within
    MAX_WIDTH_PX (the privacy-cost figure was 3075 px wide)."""
    rng = np.random.default_rng(1)
    methods = ["nonprivate", "dpsgd", "dpsgd_f", "dpsgd_global_adapt"]
    recs = [{"method": m, "seed": s, "group": str(g), "metric": "accuracy",
             "value": float(rng.uniform(0.5, 1.0))}
            for m in methods for s in range(2) for g in range(10)]
    runs = F.runs_frame(recs)
    paths = [report.plot_group_accuracy(runs, fig_dir / "wide_group_accuracy.png"),
             report.plot_privacy_cost(runs, fig_dir / "wide_privacy_cost.png")]
    curves = {m: [{e: {"0": 0.5 + 0.01 * e, "8": 0.3 + 0.01 * e} for e in range(1, 6)}]
              for m in [*methods, "fairlens"]}
    paths.append(report.plot_training_curves(curves, fig_dir / "wide_curves.png"))
    for path in paths:
        _check_png(path)
        assert matplotlib.image.imread(path).shape[1] <= report.MAX_WIDTH_PX


def test_rate_figures_and_the_report_page(runs: pd.DataFrame, fig_dir: Path) -> None:
    """The per-group fairness rates as one panel per measure (none without rates), and the
    report page that embeds every figure with the tables and notes."""
    from dpfair.fairness.rates import MEASURES
    from dpfair.pipeline.report_page import write_report_page

    groups, methods = ["class 2", "class 8", "class 5"], list(ACCURACY)
    assert report.plot_rate_figures(runs, fig_dir, groups, ["0", "1"], methods) == {}
    rng = np.random.default_rng(1)
    rows = [{"method": m, "seed": s, "group": g, "metric": k, "value": rng.uniform()}
            for m in methods for s in range(3) for g in groups for k in MEASURES]
    with_rates = F.runs_frame(pd.concat([runs, pd.DataFrame(rows)], ignore_index=True))
    figures = report.plot_rate_figures(with_rates, fig_dir, groups, ["0", "1"], methods)
    assert list(figures) == ["fairness_rates"]
    _check_png(figures["fairness_rates"])
    table = pd.DataFrame({"acc class 8": ["26.0 ± 1.0"]}, index=["dpsgd"])
    page = write_report_page("digits: comparison", table, {"rates": table}, ["ε covers <all>"],
                             figures, fig_dir / "report.html")
    html = page.read_text()
    assert html.count("<table") == 2 and "ε covers &lt;all&gt;" in html
    assert 'alt="fairness rates" src="data:image/png;base64,iVBORw0KGgo' in html


def test_rate_figures_refilled_for_each_class_show_what_a_fresh_drawing_shows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi-class target's rate figures reuse the first class's panels: each later class's
    bars, error bars, y range and title are those of the same figure drawn on its own."""
    from matplotlib.figure import Figure

    from dpfair.fairness.rates import MEASURES

    groups, methods = [str(g) for g in range(10)], ["nonprivate", "dpsgd", "dpsgd_f"]
    rng = np.random.default_rng(2)
    rows = [{"method": m, "seed": s, "group": g, "metric": f"{k}_class{c}",
             "value": float(rng.uniform(-0.2 if c == 2 else 0.0, 1.0))}
            for m in methods for s in range(2) for g in groups for k in MEASURES
            for c in range(3)]
    runs = F.runs_frame(rows)
    shown: dict[str, list] = {}

    def state(fig: Figure, path: str | Path) -> Path:
        axes = [ax for ax in fig.axes if ax.get_visible()]
        shown[Path(path).name] = [fig.get_suptitle(), *(
            (ax.get_title(), ax.get_ylim(), [r.get_height() for r in ax.patches],
             [s.tolist() for c in ax.collections for s in c.get_segments()]) for ax in axes)]
        return Path(path)

    monkeypatch.setattr(report, "_save", state)
    classes = [str(c) for c in range(3)]
    report.plot_rate_figures(runs, tmp_path, groups, classes, methods)
    refilled = dict(shown)
    for c in (1, 2):  # drawn alone: the frame without the classes drawn before it
        alone = runs[runs["metric"].str.endswith(f"_class{c}")]
        report.plot_rate_figures(alone, tmp_path, groups, classes, methods)
        name = f"fairness_rates_class{c}.png"
        assert refilled[name][0] == shown[name][0]
        for got, fresh in zip(refilled[name][1:], shown[name][1:], strict=True):
            assert got[0] == fresh[0]
            np.testing.assert_allclose(got[1], fresh[1], rtol=1e-9)
            np.testing.assert_allclose(got[2], fresh[2])
            np.testing.assert_allclose(got[3], fresh[3])
