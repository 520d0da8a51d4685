"""The selection score of a run, released from its validation predictions.

``score`` is ``loss`` (minimised) or an accuracy (maximised). With ``score_privacy: noisy``
(the default) a run releases the contingency table of validation examples by (group, class,
correct) plus N(0, σ_score²) on every cell: one example changes one cell by 1, so this is one
Gaussian query of L2 sensitivity 1 (``GaussianDpEvent(σ_score)``, composed into the run event
by :mod:`dpfair.tuning.search_events`). Accuracy, macro accuracy (mean over classes) and worst-group
accuracy are post-processing of the noisy table (cells clamped at 0; a class/group whose noisy
count is 0 is skipped). For ``loss`` each example contributes ``(min(ℓ_i, L)/L, 1)/√2`` (norm
≤ 1, L = ``loss_clip``): the noisy sum gives the mean clipped loss ``L·v0/v1``. With
``score_privacy: public_validation`` the validation split is declared public and the exact
score is used. The noise of a trial is drawn from OS entropy (``SeedSequence()``, kept
nowhere); with ``TuningConfig.reproducible``, that of trial n from
``SeedSequence([seed, 78, n])``.

**Fairness scores.** A disparity of :mod:`dpfair.fairness.rates` as the score (demographic
parity difference or ratio, equalized-odds or equal-opportunity difference; the differences
minimised), or an accuracy score subject to one (``TuningConfig.constraint``), releases the
finer table of validation examples by (group, class, predicted class) instead: still one
example in one cell, sensitivity 1, the same ``GaussianDpEvent(σ_score)``; the true and false
positives and the positives of each group, and so the rates and accuracies, are
post-processing of it (:func:`contingency`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from dpfair.fairness.rates import DISPARITIES, positive_classes, rates_from_counts

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from dpfair.tuning.config import ScoreConstraint, TuningConfig
    from dpfair.tuning.protocols import DatasetLike, PredictionsLike

__all__ = ["NOISE_STREAM", "contingency", "n_classes_groups", "release_score", "score_rng"]

NOISE_STREAM = 78  # "N": the SeedSequence stream of the score noise


def _field(predictions: PredictionsLike, name: str) -> ArrayLike:
    return predictions[name] if isinstance(predictions, Mapping) else getattr(predictions, name)


def score_rng(cfg: TuningConfig, trial_number: int) -> np.random.Generator:
    """The generator of trial ``trial_number``'s score noise: fresh OS entropy, or with
    ``cfg.reproducible`` seeded by (seed, trial number), the same on every worker."""
    entropy = [cfg.seed, NOISE_STREAM, trial_number] if cfg.reproducible else None
    return np.random.default_rng(np.random.SeedSequence(entropy))


def n_classes_groups(dataset: DatasetLike, predictions: PredictionsLike) -> tuple[int, int]:
    """The dataset's numbers of classes and groups, else the largest labels seen plus one."""
    try:
        return int(dataset.n_classes), int(dataset.n_groups)  # type: ignore[attr-defined]
    except AttributeError:
        y = np.asarray(_field(predictions, "y_true"))
        g = np.asarray(_field(predictions, "groups"))
        return int(y.max(initial=0)) + 1, int(g.max(initial=0)) + 1


def release_score(
    predictions: PredictionsLike,
    score: str,
    n_classes: int,
    n_groups: int,
    sigma_score: float | None,
    loss_clip: float,
    rng: np.random.Generator | None = None,
    constraint: ScoreConstraint | None = None,
) -> float:
    """The selection score from validation predictions (``y_true``, ``y_pred``, ``groups``,
    ``loss``), noised as described in the module doc when ``sigma_score`` is given; with
    ``constraint`` an accuracy score minus 1 where the constraint's measure misses its
    bound."""
    noisy = sigma_score is not None
    if noisy and rng is None:
        raise ValueError("a noisy score needs a random generator")
    if score == "loss":
        loss = np.asarray(_field(predictions, "loss"), dtype=np.float64)
        clipped = np.clip(np.nan_to_num(loss, nan=loss_clip, posinf=loss_clip), 0.0, loss_clip)
        v = np.array([clipped.sum() / loss_clip, float(loss.size)]) / math.sqrt(2)
        if noisy:
            v = v + rng.normal(0.0, sigma_score, size=2)
        v = np.maximum(v, 0.0)
        return float(loss_clip * v[0] / v[1]) if v[1] > 0 else float(loss_clip)
    y = np.asarray(_field(predictions, "y_true"), dtype=np.int64)
    yp = np.asarray(_field(predictions, "y_pred"), dtype=np.int64)
    g = np.asarray(_field(predictions, "groups"), dtype=np.int64)
    by_prediction = score in DISPARITIES or constraint is not None
    table = contingency(y, yp, g, n_groups, n_classes, by_prediction)
    if noisy:
        table = np.maximum(table + rng.normal(0.0, sigma_score, size=table.shape), 0.0)
    if not by_prediction:
        return _accuracy_score(table, score)
    found = _disparities(table)
    if constraint is None:
        return found[score]
    value = _accuracy_score(_by_correct(table), score)
    return value if constraint.met(found[constraint.measure]) else value - 1.0


def contingency(y: np.ndarray, y_pred: np.ndarray, groups: np.ndarray, n_groups: int,
                n_classes: int, by_prediction: bool = False) -> np.ndarray:
    """The validation table a noisy score releases: examples by (group, class, correct), or
    with ``by_prediction`` by (group, class, predicted class). Either way one example is in
    exactly one cell: adding or removing one changes the table by 1 in one cell, an L2
    sensitivity of 1."""
    table = np.zeros((n_groups, n_classes, n_classes if by_prediction else 2), np.float64)
    last = y_pred if by_prediction else (y == y_pred).astype(np.int64)
    np.add.at(table, (groups, y, last), 1.0)
    return table


def _by_correct(table: np.ndarray) -> np.ndarray:
    """A (group, class, predicted) table as (group, class, correct)."""
    right = np.diagonal(table, axis1=1, axis2=2)
    return np.stack([table.sum(axis=2) - right, right], axis=2)


def _disparities(table: np.ndarray) -> dict[str, float]:
    """The disparities of :mod:`dpfair.fairness.rates` (the worst class of a multi-class
    target) from a (group, class, predicted) table: post-processing."""
    n_classes = table.shape[1]
    right = np.diagonal(table, axis1=1, axis2=2)  # (group, class): true positives
    counts = np.asarray([[right[:, c], table[:, :, c].sum(axis=1) - right[:, c],
                          table[:, c, :].sum(axis=1)] for c in positive_classes(n_classes)])
    found = rates_from_counts(table.sum(axis=(1, 2)), counts, n_classes)
    return {d: float(found[d]) for d in DISPARITIES}


def _accuracy_score(table: np.ndarray, score: str) -> float:
    """An accuracy score from a (group, class, correct) table."""
    n_groups, n_classes = table.shape[:2]

    def acc(cells: np.ndarray) -> float | None:
        right, total = cells[..., 1].sum(), cells.sum()
        return None if total <= 0 else float(right / total)

    if score == "accuracy":
        return acc(table) or 0.0
    if score == "macro_accuracy":
        vals = [a for a in (acc(table[:, c]) for c in range(n_classes)) if a is not None]
    elif score == "worst_group_accuracy":
        vals = [a for a in (acc(table[k]) for k in range(n_groups)) if a is not None]
        return float(min(vals)) if vals else 0.0
    else:
        raise ValueError(f"unknown score {score!r}")
    return float(np.mean(vals)) if vals else 0.0
