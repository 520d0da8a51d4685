"""What a training run produced (:class:`TrainResult`) and the hooks that watch it."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from dp_accounting import dp_event
from torch import nn

from dpfair.methods import PrivacyGuarantee
from dpfair.models import build_model
from dpfair.training.config import TrainConfig
from dpfair.training.evaluation import Predictions
from dpfair.training.run_plan import MetricsRelease


@dataclass
class TrainResult:
    """Everything a run produced; ``model_state`` is on the CPU.

    Private: the model, ``clip_trajectory`` (clip bounds are computed from noisy releases) and
    test metrics/predictions (the test split is not the training data). With noisy test
    metrics (``test_release.noisy``) ``history`` and ``test_metrics`` hold only the noisy
    release (no per-class metric, no count) and ``test_predictions`` is None. ``nonprivate_stats``
    (training-batch loss, computed from the raw batch) is *not* private; it is only recorded
    when ``TrainConfig.nonprivate_stats`` is set. ``event`` is the planned run event
    (:class:`dpfair.training.run_plan.RunPlan`) and ``epsilon`` its ε at ``delta``; DPSGD-F's
    ``group_epsilons`` are each group's ε at ``delta`` read from that group's own per-step clip
    bounds (:mod:`dpfair.accounting.per_group`), each at most ``epsilon``: a
    data-dependent reading of this one run (the bounds come from noisy counts), not a
    guarantee fixed in advance; ``group_accountants`` name the accountant of each, and
    ``group_epsilon_bounds`` are the per-group bounds fixed before training from the clip
    range the method allows (DPSGD-F: the run's ε).

    No field determines the noise: by default the batches and noise come from OS entropy that
    is kept nowhere. ``reproducible`` (from the config) says they were drawn from
    ``config.seed`` instead; label such a result :data:`~dpfair.training.config.REPLAYABLE_NOISE`.
    """

    config: TrainConfig
    model_state: dict[str, torch.Tensor]
    input_shape: tuple[int, ...]
    n_classes: int
    n_groups: int
    history: list[dict[str, Any]]
    test_metrics: dict[str, Any]
    val_metrics: dict[str, Any] | None
    test_predictions: Predictions | None
    val_predictions: Predictions
    method: str
    privacy_guarantee: PrivacyGuarantee
    sigma: float
    count_sigma: float | None
    sample_rate: float
    n_train: int
    steps: int
    steps_per_epoch: int
    event: dp_event.DpEvent
    epsilon: float
    delta: float
    group_epsilons: list[float] | None
    clip_trajectory: list[dict[str, Any]]
    nonprivate_stats: list[dict[str, Any]]
    wall_time_s: float
    device: str
    reproducible: bool
    test_release: MetricsRelease
    #: the trained module (on the CPU) when ``train`` was given one instead of ``config.model``
    own_model: nn.Module | None = None
    group_accountants: list[str] | None = None
    group_epsilon_bounds: list[float] | None = None

    def load_model(self) -> nn.Module:
        """A fresh CPU model holding the trained parameters."""
        if self.own_model is not None:
            return copy.deepcopy(self.own_model)
        model = build_model(self.config.model, self.input_shape, self.n_classes)
        model.load_state_dict(self.model_state)
        return model


class Callback(Protocol):
    """Hooks called by :func:`dpfair.training.train` (e.g. MLflow logging)."""

    def on_epoch_end(self, epoch: int, metrics: dict[str, Any]) -> None:
        """After each evaluated epoch, with its history entry (epoch, step, test metrics)."""

    def on_train_end(self, result: TrainResult) -> None:
        """Once, with the finished result."""
