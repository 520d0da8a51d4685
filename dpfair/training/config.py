"""The configuration of one training run."""

from __future__ import annotations

import math
import os
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dpfair.errors import ConfigError
from dpfair.methods import MethodConfig
from dpfair.models import ModelConfig
from dpfair.training.progress import ProgressMode

#: How every output of a ``reproducible`` run (or search) is labelled: its batches and noise
#: are drawn from the logged seed, so anyone can replay them and tell whether a record was in
#: the training data.
REPLAYABLE_NOISE = "noise replayable from the logged seed: ε does not protect this release"

#: The most epochs and optimiser steps one run may take (resource bounds: a typo such as
#: ``epochs: 1000000000000`` is refused, never planned or started).
MAX_EPOCHS = 100_000
MAX_STEPS = 100_000_000
#: The largest batch, physical batch and evaluation batch (examples).
MAX_BATCH = 10_000_000
#: The largest engine memory cap (MiB): 1 PiB, far above any device.
MAX_MIB = 1 << 30
#: The largest learning rate and weight decay: a step of lr x gradient stays far inside float32
#: (about 3.4e38), so a typo such as ``lr: 1e300`` is refused, never trained (and charged).
MAX_LR = 1e4
#: The smallest noise multiplier: sigma**2 stays a normal float for every accountant (1e-300
#: underflowed to 0 there) and the noise a float32 (ε at such a σ is beyond any meaning anyway).
MIN_SIGMA = 1e-6
#: The largest target ε: the accountants' range. Calibrating σ to a larger ε asked the PLD
#: accountant for hundreds of GiB (``target_epsilon: 1e9``); ε above it protects nothing.
MAX_TARGET_EPSILON = 1000.0


def _mebibytes(value: object) -> object:
    """A whole positive number of MiB; units in a string ("12GB") or a non-positive number are
    refused with the fix, never guessed."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_MIB
    if not ok:
        raise ValueError(
            f"max_engine_memory is a whole number of MiB between 1 and {MAX_MIB}, got {value!r}: "
            "write e.g. 12288 for 12 GiB, or null for the engine's default")
    return value


#: A memory size in MiB, strictly (``BeforeValidator``: travels with the field's type).
Mebibytes = Annotated[int, BeforeValidator(_mebibytes)]


def _number(value: object) -> object:
    """A number, never a boolean (pydantic reads ``true`` as 1: ``lr: true`` would train)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is a boolean where a number is expected; write the number")
    return value


def _at_most(limit: float, why: str) -> AfterValidator:
    """Refuse a value over ``limit``, saying ``why`` it is the limit and what to write."""

    def check(value: float) -> float:
        if value > limit:
            raise ValueError(f"{value:g} is over the maximum {limit:g} ({why}); write a value "
                             f"of at most {limit:g}")
        return value

    return AfterValidator(check)


#: The bounded numbers of a training run (the one validator of each, shared by params.yaml,
#: ``dpfair.fit``, the audit's options and every search-space value). ``Field`` comes first:
#: non-finite values are then named as such.
LearningRate = Annotated[float, Field(gt=0.0, allow_inf_nan=False), BeforeValidator(_number),
                         _at_most(MAX_LR, "a step of lr x gradient would overflow the weights")]
WeightDecay = Annotated[float, Field(ge=0.0, allow_inf_nan=False), BeforeValidator(_number),
                        _at_most(MAX_LR, "the decay step would overflow the weights")]
NoiseMultiplier = Annotated[float, Field(ge=0.0), BeforeValidator(_number)]
TargetEpsilon = Annotated[float, Field(gt=0.0, allow_inf_nan=False), BeforeValidator(_number),
                          _at_most(MAX_TARGET_EPSILON, "the accountants' range; an ε that "
                                   "large protects nothing")]


