"""The audit's settings (:class:`AuditSettings`) and params.yaml's ``audit:`` section
(:class:`AuditSection`: the settings plus which configuration of ``experiment`` to train)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from dpfair.training.config import NoiseMultiplier, TargetEpsilon

CanaryKind = Literal["mislabel", "ood", "gradient"]
KindSetting = Literal["auto", "mislabel", "ood", "gradient"]


class AuditSettings(BaseModel):
    """How the canaries are made and scored and how confident the bound is
    (:func:`dpfair.audit.audit`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    config_key_noun: ClassVar[str] = "key"

    canaries: PositiveInt | None = Field(
        None,
        description="canaries per audited group, each included with probability 1/2; None: "
        "enough to catch a run leaking `leak` nats over its claimed ε with probability "
        "`power`, per group at beta and jointly at beta / (number of groups) (at most "
        "10,000 and the smallest audited group's size; 1,000 when the run claims no finite ε "
        "or no count up to 10,000 has that power)",
    )
    leak: PositiveFloat = Field(
        1.0, description="the leak over the claimed ε (nats) the audit is sized to catch")
    power: float = Field(
        0.8, gt=0.0, lt=1.0,
        description="the probability of catching that leak below which the audit says "
        "'cannot decide' and is not called an audit")
    kind: KindSetting = Field(
        "auto",
        description="auto: gradient canaries for a private method whose model has a parameter "
        "for each, else ood; mislabel: group members with a wrong label; ood: random inputs; "
        "gradient: a per-sample gradient on one parameter (white-box, the strongest)",
    )
    beta: float = Field(0.05, gt=0.0, lt=1.0, description="the bound holds w.p. 1 - beta")
    guesses: list[float] = Field(
        default_factory=lambda: [0.1, 0.25, 0.5],
        min_length=1,
        description="fractions of the canaries guessed (half on the highest scores, half on "
        "the lowest); the best is kept, at confidence 1 - beta / len(guesses)",
    )
    groups: list[str] | None = Field(None, description="group names to audit (None: all)")
    ood_scale: PositiveFloat = Field(3.0, description="std of the ood canaries' inputs")

    @field_validator("guesses")
    @classmethod
    def _fractions(cls, value: list[float]) -> list[float]:
        bad = [f for f in value if not 0 < f <= 1]
        if bad:
            raise ValueError(f"guess fractions must be in (0, 1], got {bad}")
        return value


class AuditSection(AuditSettings):
    """``audit:`` one method of ``experiment.methods`` trained on ``experiment.dataset`` with
    ``experiment.model`` and ``experiment.train``, the noise and length overridable here
    (``dpfair audit`` options override these in turn)."""

    method: str = Field("dpsgd", description="a label of experiment.methods")
    sigma: NoiseMultiplier | None = Field(None, gt=0.0, description="None: experiment.train's")
    target_epsilon: TargetEpsilon | None = Field(None, description="replaces sigma when given")
    epochs: PositiveInt | None = Field(None, description="None: experiment.train's")
    seed: int = Field(0, ge=0, description="initialisation seed (a public choice)")
    track: bool = Field(True, description="log the audit run to MLflow (tracking section)")

    @model_validator(mode="after")
    def _one_noise(self) -> AuditSection:
        if self.sigma is not None and self.target_epsilon is not None:
            raise ValueError("give at most one of sigma and target_epsilon")
        return self

    def train_overrides(self) -> dict[str, object]:
        """What this section changes in ``experiment.train``."""
        out: dict[str, object] = {}
        if self.target_epsilon is not None:
            out.update(sigma=None, target_epsilon=self.target_epsilon)
        elif self.sigma is not None:
            out.update(sigma=self.sigma, target_epsilon=None)
        if self.epochs is not None:
            out.update(epochs=self.epochs, steps=None)
        return out
