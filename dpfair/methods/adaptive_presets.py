"""The named presets of adaptive clipping, each a config map to
:class:`~dpfair.methods.adaptive.AdaptiveConfig` (``.adaptive()``).

Defaults: Andrew et al. (2021) for AdaClip, Esipova App. B (DPSGD-Global-Adapt
``Z0 = 50, eta_Z = 0.1, tau = 1``), Zhao 4 and App. A.3 for bounded adaptive clipping.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat

from dpfair.methods.adaptive import AdaptiveConfig, AdaptiveFamily
from dpfair.methods.registry import register_method


@register_method
class AdaclipConfig(AdaptiveFamily):
    """Andrew et al. (2021) in Zhao's form: ``tau = 1``, ``C_LB = 0``, ``s = 1``."""

    name: Literal["adaclip"] = "adaclip"
    C0: PositiveFloat = 1.0
    eta_C: PositiveFloat = 0.2
    gamma: float = Field(0.5, ge=0.0, le=1.0)
    sigma_count: PositiveFloat | None = None

    def adaptive(self) -> AdaptiveConfig:
        return self.same_named(s=1.0, tau=1.0, C_LB=0.0)

    @classmethod
    def example(cls) -> AdaclipConfig:
        return cls(C0=0.7)


@register_method
class DpsgdGlobalAdaptConfig(AdaptiveFamily):
    """Esipova Alg. 2 (red): ``s = C0``, ``C_t = Z`` from ``Z0``, ``eta_C = 1``, ``gamma = eta_Z``.

    Her update ``Z <- Z exp(-eta_Z + b~)`` is ``Z exp(1 (b~ - eta_Z))``; ``sigma2`` is her count
    noise (``sigma_2``, about ``10 sigma``).
    """

    name: Literal["dpsgd_global_adapt"] = "dpsgd_global_adapt"
    C0: PositiveFloat = 1.0
    Z0: PositiveFloat = 50.0
    eta_Z: float = Field(0.1, ge=0.0, le=1.0, description="target fraction of clipped samples")
    tau: NonNegativeFloat = 1.0
    sigma2: PositiveFloat | None = None

    def adaptive(self) -> AdaptiveConfig:
        return AdaptiveConfig(s=self.C0, C0=self.Z0, eta_C=1.0, gamma=self.eta_Z, tau=self.tau,
                              C_LB=0.0, sigma_count=self.sigma2)

    @classmethod
    def example(cls) -> DpsgdGlobalAdaptConfig:
        return cls(C0=0.7, Z0=1.5, tau=0.8)


@register_method
class BoundedAdaptiveConfig(AdaptiveFamily):
    """Zhao's lower-bounded adaptive clipping; ``C_LB`` defaults to the top of her grid."""

    name: Literal["bounded_adaptive"] = "bounded_adaptive"
    C0: PositiveFloat = 1.0
    C_LB: PositiveFloat = 1e-2
    eta_C: PositiveFloat = 0.2
    gamma: float = Field(0.5, ge=0.0, le=1.0)
    tau: PositiveFloat = 2.5
    sigma_count: PositiveFloat | None = None

    def adaptive(self) -> AdaptiveConfig:
        return self.same_named(s=1.0)

    @classmethod
    def example(cls) -> BoundedAdaptiveConfig:
        return cls(C0=0.7, C_LB=0.5)
