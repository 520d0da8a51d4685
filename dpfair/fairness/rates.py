"""The fairness measures practitioners report: selection and error rates per group, and their
disparities across groups, as Fairlearn defines them.

Per group (``group_<measure>``, a list indexed by group id, NaN for a group absent from the
split): selection rate ``P(ŷ=1 | A=a)``, true-positive rate ``P(ŷ=1 | Y=1, A=a)``,
false-positive rate ``P(ŷ=1 | Y=0, A=a)``, false-negative rate ``P(ŷ=0 | Y=1, A=a)`` and
precision ``P(Y=1 | ŷ=1, A=a)`` (a rate whose condition has no row is 0, as in Fairlearn and
scikit-learn), and, given the class probabilities, the calibration error in the large
``|mean p̂(Y=1 | x) - P(Y=1)|`` over the group's rows (Fairlearn has no calibration metric).
Across groups: demographic-parity difference (largest minus smallest selection rate) and
ratio (smallest over largest; the four-fifths rule asks for >= 0.8), equalized-odds
difference (the larger of the TPR and FPR differences) and equal-opportunity difference (the
TPR difference) (Hardt et al. 2016, Eqs. 1-2).

**Positive class.** A binary target's positive class is class 1 (a table's
``positive_label``); the keys carry no suffix. A multi-class target is measured one-vs-rest
for each class ``c`` (keys suffixed ``_class<c>``), and the unsuffixed disparities are the
worst over classes (the largest difference, the smallest ratio).

Both from the confusion counts of :func:`confusion_counts`: :func:`exact_rates` (exact
predictions; equal to Fairlearn's ``MetricFrame`` and disparity functions,
tests/fairness/test_rates.py) and :func:`rates_from_counts` (counts released with noise by
:mod:`dpfair.fairness.noisy`: post-processing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

SELECTION_RATE = "selection_rate"
CALIBRATION = "calibration_error"
MEASURES = (SELECTION_RATE, "true_positive_rate", "false_positive_rate", "false_negative_rate",
            "precision", CALIBRATION)
DP_DIFFERENCE = "demographic_parity_difference"
DP_RATIO = "demographic_parity_ratio"
EO_DIFFERENCE = "equalized_odds_difference"
EOP_DIFFERENCE = "equal_opportunity_difference"
DISPARITIES = (DP_DIFFERENCE, DP_RATIO, EO_DIFFERENCE, EOP_DIFFERENCE)
#: the disparities' short names (tables' columns, ``experiment.show``)
SHORT = {DP_DIFFERENCE: "dp_diff", DP_RATIO: "dp_ratio", EO_DIFFERENCE: "eo_diff",
         EOP_DIFFERENCE: "eop_diff"}
#: the disparity that is fairest when largest (1); the others are fairest at 0
HIGHER_IS_FAIRER = frozenset({DP_RATIO})
#: the confusion counts behind the measures, per positive class and group (:func:`confusion_counts`)
COUNTS = ("true_positives", "false_positives", "positives", "predicted_probability")


def positive_classes(n_classes: int) -> list[int]:
    """The classes measured as positive: class 1 of a binary target, every class otherwise."""
    return [1] if n_classes == 2 else list(range(n_classes))


def suffix(c: int, n_classes: int) -> str:
    """The key suffix of positive class ``c`` (none for a binary target)."""
    return "" if n_classes == 2 else f"_class{c}"


def calibration_in_the_large(y_true: npt.ArrayLike, y_prob: npt.ArrayLike) -> float:
    """``|mean(y_prob) - mean(y_true)|``: how far the mean predicted probability of the
    positive class is from its observed rate."""
    return float(abs(np.mean(y_prob) - np.mean(y_true)))


def exact_rates(
    y_true: npt.ArrayLike, y_pred: npt.ArrayLike, groups: npt.ArrayLike, n_groups: int,
    n_classes: int, prob: npt.ArrayLike | None = None,
) -> dict[str, Any]:
    """The measures of the module docstring from exact predictions: those of their exact
    :func:`confusion_counts`, a group absent from the split NaN (ignored by the disparities).
    They equal Fairlearn's ``MetricFrame`` ``by_group`` rates and its between-groups
    ``difference`` and ``ratio`` (``fairlearn.metrics.demographic_parity_difference`` and the
    others; tests/fairness/test_rates.py checks them equal), without loading Fairlearn,
    pandas and scikit-learn (seconds per process, and 20 ``MetricFrame`` s for 10 classes);
    with ``prob`` (``(n, n_classes)``) also the calibration error per group."""
    g = np.asarray(groups, dtype=np.int64).ravel()
    rows = np.bincount(g, minlength=n_groups).astype(np.float64)
    counts = confusion_counts(y_true, y_pred, g, n_groups, n_classes, prob)
    return _from_counts(rows, counts, n_classes, absent=rows == 0)


def confusion_counts(
    y_true: npt.ArrayLike, y_pred: npt.ArrayLike, groups: npt.ArrayLike, n_groups: int,
    n_classes: int, prob: npt.ArrayLike | None = None,
) -> np.ndarray:
    """``(len(positive_classes), 3 or 4, n_groups)``: for each positive class, the true
    positives, false positives and positives (:data:`COUNTS`) of each group, and with
    ``prob`` the sum of the class's predicted probabilities. One row adds at most 1 to two of
    the counts (its own class's positives and either that class's true positives or the
    predicted class's false positives) and its probabilities, whose squares sum to at most 1,
    to the sums: an L2 sensitivity of ``sqrt(2)``, ``sqrt(3)`` with ``prob``."""
    y, pred = np.asarray(y_true).ravel(), np.asarray(y_pred).ravel()
    g = np.asarray(groups, dtype=np.int64).ravel()
    p = None if prob is None else np.asarray(prob, dtype=np.float64)
    per_class = []
    for c in positive_classes(n_classes):
        true_c, pred_c = y == c, pred == c
        weights = [true_c & pred_c, ~true_c & pred_c, true_c] + ([] if p is None else [p[:, c]])
        per_class.append([np.bincount(g, weights=w.astype(np.float64), minlength=n_groups)
                          for w in weights])
    return np.asarray(per_class, dtype=np.float64)


def rates_from_counts(n: npt.ArrayLike, counts: np.ndarray, n_classes: int) -> dict[str, Any]:
    """The measures of the module docstring from each group's row count ``n`` and the
    :func:`confusion_counts` (exact or noisy: rates are clipped to [0, 1], a denominator
    below 1 counts as 1)."""
    return _from_counts(np.asarray(n, dtype=np.float64), counts, n_classes, absent=None)


def _from_counts(rows: np.ndarray, counts: np.ndarray, n_classes: int,
                 absent: np.ndarray | None) -> dict[str, Any]:
    """:func:`rates_from_counts`; the groups ``absent`` (exact counts only) NaN."""
    out: dict[str, Any] = {}
    for c, per_class in zip(positive_classes(n_classes), counts, strict=True):
        tp, fp, pos = per_class[:3]
        sfx = suffix(c, n_classes)
        rates = {
            SELECTION_RATE: _rate(tp + fp, rows),
            "true_positive_rate": _rate(tp, pos),
            "false_positive_rate": _rate(fp, rows - pos),
            "false_negative_rate": _rate(pos - tp, pos),
            "precision": _rate(tp, tp + fp),
        }
        if len(per_class) > 3:  # the predicted probabilities' sums
            rates[CALIBRATION] = _rate(np.abs(per_class[3] - pos), rows)
        if absent is not None:
            rates = {m: np.where(absent, np.nan, r) for m, r in rates.items()}
        out.update({f"group_{m}{sfx}": rates[m].tolist() for m in MEASURES if m in rates})
        out.update({f"{k}{sfx}": v for k, v in disparities(rates).items()})
    return _with_worst(out, n_classes)


def disparities(rates: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Fairlearn's between-groups disparities of per-group rates (absent groups, NaN,
    ignored): differences are largest minus smallest, the ratio smallest over largest."""

    def spread(m: str) -> float:
        return float(np.nanmax(rates[m]) - np.nanmin(rates[m]))

    sel = np.asarray(rates[SELECTION_RATE], dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = float(np.nanmin(sel) / np.nanmax(sel))
    tpr = spread("true_positive_rate")
    return {DP_DIFFERENCE: spread(SELECTION_RATE), DP_RATIO: ratio,
            EO_DIFFERENCE: max(tpr, spread("false_positive_rate")), EOP_DIFFERENCE: tpr}


def _rate(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    return np.clip(numerator / np.maximum(denominator, 1.0), 0.0, 1.0)


def _with_worst(out: dict[str, Any], n_classes: int) -> dict[str, Any]:
    """A multi-class target's unsuffixed disparities: the worst over its classes."""
    if n_classes == 2:
        return out
    for d in DISPARITIES:
        values = [out[f"{d}{suffix(c, n_classes)}"] for c in positive_classes(n_classes)]
        out[d] = float(np.nanmin(values) if d in HIGHER_IS_FAIRER else np.nanmax(values))
    return out


def rate_keys(metrics: Mapping[str, Any]) -> list[str]:
    """The keys of ``metrics`` that are per-group measures of this module, in order."""
    return [k for k in metrics if k.startswith("group_")
            and any(k[len("group_"):].split("_class")[0] == m for m in MEASURES)]


def disparity_keys(metrics: Mapping[str, Any]) -> list[str]:
    """The keys of ``metrics`` that are disparities of this module, in order."""
    return [k for k in metrics if k.split("_class")[0] in DISPARITIES]
