"""Noisy release of test metrics: the Gaussian mechanism on per-group sums of the test split.

A practitioner's test split is private data too. Released exactly (the default), its metrics
are outside the ε that covers training. Released noisily, each evaluation releases, for every
group k, the vector ``(n_k, c_k, s_k / L)``: the number of test examples, of correct
predictions and the sum of their losses clipped to ``[0, L]``. Adding or removing one test
example changes one group's vector by at most 1 in each coordinate, an L2 sensitivity of
``sqrt(3)``; each coordinate gets Gaussian noise of standard deviation ``z * sqrt(3)`` (one
Gaussian mechanism with noise multiplier ``z``, dp_accounting's ``GaussianDpEvent(z)``).
Accuracies, losses and their summaries (overall, worst group) are computed from the noisy
sums: post-processing, no further cost. Per-class metrics are not released (they would need
their own sums); ``R`` evaluations compose as ``R`` Gaussian mechanisms, see
:func:`release_event`. The test split is disjoint from the training split, so this ε is
that of the test rows; a person in both splits pays both.

**Fairness counts.** With ``fairness`` the last evaluation also releases, for every group and
positive class, the true positives, false positives and positives of
:func:`dpfair.fairness.rates.confusion_counts` and the sum of the class's predicted
probabilities; one example changes at most two of the counts by 1 and the sums by its
probabilities (squares summing to at most 1): an L2 sensitivity of ``sqrt(3)``. They get the
same noise per coordinate, standard deviation ``z * sqrt(3)``: a second Gaussian mechanism
with noise multiplier ``z``, composed once with the ``R`` evaluations (:func:`release_event`).
Selection and error rates, calibration errors and the disparities follow from the noisy counts
and group sizes (:func:`dpfair.fairness.rates.rates_from_counts`: post-processing).
"""

from __future__ import annotations

import math
from typing import Any

import dp_accounting
import numpy as np

from dpfair import accounting
from dpfair.fairness import rates

SENSITIVITY = math.sqrt(3.0)  # one example: +-1 to n_k, c_k and s_k / L of one group
#: one example: +-1 to its class's positives and to one true- or false-positive count, and its
#: class probabilities (squares summing to <= 1) to the probability sums
COUNTS_SENSITIVITY = math.sqrt(3.0)


def release_event(
    noise_multiplier: float, releases: int, fairness: bool = False
) -> dp_accounting.DpEvent:
    """What ``releases`` noisy evaluations of the test split release (composed), with the
    fairness counts of the last one when ``fairness`` (module docstring)."""
    if releases < 1:
        raise ValueError(f"releases must be >= 1, got {releases}")
    sums = dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(noise_multiplier), releases)
    if not fairness:
        return sums
    counts = dp_accounting.GaussianDpEvent(noise_multiplier * SENSITIVITY / COUNTS_SENSITIVITY)
    return dp_accounting.ComposedDpEvent([sums, counts])


def calibrate(
    target_epsilon: float, delta: float, releases: int, rows: int = 1, fairness: bool = False
) -> float:
    """Smallest noise multiplier whose ``releases`` evaluations (and the fairness counts, when
    ``fairness``) reach ``target_epsilon`` for a unit of ``rows`` rows (group privacy,
    :func:`dpfair.accounting.accountant.with_group`)."""
    return accounting.noise_for_epsilon(
        target_epsilon,
        lambda z: accounting.with_group(release_event(z, releases, fairness), rows), delta)


def noisy_group_metrics(
    y_true: np.ndarray,
    y_pred: np.ndarray,
    groups: np.ndarray,
    losses: np.ndarray,
    n_groups: int,
    *,
    noise_multiplier: float,
    loss_clip: float,
    rng: np.random.Generator,
    fairness_classes: int | None = None,
    prob: np.ndarray | None = None,
) -> dict[str, Any]:
    """Per-group accuracy and loss, overall accuracy and loss and the worst group, from the
    noisy sums of the module docstring; with ``fairness_classes`` (the number of classes)
    also the measures of :mod:`dpfair.fairness.rates` from the noisy fairness counts (and
    the calibration error from the noisy probability sums, with ``prob``). ``rng``
    must be secret (OS entropy) for the release to be covered by :func:`release_event`."""
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier}")
    if not (loss_clip > 0 and math.isfinite(loss_clip)):
        raise ValueError(f"loss_clip must be finite and > 0, got {loss_clip}")
    g = np.asarray(groups, dtype=np.int64)
    correct = (np.asarray(y_pred) == np.asarray(y_true)).astype(np.float64)
    clipped = np.clip(np.nan_to_num(np.asarray(losses, dtype=np.float64), nan=loss_clip),
                      0.0, loss_clip) / loss_clip
    sums = np.stack([np.bincount(g, weights=w, minlength=n_groups)
                     for w in (np.ones_like(correct), correct, clipped)])
    noisy = sums + rng.normal(0.0, noise_multiplier * SENSITIVITY, size=sums.shape)
    n, c, s = noisy[0], noisy[1], noisy[2]
    size = np.maximum(n, 1.0)
    acc = np.clip(c / size, 0.0, 1.0)
    loss = np.clip(s / size, 0.0, 1.0) * loss_clip
    total = max(float(n.sum()), 1.0)
    worst = int(np.argmin(acc))
    found = {} if fairness_classes is None else _noisy_rates(
        y_true, y_pred, g, n, n_groups, fairness_classes, noise_multiplier, rng, prob)
    return {
        "group_accuracy": acc.tolist(),
        "group_loss": loss.tolist(),
        "accuracy": float(np.clip(c.sum() / total, 0.0, 1.0)),
        "loss": float(np.clip(s.sum() / total, 0.0, 1.0) * loss_clip),
        "worst_group": worst,
        "worst_group_accuracy": float(acc[worst]),
        **found,
    }


def _noisy_rates(
    y_true: np.ndarray, y_pred: np.ndarray, groups: np.ndarray, noisy_n: np.ndarray,
    n_groups: int, n_classes: int, noise_multiplier: float, rng: np.random.Generator,
    prob: np.ndarray | None,
) -> dict[str, Any]:
    """The rates of :mod:`dpfair.fairness.rates` from the fairness counts, each with Gaussian
    noise of standard deviation ``noise_multiplier * SENSITIVITY`` (module docstring)."""
    counts = rates.confusion_counts(y_true, y_pred, groups, n_groups, n_classes, prob)
    noisy = counts + rng.normal(0.0, noise_multiplier * SENSITIVITY, size=counts.shape)
    return rates.rates_from_counts(noisy_n, noisy, n_classes)
