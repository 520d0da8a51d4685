"""Adaptive clipping, unified (Zhao Alg. 2); its presets are in ``adaptive_presets``.

Defaults: Zhao 4 and App. A.3 (``gamma = 0.5, tau = 2.5, eta_C = 0.2``, initial bound 1,
``sigma_count = 10 sigma``).
"""

from __future__ import annotations

import math
import sys
from abc import abstractmethod
from typing import TYPE_CHECKING, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat

from dpfair.lazy import lazy_module
from dpfair.methods.base import Method, State
from dpfair.methods.registry import BuildContext, MethodSpec, register_method

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_module("torch")  # loads when the rule first runs, not when its config is checked

#: The smallest clip bound, ``2^-63 = sqrt(finfo(float32).tiny)`` (about ``1.1e-19``). Below
#: about ``3e-39`` the weight ``1 / C_t`` overflows float32; below ``C_MIN`` the engine's float32
#: norms no longer resolve ``|g_i|`` against ``C_t``: a sample with ``|g_i| >= C_MIN`` has a
#: squared norm of at least float32's smallest normal, whose underflow error (at most ``2^-150``
#: per entry) is then within its ordinary rounding error, so ``w_i |g_i| <= s`` holds as
#: computed, whereas a squared norm that underflows to 0 would get the weight ``s / C_t``
#: whatever ``|g_i|``. Without the floor the bound (a Python float) would also stop moving once
#: subnormal (``C_t exp(x)`` rounds back to ``C_t``) and stay at 0 once it underflows.
C_MIN = 2.0**-63
_LOG_MAX = math.log(sys.float_info.max)


class Adaptive(Method):
    """Clip at ``C_t``, scaled by ``s``: ``w_i = s min(1/C_t, 1/|g_i|)``, sensitivity ``s``.

    After clipping (Zhao Alg. 2, last three lines): ``b_t = #{|g_i| > tau C_t}``,
    ``b~ = (b_t + N(0, sigma_count^2)) / B`` with ``B`` the expected batch size, and
    ``C_{t+1} = max(C_LB, C_t exp(eta_C (b~ - gamma)))`` (Alg. 2's update line), here
    ``max(C_LB, C_MIN, ...)``: an unbounded rule (``C_LB = 0``) whose bound collapses, through
    many steps with ``b~ < gamma`` or one large count noise, stops at :data:`C_MIN` instead of
    underflowing; ``C_0`` is floored there too, and the growth is capped at the largest float
    (a huge count noise cannot overflow it). The floor is post-processing of released counts:
    it changes no privacy guarantee.

    ``s = 1`` is Zhao's normalised form; ``s = C0`` is Esipova's DPSGD-Global-Adapt, where
    ``C_t`` plays ``Z``: ``w_i = C0/Z`` below ``Z`` and ``C0/|g_i|`` above (her Alg. 2), and her
    update ``Z <- Z exp(-eta_Z + b~)`` is ours with ``eta_C = 1``, ``gamma = eta_Z``.
    """

    def __init__(self, *, s: float, C0: float, eta_C: float, gamma: float, tau: float,
                 C_LB: float, sigma_count: float, expected_batch_size: float,
                 name: str = "adaptive") -> None:
        super().__init__(name, count_sigma=sigma_count)
        self.s, self.eta_C, self.gamma, self.tau, self.C_LB = s, eta_C, gamma, tau, C_LB
        self.C = max(C0, C_MIN)
        self.expected_batch_size = expected_batch_size
        self.b_released = math.nan

    def _weights(self, norms: Tensor, groups: Tensor) -> tuple[Tensor, float]:
        return self.s * torch.minimum(1.0 / norms, torch.full_like(norms, 1.0 / self.C)), self.s

    def counts(self, norms: Tensor, groups: Tensor) -> Tensor:
        return (norms > self.tau * self.C).sum().to(norms.dtype).reshape(1)

    def update(self, noisy_counts: Tensor) -> None:
        self.b_released = float(noisy_counts) / self.expected_batch_size
        step = min(self.eta_C * (self.b_released - self.gamma), _LOG_MAX)
        self.C = max(self.C_LB, C_MIN, min(self.C * math.exp(step), sys.float_info.max))

    def state(self) -> State:
        return {"C": self.C, "b_released": self.b_released}


class AdaptiveFamily(MethodSpec):
    """A config that is a setting of :class:`Adaptive`: it builds :meth:`adaptive`'s rule."""

    method_class = Adaptive

    @abstractmethod
    def adaptive(self) -> AdaptiveConfig:
        """The same method as an :class:`AdaptiveConfig`."""

    def same_named(self, **settings: float) -> AdaptiveConfig:
        """The :class:`AdaptiveConfig` with this config's fields of the same name (a preset's
        ``C0``, ``eta_C``, ...), and ``settings`` for the rest."""
        return AdaptiveConfig(**{**self.model_dump(exclude={"name"}), **settings})

    def build(self, ctx: BuildContext) -> Adaptive:
        a = self.adaptive()
        return Adaptive(**a.model_dump(exclude={"name", "sigma_count"}),
                        sigma_count=ctx.count_sigma(a.sigma_count),
                        expected_batch_size=ctx.expected_batch_size, name=self.name)


@register_method
class AdaptiveConfig(AdaptiveFamily):
    """Zhao Alg. 2; ``C0`` is the initial clip bound, ``C_LB = 0`` the unbounded rule."""

    name: Literal["adaptive"] = "adaptive"
    s: PositiveFloat = 1.0
    C0: PositiveFloat = 1.0
    eta_C: PositiveFloat = 0.2
    gamma: float = Field(0.5, ge=0.0, le=1.0)
    tau: PositiveFloat = 2.5
    C_LB: NonNegativeFloat = 0.0
    sigma_count: PositiveFloat | None = None

    def adaptive(self) -> AdaptiveConfig:
        return self

    @classmethod
    def example(cls) -> AdaptiveConfig:
        return cls(C0=0.7, tau=1.2)
