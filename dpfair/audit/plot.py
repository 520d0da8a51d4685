"""The audit's figure: per audited group, histograms of the scores of included and excluded
canaries (well-separated histograms are what a high lower bound is made of)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from dpfair.audit.run import AuditResult

DPI = 120
MAX_WIDTH_IN = 13.0  # 1560 px at DPI: fits a browser window


def score_figure(result: AuditResult, path: str | Path) -> Path:
    """Write the PNG (Agg renderer, no pyplot state) and return its path."""
    groups = result.groups
    width = min(MAX_WIDTH_IN, 4.4 * len(groups))
    fig = Figure(figsize=(width, 3.6), layout="constrained")
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    for ax, row in zip(axes, groups, strict=True):
        mine = result.canary_groups == row.group_id
        scores, included = result.scores[mine], result.included[mine]
        bins = np.histogram_bin_edges(scores, bins=30)
        ax.hist(scores[included], bins=bins, alpha=0.6, label=f"included ({included.sum()})")
        ax.hist(scores[~included], bins=bins, alpha=0.6, label=f"excluded ({(~included).sum()})")
        claimed = row.epsilon_claimed
        claim = "no guarantee" if claimed is None else f"claimed ε {claimed:.3g}"
        ax.set_title(f"{row.group}: ε ≥ {row.epsilon_lower_bound:.3g} ({claim})", fontsize=10)
        ax.set_xlabel("canary score")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("canaries")
    fig.suptitle(f"{result.method} audit, {result.plan.kind} canaries, "
                 f"confidence {result.confidence:.0%}", fontsize=11)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    return path
