"""Models of Esipova et al.'s released code (layer6ai-labs/fair-dp) that dpfair has no name for.

Used by ``benchmarks/configs/02b_esipova_dutch_released.yaml`` as an ``import`` model
(``target: "fairdp_models:sigmoid_logistic"``; ``benchmarks/`` is on ``sys.path`` when
``reproduce.py`` runs).
"""

from __future__ import annotations

from torch import nn


def sigmoid_logistic(input_shape: tuple[int, ...], n_classes: int) -> nn.Module:
    """fair-dp's ``LogisticRegression``: a ``Linear(d, n_classes)`` whose outputs go through a
    sigmoid, which its trainer then feeds to the cross-entropy as if they were logits.

    The "logits" lie in (0, 1), so the softmax probability of the true class is at most
    e / (1 + e) and every per-example loss is at least log(1 + 1/e) = 0.313: this is why the
    released code's (and the paper's) Dutch losses are higher than a softmax regression's.
    """
    return nn.Sequential(nn.Linear(input_shape[0], n_classes), nn.Sigmoid())
