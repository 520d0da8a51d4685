"""DPSGD-Global (Bu et al.; Esipova Alg. 2 without the red parts): one global scale C0 / Z.

Defaults: Esipova App. B (Adult: ``Z = 50``). DPSGD-Global-Adapt is an adaptive preset
(:mod:`dpfair.methods.adaptive_presets`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, PositiveFloat, model_validator

from dpfair.methods.base import Method, State
from dpfair.methods.keyword_spec import KeywordSpec
from dpfair.methods.registry import register_method

if TYPE_CHECKING:
    from torch import Tensor


def _check(C0: float, Z: float) -> None:
    if Z < C0:
        raise ValueError(f"dpsgd_global needs Z >= C0, got Z={Z}, C0={C0}")


class DpsgdGlobal(Method):
    """``w_i = C0 / Z`` if ``|g_i| <= Z`` else 0 (Esipova Alg. 2, gamma_i); ``S = C0``."""

    def __init__(self, C0: float, Z: float, *, name: str = "dpsgd_global") -> None:
        _check(C0, Z)
        super().__init__(name)
        self.C0, self.Z = C0, Z

    def _weights(self, norms: Tensor, groups: Tensor) -> tuple[Tensor, float]:
        return (norms <= self.Z).to(norms.dtype) * (self.C0 / self.Z), self.C0

    def state(self) -> State:
        return {"Z": self.Z}


@register_method
class DpsgdGlobalConfig(KeywordSpec):
    """Esipova's DPSGD-Global with ``Z >= C0`` (a kept sample's weight ``C0 / Z`` is at most 1)."""

    method_class = DpsgdGlobal
    name: Literal["dpsgd_global"] = "dpsgd_global"
    C0: PositiveFloat = Field(1.0, description="the sensitivity: a kept sample weighs C0 / Z")
    Z: PositiveFloat = Field(50.0, description="a sample whose gradient norm is above Z is dropped")

    @model_validator(mode="after")
    def _z_bounds_c0(self) -> DpsgdGlobalConfig:
        _check(self.C0, self.Z)
        return self

    @classmethod
    def example(cls) -> DpsgdGlobalConfig:
        return cls(C0=0.7, Z=1.5)
