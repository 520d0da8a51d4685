"""Evaluation: per-example predictions, per-group and per-class metrics, MLflow-shaped keys."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dpfair.data.dataset import Split
from dpfair.fairness import group_metrics
from dpfair.metric_keys import metric_segments


@dataclass(frozen=True)
class Predictions:
    """Per-example outputs on one split, as numpy arrays of equal length (``prob``: the class
    probabilities, ``(n, n_classes)``, when :func:`predict` made them)."""

    y_true: np.ndarray
    y_pred: np.ndarray
    groups: np.ndarray
    loss: np.ndarray
    prob: np.ndarray | None = None


@torch.no_grad()
def predict(model: nn.Module, split: Split, batch_size: int = 1024) -> Predictions:
    """Predicted class, class probabilities and cross-entropy loss of every example of
    ``split``."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    preds, losses, probs = [], [], []
    for start in range(0, len(split), batch_size):
        x = split.x[start : start + batch_size].to(device)
        y = split.y[start : start + batch_size].to(device)
        logits = model(x)
        preds.append(logits.argmax(dim=1).cpu())
        probs.append(torch.softmax(logits, dim=1).double().cpu())
        losses.append(F.cross_entropy(logits, y, reduction="none").cpu())
    model.train(was_training)
    empty_long, empty_float = torch.empty(0, dtype=torch.long), torch.empty(0)
    return Predictions(
        y_true=split.y.cpu().numpy(),
        y_pred=torch.cat(preds).numpy() if preds else empty_long.numpy(),
        groups=split.g.cpu().numpy(),
        loss=torch.cat(losses).double().numpy() if losses else empty_float.double().numpy(),
        prob=torch.cat(probs).numpy() if probs else None,
    )


def metrics_from_predictions(pred: Predictions, n_classes: int, n_groups: int) -> dict[str, Any]:
    """Accuracy and mean cross-entropy overall, per group and per class, macro accuracy and
    worst-group / worst-class accuracy (:func:`dpfair.fairness.group_metrics`), as a plain
    dict: per-group and per-class values are lists indexed by id (NaN for an absent id).
    """
    found = group_metrics(
        pred.y_true, pred.y_pred, pred.groups, n_groups, losses=pred.loss, n_classes=n_classes
    )
    return {
        k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in asdict(found).items()
    }


def evaluate(
    model: nn.Module, split: Split, n_classes: int, n_groups: int, batch_size: int = 1024
) -> dict[str, Any]:
    """Metrics of ``model`` on ``split`` (see :func:`metrics_from_predictions`)."""
    return metrics_from_predictions(predict(model, split, batch_size), n_classes, n_groups)


def flat_metrics(
    metrics: dict[str, Any],
    prefix: str = "",
    group_names: Sequence[str] | None = None,
    class_names: Sequence[str] | None = None,
) -> dict[str, float]:
    """``{"accuracy": .., "group_accuracy": [a, b]}`` -> ``{"accuracy": .., "group_accuracy/0":
    a, ...}`` with ``prefix`` prepended: the shape MLflow metrics want. Per-group (per-class)
    lists are keyed by ``group_names`` (``class_names``) when given, made safe keys by
    :func:`metric_segments`, else by id."""
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, list):
            names = group_names if key.startswith("group_") else (
                class_names if key.startswith("class_") else None)
            keys = (metric_segments(names) if names is not None
                    else [str(i) for i in range(len(value))])
            flat.update({f"{prefix}{key}/{k}": float(v) for k, v in zip(keys, value, strict=True)})
        else:
            flat[f"{prefix}{key}"] = float(value)
    return flat
