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
"""

from __future__ import annotations

import math
from typing import Any

import dp_accounting
import numpy as np

from dpfair.privacy import accounting

SENSITIVITY = math.sqrt(3.0)  # one example: +-1 to n_k, c_k and s_k / L of one group


def release_event(noise_multiplier: float, releases: int) -> dp_accounting.DpEvent:
    """What ``releases`` noisy evaluations of the test split release (composed)."""
    if releases < 1:
        raise ValueError(f"releases must be >= 1, got {releases}")
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(noise_multiplier), releases
    )


def calibrate(target_epsilon: float, delta: float, releases: int, rows: int = 1) -> float:
    """Smallest noise multiplier whose ``releases`` evaluations reach ``target_epsilon`` for a
    unit of ``rows`` rows (group privacy, :func:`dpfair.privacy.accounting.with_group`)."""
    return accounting.noise_for_epsilon(
        target_epsilon, lambda z: accounting.with_group(release_event(z, releases), rows), delta
    )


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
) -> dict[str, Any]:
    """Per-group accuracy and loss, overall accuracy and loss and the worst group, from the
    noisy sums of the module docstring. ``rng`` must be secret (OS entropy) for the release to
    be covered by :func:`release_event`."""
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
    return {
        "group_accuracy": acc.tolist(),
        "group_loss": loss.tolist(),
        "accuracy": float(np.clip(c.sum() / total, 0.0, 1.0)),
        "loss": float(np.clip(s.sum() / total, 0.0, 1.0) * loss_clip),
        "worst_group": worst,
        "worst_group_accuracy": float(acc[worst]),
    }
