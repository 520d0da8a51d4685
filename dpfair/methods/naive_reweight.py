"""Xu et al.'s naive reweighting baseline (Alg. 3): groups reweighted by noisy sizes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from dpfair.lazy import lazy_module
from dpfair.methods.base import Method, State, group_counts
from dpfair.methods.dpsgd_f import XuGroupConfig
from dpfair.methods.registry import register_method

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_module("torch")  # loads when the rule first runs, not when its config is checked


class NaiveReweight(Method):
    """Xu's naive baseline (Alg. 3): ``w_i = theta_k min(1, C0 / |g_i|)``, ``S = C0 max_k theta_k``.

    Release (line 5): ``b~_k = b_k + N(0, sigma1^2)``; line 7: ``theta_k = (B / K) / b~_k``.
    The paper leaves ``b~_k <= 0`` open; we floor and clamp ``b~_k >= 1`` (a count, and
    ``theta_k`` must stay positive and finite for the sensitivity to hold).
    """

    releases_before_clipping = True

    def __init__(self, C0: float, sigma1: float, *, n_groups: int, expected_batch_size: float,
                 name: str = "naive_reweight") -> None:
        super().__init__(name, count_sigma=sigma1)
        self.C0, self.n_groups, self.expected_batch_size = C0, n_groups, expected_batch_size
        self.theta = torch.ones(n_groups, dtype=torch.float64)
        self.released = torch.zeros(n_groups, dtype=torch.float64)

    def counts(self, norms: Tensor, groups: Tensor) -> Tensor:
        everyone = torch.ones_like(groups, dtype=torch.bool)
        return group_counts(everyone, groups, self.n_groups, norms.dtype)

    def update(self, noisy_counts: Tensor) -> None:
        self.released = noisy_counts.floor().clamp(min=1).to(torch.float64).cpu()
        self.theta = (self.expected_batch_size / self.n_groups) / self.released

    def _weights(self, norms: Tensor, groups: Tensor) -> tuple[Tensor, float]:
        theta = self.theta.to(device=norms.device, dtype=norms.dtype)[groups]
        return theta * (self.C0 / norms).clamp(max=1.0), self.C0 * float(self.theta.max())

    def state(self) -> State:
        return {"theta_k": self.theta.tolist(), "b_released": self.released.tolist()}


@register_method
class NaiveReweightConfig(XuGroupConfig):
    method_class = NaiveReweight
    name: Literal["naive_reweight"] = "naive_reweight"
