"""One-sided Wilcoxon signed-rank tests of every method against a baseline, paired by seed.

Esipova et al. 2023, Sec. 6.2: a small p means "method better than the
baseline"; the direction of each column comes from its name (:func:`higher_is_better`).
The input is a per-seed table such as :func:`dpfair.fairness.records.seed_table`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import pandas as pd
from scipy import stats

ALPHA = 0.05  # the significance level at which p-values are shown


def seeds_needed(alpha: float = ALPHA) -> int:
    """The fewest paired seeds with which a one-sided exact Wilcoxon signed-rank test can
    reach ``p < alpha``: its smallest p-value with n pairs is ``1 / 2**n`` (all differences in
    the tested direction, no ties), so n = 5 for 0.05 (1/32 = 0.031; 4 pairs give 1/16)."""
    return math.floor(math.log2(1.0 / alpha)) + 1


MIN_PAIRS = seeds_needed(ALPHA)
_SignedRankRow = dict[str, int | float | str]  # n_pairs, mean_diff, statistic, p_value, note


def higher_is_better(column: str) -> bool:
    """Direction of a metric from its name: accuracies and Delta (private minus non-private
    accuracy) up; losses, pi, R and every gap down."""
    if column.endswith("gap") or column.split("_")[0] in ("loss", "pi", "R"):
        return False
    if column.startswith(("acc", "delta")) or column.endswith("accuracy"):
        return True
    raise ValueError(f"cannot tell whether {column!r} is better high or low; pass better=")


def wilcoxon_vs_baseline(
    values: pd.Series,
    *,
    baseline: str = "dpsgd",
    better: Literal["higher", "lower"] | None = None,
    min_pairs: int = MIN_PAIRS,
) -> pd.DataFrame:
    """One-sided Wilcoxon signed-rank test of every method against ``baseline``.

    ``values`` is indexed by ``(method, seed)`` (a column of
    :func:`~dpfair.fairness.records.seed_table` or
    :func:`~dpfair.fairness.records.metric_by_seed`); runs are paired by seed, seeds missing
    on either side dropped.
    The alternative is chosen so that **a small p means "method better than baseline"**:
    ``d_s = method_s - baseline_s`` is tested with ``alternative="greater"`` when higher is
    better (accuracy) and ``"less"`` when lower is better (loss, pi, R, gaps), as in
    Esipova et al. 2023, Sec. 6.2. ``better`` defaults to :func:`higher_is_better` of the
    series name. scipy drops zero differences (``zero_method="wilcox"``) and uses the exact
    null distribution for small samples without ties.

    Result columns: ``method, n_pairs, mean_diff, statistic, p_value, note``. Fewer than
    ``min_pairs`` pairs (default 5: with 4 pairs the smallest possible p is 1/16) gives
    ``p_value`` NaN and a note; all differences zero gives ``p_value`` 1.0 (no evidence of
    improvement) and a note.
    """
    if better is None:
        better = "higher" if higher_is_better(str(values.name)) else "lower"
    alternative = {"higher": "greater", "lower": "less"}[better]
    methods = list(dict.fromkeys(values.index.get_level_values("method")))
    if baseline not in methods:
        raise ValueError(f"baseline {baseline!r} not among methods {methods}")
    base = values.xs(baseline, level="method").dropna()
    rows = []
    for m in methods:
        if m == baseline:
            continue
        ours = values.xs(m, level="method").dropna()
        seeds = ours.index.intersection(base.index)
        diff = (ours.loc[seeds] - base.loc[seeds]).to_numpy(dtype=np.float64)
        rows.append({"method": m, **_signed_rank(diff, alternative, min_pairs)})
    return pd.DataFrame(
        rows, columns=["method", "n_pairs", "mean_diff", "statistic", "p_value", "note"]
    )


def _signed_rank(diff: np.ndarray, alternative: str, min_pairs: int) -> _SignedRankRow:
    n = int(diff.size)
    row: _SignedRankRow = {
        "n_pairs": n, "mean_diff": float(diff.mean()) if n else math.nan,
        "statistic": math.nan, "p_value": math.nan, "note": "",
    }
    if n < min_pairs:
        row["note"] = f"only {n} paired seeds (< {min_pairs}): no test"
    elif not np.any(diff):
        row["p_value"] = 1.0
        row["note"] = "all paired differences are zero"
    else:
        res = stats.wilcoxon(diff, alternative=alternative, zero_method="wilcox")
        row["statistic"], row["p_value"] = float(res.statistic), float(res.pvalue)
    return row


def significance_table(
    per_seed: pd.DataFrame,
    *,
    baseline: str = "dpsgd",
    columns: Sequence[str] | None = None,
    min_pairs: int = MIN_PAIRS,
    alpha: float | None = ALPHA,
) -> pd.DataFrame:
    """p-values (method x column) of :func:`wilcoxon_vs_baseline` for each column of a
    per-seed table (e.g. :func:`~dpfair.fairness.records.seed_table`); directions from
    :func:`higher_is_better`.

    With ``alpha`` (default 0.05) a method is tested only when it has enough paired seeds for
    the test to reach ``p < alpha`` (:func:`seeds_needed`, whatever ``min_pairs`` allows):
    otherwise its p-values are left out and its ``note`` says how many seeds are needed (a
    table of notes alone when no method has enough). ``alpha=None``: every p-value that
    ``min_pairs`` allows.
    """
    columns = list(columns or per_seed.columns)
    needed = max(min_pairs, seeds_needed(alpha)) if alpha is not None else min_pairs
    out, pairs = {}, pd.Series(dtype=int)
    for col in columns:
        res = wilcoxon_vs_baseline(per_seed[col], baseline=baseline, min_pairs=needed)
        res = res.set_index("method")
        out[col] = res["p_value"]
        pairs = res["n_pairs"].combine(pairs, max, fill_value=0)
    table = pd.DataFrame(out)
    if alpha is None or table.empty:
        return table
    short = pairs[pairs < needed]
    if short.empty:
        return table
    table["note"] = ""
    for m, count in short.items():
        n = int(count)
        table.loc[m, "note"] = (f"{n} paired seed{'s' if n != 1 else ''}: a one-sided Wilcoxon "
                                f"test needs at least {needed} to reach p < {alpha:g}; run "
                                f"with {needed} or more seeds")
    if len(short) == len(table):
        return table[["note"]]
    return table