class MetricsReleaseConfig(BaseModel):
    """How a run releases its test metrics (:mod:`dpfair.fairness.noisy`). ``exact`` (the
    default): as computed, on held-out data that the training ε does not cover. ``noisy``:
    every evaluation releases only the Gaussian release of the per-group sums, its noise
    calibrated so that all the run's evaluations together reach ``epsilon`` at ``delta``
    (None: the run's ``delta``; below 1/n_test, checked once the data is known); losses are
    clipped to ``[0, loss_clip]``. Per-class metrics and counts are then not released.
    ``fairness``: the practitioners' measures of :mod:`dpfair.fairness.rates` too (noisy: from
    the noisy confusion counts of the last evaluation, :mod:`dpfair.fairness.noisy`)."""

    model_config = ConfigDict(extra="forbid")

    release: Literal["exact", "noisy"] = "exact"
    epsilon: PositiveFloat | None = Field(
        None, allow_inf_nan=False,
        description="ε of all the run's test evaluations together (release: noisy)")
    delta: float | None = Field(
        None, gt=0.0, lt=1.0, description="δ of that ε (None: the run's delta); < 1/n_test")
    loss_clip: PositiveFloat = Field(
        10.0, allow_inf_nan=False, description="per-example test losses are clipped to [0, this]")
    fairness: bool = Field(
        True, description="also release the per-group selection and error rates and their "
        "disparities (dpfair.fairness.rates; noisy: their confusion counts, once, at the last "
        "evaluation, within epsilon)")

    @model_validator(mode="after")
    def _epsilon_for_noisy(self) -> MetricsReleaseConfig:
        if self.release == "noisy" and self.epsilon is None:
            raise ValueError("release: noisy needs epsilon, the ε of all the run's test "
                             "evaluations together (e.g. epsilon: 1.0)")
        if self.release == "exact" and (self.epsilon is not None or self.delta is not None):
            raise ValueError("epsilon and delta apply to release: noisy only; set release: "
                             "noisy, or remove them (exact test metrics have no ε)")
        return self


def check_cpu_processes(nproc: int) -> None:
    """Refuse more training processes than the CPU has cores (each would get no core of its
    own); one place for the rule, read by the settings and by the launcher."""
    cores = os.cpu_count() or 1
    if nproc > cores:
        raise ConfigError(
            f"nproc {nproc} is more processes than the {cores} CPU cores of this machine: set "
            f"nproc to at most {cores} (or device: cuda, one process a GPU)")


