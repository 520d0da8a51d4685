"""DPSGD-F (Xu et al. 2021, Alg. 2): per-group clip bounds set from noisy counts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Self

from pydantic import PositiveFloat

from dpfair.lazy import lazy_module
from dpfair.methods.base import Method, State, group_counts
from dpfair.methods.registry import BuildContext, MethodSpec, register_method

if TYPE_CHECKING:
    from torch import Tensor

torch = lazy_module("torch")  # loads when the rule first runs, not when its config is checked


class DpsgdF(Method):
    """DPSGD-F (Xu Alg. 2): group ``k`` is clipped at ``C_k``, noise is scaled to ``max_k C_k``.

    Release (lines 5-11): ``m_k = #{|g_i| > C0}``, ``o_k = #{|g_i| <= C0}`` over group ``k``,
    the vector ``{m_k, o_k}`` plus ``N(0, sigma1^2 I)``, floored and clamped at 0 (as in the
    authors' code, Esipova Alg. 3). Then (line 12) ``C_k = C0 (1 + (m~_k / b~_k) / (m~ / B))``
    with ``b~_k = m~_k + o~_k``, ``m~ = sum_k m~_k`` and ``B`` the expected batch size;
    ``C_k = C0`` when ``b~_k`` or ``m~`` is 0. Clip (line 14): ``w_i = min(1, C_k / |g_i|)``;
    sensitivity (line 15) ``max_k C_k`` over all groups, present in the batch or not.

    Esipova's Alg. 3 scales the gradient noise by ``C0`` instead of ``max_k C_k``; that does
    not bound the sensitivity, so we follow Xu's line 16.
    """

    releases_before_clipping = True

    def __init__(self, C0: float, sigma1: float, *, n_groups: int, expected_batch_size: float,
                 name: str = "dpsgd_f") -> None:
        super().__init__(name, count_sigma=sigma1)
        self.C0, self.n_groups, self.expected_batch_size = C0, n_groups, expected_batch_size
        self.C_k = torch.full((n_groups,), C0, dtype=torch.float64)
        self.released = torch.zeros(2 * n_groups, dtype=torch.float64)

    def counts(self, norms: Tensor, groups: Tensor) -> Tensor:
        above = norms > self.C0
        return torch.cat(
            [
                group_counts(above, groups, self.n_groups, norms.dtype),
                group_counts(~above, groups, self.n_groups, norms.dtype),
            ]
        )

    def update(self, noisy_counts: Tensor) -> None:
        released = noisy_counts.floor().clamp(min=0).to(torch.float64)
        m, o = released[: self.n_groups], released[self.n_groups :]
        b, m_all = m + o, m.sum()
        ratio = (m / b) / (m_all / self.expected_batch_size)
        defined = (b > 0) & (m_all > 0)
        self.C_k = torch.where(defined, self.C0 * (1 + ratio), torch.full_like(m, self.C0)).cpu()
        self.released = released.cpu()

    def clip_range(self) -> tuple[float, float]:
        """``[C0, C0 (1 + B)]``: the ratio of line 12 is ``m~_k B / (b~_k m~)``, at least 0
        and, with ``m~_k <= b~_k`` and ``1 <= m~``, at most ``B``, whatever the counts."""
        return self.C0, self.C0 * (1 + self.expected_batch_size)

    def _weights(self, norms: Tensor, groups: Tensor) -> tuple[Tensor, float]:
        bounds = self.C_k.to(device=norms.device, dtype=norms.dtype)[groups]
        return (bounds / norms).clamp(max=1.0), float(self.C_k.max())

    def state(self) -> State:
        k = self.n_groups
        return {
            "C_k": self.C_k.tolist(),
            "m_released": self.released[:k].tolist(),
            "o_released": self.released[k:].tolist(),
        }


class XuGroupConfig(MethodSpec):
    """The configuration shared by Xu et al.'s two group rules (DPSGD-F, Alg. 2, and the naive
    reweighting, Alg. 3): clip bound ``C0`` and count noise ``sigma1``, ``None`` being
    ``10 sigma`` (Xu 6.1.3). A subclass sets ``name`` and ``method_class`` and registers."""

    C0: PositiveFloat = 1.0
    sigma1: PositiveFloat | None = None

    def build(self, ctx: BuildContext) -> Method:
        return self.method_class(self.C0, ctx.count_sigma(self.sigma1), n_groups=ctx.n_groups,
                                 expected_batch_size=ctx.expected_batch_size)

    @classmethod
    def example(cls) -> Self:
        return cls(C0=0.7)


@register_method
class DpsgdFConfig(XuGroupConfig):
    method_class = DpsgdF
    name: Literal["dpsgd_f"] = "dpsgd_f"
