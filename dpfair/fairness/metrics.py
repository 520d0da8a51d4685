"""Test-set metrics of one trained model, per group and per class (numpy only).

This is the per-run layer that :mod:`dpfair.training` evaluates with; it imports nothing but
numpy, so training stays light. Comparisons across runs (privacy cost, tables, tests) live in
the sibling modules of :mod:`dpfair.fairness`.

:meth:`GroupMetrics.to_records` writes the canonical long records of many runs, one per
(method, seed, group, metric); :func:`dpfair.fairness.records.runs_frame` describes the format
and turns a list of them into a table.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpfair.fairness import rates

ALL = "all"
ACCURACY = "accuracy"
LOSS = "loss"
COUNT = "count"
MACRO_ACCURACY = "macro_accuracy"
WORST_CLASS_ACCURACY = "worst_class_accuracy"
WORST_GROUP_ACCURACY = "worst_group_accuracy"
RECORD_COLUMNS = ("method", "seed", "group", "metric", "value")
PROB_FLOOR = 1e-12

Record = dict[str, str | int | float]  # one row of the canonical format (RECORD_COLUMNS)


@dataclass(frozen=True)
class GroupMetrics:
    """Test-set metrics of one model, per group and per class.

    Arrays are indexed by group id (``group_*``) or class id (``class_*``). Accuracies are
    fractions; losses are NaN when no losses were given. ``worst_group``/``worst_class`` is
    the id of the lowest accuracy (the first one on ties; absent groups ignored).
    """

    group_accuracy: np.ndarray
    group_loss: np.ndarray
    group_count: np.ndarray
    class_accuracy: np.ndarray
    class_loss: np.ndarray
    class_count: np.ndarray
    accuracy: float
    loss: float
    macro_accuracy: float
    worst_group: int
    worst_group_accuracy: float
    worst_class: int
    worst_class_accuracy: float

    def to_records(
        self,
        method: str,
        seed: int,
        group_names: Sequence[str],
        class_names: Sequence[str] | None = None,
    ) -> list[Record]:
        """Records in the canonical format of :func:`dpfair.fairness.records.runs_frame`
        (:func:`metric_records` of these metrics)."""
        return metric_records(asdict(self), method, seed, group_names, class_names)


def metric_records(
    metrics: Mapping[str, Any],
    method: str,
    seed: int,
    group_names: Sequence[str],
    class_names: Sequence[str] | None = None,
) -> list[Record]:
    """One model's test metrics (the fields of :class:`GroupMetrics`, or the subset that a
    noisy release has, :func:`dpfair.fairness.noisy.noisy_group_metrics`) as records in the
    canonical format of :func:`dpfair.fairness.records.runs_frame`.

    Per group: accuracy, loss, count; for :data:`ALL`: accuracy, loss, macro, worst-class
    and worst-group accuracy; the measures of :mod:`dpfair.fairness.rates` when present
    (per group ``selection_rate``, ...; for :data:`ALL` the disparities). Per class (group
    ``"class:<name>"``) only when ``class_names`` is given. A metric absent from
    ``metrics`` (a noisy release has no count, no per-class metric and no macro accuracy) has
    no record.
    """
    if len(group_names) != len(metrics["group_accuracy"]):
        raise ValueError(
            f"{len(group_names)} group names for {len(metrics['group_accuracy'])} groups"
        )
    rows: list[tuple[str, str, float]] = []
    for k, name in enumerate(group_names):
        rows += [(name, metric, metrics[f"group_{metric}"][k])
                 for metric in (ACCURACY, LOSS, COUNT) if f"group_{metric}" in metrics]
    rows += [(ALL, metric, metrics[metric]) for metric in
             (ACCURACY, LOSS, MACRO_ACCURACY, WORST_CLASS_ACCURACY, WORST_GROUP_ACCURACY)
             if metric in metrics]
    for key in rates.rate_keys(metrics):
        rows += [(name, key[len("group_"):], metrics[key][k])
                 for k, name in enumerate(group_names)]
    rows += [(ALL, key, metrics[key]) for key in rates.disparity_keys(metrics)]
    if class_names is not None and "class_accuracy" in metrics:
        if len(class_names) != len(metrics["class_accuracy"]):
            raise ValueError(
                f"{len(class_names)} class names for {len(metrics['class_accuracy'])} classes"
            )
        for c, name in enumerate(class_names):
            rows += [(f"class:{name}", metric, metrics[f"class_{metric}"][c])
                     for metric in (ACCURACY, LOSS, COUNT)]
    return [
        {"method": method, "seed": seed, "group": g, "metric": m, "value": float(v)}
        for g, m, v in rows
    ]


def per_sample_nll(y_true: npt.ArrayLike, probs: npt.ArrayLike) -> np.ndarray:
    """Cross-entropy ``-log p(y_i)`` of each sample.

    ``probs`` is ``(n, n_classes)`` class probabilities, or ``(n,)`` the probability of
    class 1 for a binary model ``f: R^d -> [0, 1]`` (Esipova et al. 2023, Sec. 3.1).
    Probabilities are floored at 1e-12 so a confident mistake costs ~27.6, not inf.
    """
    y = np.asarray(y_true, dtype=np.int64)
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim == 1:
        p = np.stack([1.0 - p, p], axis=1)
    if p.ndim != 2 or p.shape[0] != y.shape[0]:
        raise ValueError(f"probs of shape {p.shape} do not match {y.shape[0]} labels")
    return -np.log(np.maximum(p[np.arange(y.shape[0]), y], PROB_FLOOR))


def _segment_means(
    values: np.ndarray, ids: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Mean of ``values`` per id in ``range(n)`` (NaN where an id has no sample) and counts."""
    count = np.bincount(ids, minlength=n)
    total = np.bincount(ids, weights=values, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return mean, count


def _check_ids(ids: np.ndarray, n: int, what: str) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise ValueError(f"{what} ids must lie in [0, {n}), got [{ids.min()}, {ids.max()}]")


def _warn_absent(count: np.ndarray, what: str, names: Sequence[str] | None) -> None:
    for k in np.flatnonzero(count == 0):
        label = names[k] if names is not None else str(k)
        warnings.warn(
            f"{what} {label!r} (id {k}) has no samples in this split: its accuracy and loss "
            "are NaN and it is ignored by the worst-case and macro metrics",
            RuntimeWarning,
            stacklevel=3,
        )


def _nan_argmin(values: np.ndarray) -> tuple[int, float]:
    """Index and value of the smallest non-NaN entry, the first one on ties."""
    k = int(np.nanargmin(values))
    return k, float(values[k])


def group_metrics(
    y_true: npt.ArrayLike,
    y_pred: npt.ArrayLike | None,
    groups: npt.ArrayLike,
    n_groups: int,
    *,
    losses: npt.ArrayLike | None = None,
    probs: npt.ArrayLike | None = None,
    n_classes: int | None = None,
    group_names: Sequence[str] | None = None,
    class_names: Sequence[str] | None = None,
) -> GroupMetrics:
    """Accuracy, loss and count per group and per class; macro, worst-class, worst-group.

    The per-group accuracy and loss are ``acc(theta; D_k)`` and ``L(theta; D_k)`` of Esipova
    et al. 2023, Sec. 3.1, with ``D_k`` the test points of group k; macro accuracy is the
    mean of the per-class accuracies (Zhao et al., Sec. 4.1, Eq. 2).

    Loss per sample comes from ``losses`` or, with ``probs``, is the cross-entropy
    (:func:`per_sample_nll`); give at most one. ``y_pred`` may be None when ``probs`` is
    given: the prediction is then ``argmax`` (the lowest class on ties).
    ``n_classes`` defaults to ``probs.shape[1]`` (2 for 1-D probs) or ``max(label) + 1``.

    **Absent groups/classes.** A group (class) with no sample in the split gets NaN
    accuracy and loss and a ``RuntimeWarning`` naming it; worst-group (worst-class) and
    macro accuracy ignore NaN entries. An empty split is a ``ValueError``.
    **Ties.** The worst group (class) is the first id with the lowest accuracy.
    """
    y = np.asarray(y_true, dtype=np.int64).ravel()
    g = np.asarray(groups, dtype=np.int64).ravel()
    if y.size == 0:
        raise ValueError("group_metrics needs at least one sample")
    if losses is not None and probs is not None:
        raise ValueError("give per-sample losses or probs, not both")
    if probs is not None:
        p = np.asarray(probs, dtype=np.float64)
        loss = per_sample_nll(y, p)
        n_classes = n_classes or (p.shape[1] if p.ndim == 2 else 2)
        if y_pred is None:
            y_pred = p.argmax(axis=1) if p.ndim == 2 else (p > 0.5).astype(np.int64)
    elif losses is not None:
        loss = np.asarray(losses, dtype=np.float64).ravel()
    else:
        loss = np.full(y.shape, np.nan)
    if y_pred is None:
        raise ValueError("y_pred is required unless probs is given")
    pred = np.asarray(y_pred, dtype=np.int64).ravel()
    if not (pred.shape == g.shape == loss.shape == y.shape):
        raise ValueError(
            f"lengths disagree: y_true {y.size}, y_pred {pred.size}, groups {g.size}, "
            f"losses {loss.size}"
        )
    n_classes = n_classes or int(max(y.max(), pred.max())) + 1
    _check_ids(g, n_groups, "group")
    _check_ids(y, n_classes, "class")
    correct = (pred == y).astype(np.float64)
    g_acc, g_count = _segment_means(correct, g, n_groups)
    g_loss, _ = _segment_means(loss, g, n_groups)
    c_acc, c_count = _segment_means(correct, y, n_classes)
    c_loss, _ = _segment_means(loss, y, n_classes)
    _warn_absent(g_count, "group", group_names)
    _warn_absent(c_count, "class", class_names)
    worst_group, worst_group_acc = _nan_argmin(g_acc)
    worst_class, worst_class_acc = _nan_argmin(c_acc)
    return GroupMetrics(
        group_accuracy=g_acc,
        group_loss=g_loss,
        group_count=g_count,
        class_accuracy=c_acc,
        class_loss=c_loss,
        class_count=c_count,
        accuracy=float(correct.mean()),
        loss=float(loss.mean()),
        macro_accuracy=float(np.nanmean(c_acc)),
        worst_group=worst_group,
        worst_group_accuracy=worst_group_acc,
        worst_class=worst_class,
        worst_class_accuracy=worst_class_acc,
    )


def intersect_groups(
    *group_arrays: npt.ArrayLike, names: Sequence[Sequence[str]], sep: str = " & "
) -> tuple[np.ndarray, list[str]]:
    """Intersectional groups: one id per combination of protected attributes.

    ``names[j]`` lists the values of attribute j. The id is the mixed-radix number
    ``((g_0 * n_1) + g_1) * n_2 + ...``, so the last attribute varies fastest; every
    combination gets an id and a name (``"F & non-white"``), also those with no sample.
    """
    if not group_arrays:
        raise ValueError("intersect_groups needs at least one group array")
    if len(names) != len(group_arrays):
        raise ValueError(f"{len(names)} name lists for {len(group_arrays)} attributes")
    arrays = [np.asarray(a, dtype=np.int64).ravel() for a in group_arrays]
    if len({a.size for a in arrays}) != 1:
        raise ValueError(f"group arrays differ in length: {[a.size for a in arrays]}")
    ids = np.zeros_like(arrays[0])
    for a, values in zip(arrays, names, strict=True):
        _check_ids(a, len(values), "attribute")
        ids = ids * len(values) + a
    combined = [sep.join(combo) for combo in itertools.product(*names)]
    return ids, combined
