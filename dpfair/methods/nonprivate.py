"""The non-private baseline: plain SGD, no clipping, no noise (``privacy_guarantee = "none"``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from dpfair.lazy import lazy_module
from dpfair.methods.base import Method
from dpfair.methods.registry import BuildContext, MethodSpec, register_method

if TYPE_CHECKING:  # a configuration check needs neither (dp_accounting loads scipy)
    from dp_accounting import dp_event
    from torch import Tensor

torch = lazy_module("torch")  # loads when the rule first runs, not when its config is checked


class NonPrivate(Method):
    """Plain SGD: ``w_i = B / b`` with ``B`` the expected and ``b`` the realised batch size, so
    that dividing by ``B`` yields the plain mean gradient over the realised batch; sensitivity 0,
    no noise. ``PrivateStep`` computes that same mean gradient with one ordinary backward.
    """

    privacy_guarantee = "none"

    def __init__(self, expected_batch_size: float, name: str = "nonprivate") -> None:
        super().__init__(name)
        self.expected_batch_size = expected_batch_size

    def step_event(self, sigma: float) -> dp_event.DpEvent:
        """The gradients are released in the clear, whatever ``sigma``."""
        from dp_accounting import dp_event

        return dp_event.NonPrivateDpEvent()

    def _weights(self, norms: Tensor, groups: Tensor) -> tuple[Tensor, float]:
        return torch.full_like(norms, self.expected_batch_size / max(len(norms), 1)), 0.0


@register_method
class NonPrivateConfig(MethodSpec):
    method_class = NonPrivate
    name: Literal["nonprivate"] = "nonprivate"

    def build(self, ctx: BuildContext) -> NonPrivate:
        return NonPrivate(ctx.expected_batch_size)

    @classmethod
    def example(cls) -> NonPrivateConfig:
        return cls()