class TrainConfig(BaseModel):
    """One training run. Give exactly one of ``epochs``/``steps``; a private method needs
    exactly one of ``sigma`` (noise multiplier) and ``target_epsilon`` (σ is then the smallest
    reaching it at ``delta``), with 0 < σ < ∞. ``nonprivate`` ignores both and reports σ = 0,
ε = ∞. Learning rate, weight decay and target ε are finite. ``delta`` < 1/n_train is checked
by :func:`~dpfair.training.make_plan` (which knows n_train) unless ``allow_large_delta``.

    Randomness: ``seed`` fixes the initialisation;
    Poisson batches, gradient noise and count noise come from OS entropy unless
    ``reproducible`` (then from ``seed``, and the run is labelled
    :data:`dpfair.training.REPLAYABLE_NOISE`), and so does the noise of noisy test metrics
    (:class:`MetricsReleaseConfig`).
    """

    model_config = ConfigDict(extra="forbid")

    method: MethodConfig
    model: ModelConfig | None = Field(
        None, description="required unless train(config, dataset, model=module) gives a module"
    )
    epochs: PositiveInt | None = Field(None, le=MAX_EPOCHS)
    steps: PositiveInt | None = Field(None, le=MAX_STEPS, description="at most MAX_STEPS, "
                                      "also as epochs x steps per epoch")
    batch_size: PositiveInt = Field(256, le=MAX_BATCH,
                                    description="expected batch size; q = batch_size / n")
    lr: LearningRate = 0.01
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(0.0, ge=0.0, lt=1.0, description="SGD momentum")
    weight_decay: WeightDecay = 0.0
    sigma: NoiseMultiplier | None = Field(
        None, description=f"noise multiplier; a private method needs {MIN_SIGMA:g} <= sigma < inf"
    )
    target_epsilon: TargetEpsilon | None = Field(
        None, description=f"at most {MAX_TARGET_EPSILON:g}, the accountants' range")
    delta: float = Field(1e-6, gt=0.0, lt=1.0)
    allow_large_delta: bool = Field(
        False,
        description="experts only: accept delta >= 1/n_train (such a delta allows releasing "
        "single examples outright); recorded with the run's parameters",
    )
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
    rows_per_unit: PositiveInt = Field(
        1, le=10_000,
        description="the most rows one privacy unit (a person) holds: every ε is charged for a "
        "change of that many rows (group privacy); set from the dataset's privacy_unit",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    nproc: PositiveInt = Field(
        1, le=4096,
        description="processes that train this one model together (data parallel on "
        "torch.distributed: gloo on the CPU, nccl on GPUs, one GPU each); at most the CPU "
        "cores or GPUs of the machine. The batches, the noise and ε are those of one process",
    )
    engine: Literal["auto", "fast", "materialized"] = "auto"
    autocast: Literal["off", "bf16"] = Field(
        "off",
        description="bf16 autocast for forward and backward (meant for GPUs); per-sample norms, "
        "weights, noise and the summed update stay in the parameters' dtype",
    )
    max_physical_batch: PositiveInt | None = Field(
        None, le=MAX_BATCH,
        description="form a larger Poisson batch's per-sample gradients in chunks of at most "
        "this many samples (same update, noise once per step; costs a second pass)",
    )
    max_engine_memory: Mebibytes | None = Field(
        None, description="MiB (a whole number, e.g. 2048) a private step may allocate: half "
        "for the engine's per-sample intermediates, the rest for the step's parameter-sized "
        "tensors and a physical batch's activations (more, smaller chunks under a lower cap, "
        "same update; below one sample's step: refused with the floor). null: no cap on the "
        "step, the engine's intermediates 512 on the CPU, a quarter of the free GPU memory",
    )
    eval_every: PositiveInt = Field(1, le=MAX_EPOCHS,
                                    description="evaluate on the test split every N epochs")
    eval_batch_size: PositiveInt = Field(1024, le=MAX_BATCH)
    progress: ProgressMode = Field(
        "auto", description="a progress bar: auto (in an interactive terminal without CI), "
        "true or false")
    nonprivate_stats: bool = Field(False, description="record the (non-private) train loss")
    test_metrics: MetricsReleaseConfig = Field(
        default_factory=MetricsReleaseConfig,
        description="exact (default; held-out data that ε does not cover) or noisy test metrics")

    @property
    def test_delta(self) -> float:
        """δ of noisy test metrics: ``test_metrics.delta``, else the run's ``delta``."""
        return self.test_metrics.delta if self.test_metrics.delta is not None else self.delta

    @field_validator("sigma")
    @classmethod
    def _noise_multiplier(cls, sigma: float | None, info: ValidationInfo) -> float | None:
        method = info.data.get("method")
        if sigma is not None and method is not None and method.is_private:
            if not MIN_SIGMA <= sigma < math.inf:
                raise ValueError(
                    f"{sigma} is not a noise multiplier for the private method {method.name!r} "
                    f"(0 adds no noise, below {MIN_SIGMA:g} its square underflows the "
                    f"accountants, inf destroys the model): set {MIN_SIGMA:g} <= sigma < inf, "
                    "or give target_epsilon instead"
                )
        return sigma

    @model_validator(mode="after")
    def _exactly_one(self) -> TrainConfig:
        if (self.epochs is None) == (self.steps is None):
            raise ValueError("give exactly one of epochs and steps")
        if self.optimizer == "adam" and self.momentum:
            raise ValueError("momentum is an SGD option; adam has its own betas")
        if self.device != "cuda":
            check_cpu_processes(self.nproc)
        if self.nproc > 1 and self.method.method_class.batch_terms:
            raise ValueError(
                f"method {self.method.name!r} forms its per-sample gradients from terms of the "
                "whole batch, so its batch cannot be split over processes: set nproc to 1")
        if self.method.is_private and (self.sigma is None) == (self.target_epsilon is None):
            raise ValueError(
                f"method {self.method.name!r} needs exactly one of sigma and target_epsilon"
            )
        return self
