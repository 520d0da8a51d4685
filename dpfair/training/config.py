"""The configuration of one training run (DESIGN.md sections 2 and 4)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from dpfair.models import ModelConfig
from dpfair.privacy.methods import MethodConfig


class TrainConfig(BaseModel):
    """One training run. Give exactly one of ``epochs``/``steps``; a private method needs
    exactly one of ``sigma`` (noise multiplier) and ``target_epsilon`` (σ is then the smallest
    reaching it at ``delta``). ``nonprivate`` ignores both and reports σ = 0, ε = ∞.

    Randomness (DESIGN.md section 5, "Secret randomness"): ``seed`` fixes the initialisation;
    Poisson batches, gradient noise and count noise come from OS entropy unless
    ``reproducible`` (then from ``seed``, and the run is labelled
    :data:`dpfair.training.REPLAYABLE_NOISE`).
    """

    model_config = ConfigDict(extra="forbid")

    method: MethodConfig
    model: ModelConfig
    epochs: PositiveInt | None = None
    steps: PositiveInt | None = None
    batch_size: PositiveInt = Field(256, description="expected batch size; q = batch_size / n")
    lr: PositiveFloat = 0.01
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(0.0, ge=0.0, lt=1.0, description="SGD momentum")
    weight_decay: float = Field(0.0, ge=0.0)
    sigma: float | None = Field(None, ge=0.0, description="noise multiplier")
    target_epsilon: PositiveFloat | None = None
    delta: float = Field(1e-6, gt=0.0, lt=1.0)
    seed: int = Field(
        0,
        ge=0,
        description="fixes model initialisation (a public choice); the batches and the "
        "noise are drawn from it only when reproducible",
    )
    reproducible: bool = Field(
        False,
        description="draw batches and noise from seed (research, tests): anyone who knows the "
        "seed can replay the noise, so ε does not protect the release; by default they come "
        "from OS entropy that is never stored",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    engine: Literal["auto", "fast", "materialized"] = "auto"
    eval_every: PositiveInt = Field(1, description="evaluate on the test split every N epochs")
    eval_batch_size: PositiveInt = 1024
    progress: bool = True
    nonprivate_stats: bool = Field(False, description="record the (non-private) train loss")

    @model_validator(mode="after")
    def _exactly_one(self) -> TrainConfig:
        if (self.epochs is None) == (self.steps is None):
            raise ValueError("give exactly one of epochs and steps")
        if self.optimizer == "adam" and self.momentum:
            raise ValueError("momentum is an SGD option; adam has its own betas")
        if self.method.is_private and (self.sigma is None) == (self.target_epsilon is None):
            raise ValueError(
                f"method {self.method.name!r} needs exactly one of sigma and target_epsilon"
            )
        return self
