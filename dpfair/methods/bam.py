"""BAM, bias-aware minimisation (Knolle et al., Alg. 2 line 4; Eq. 14): DPSGD clipping of
per-sample gradients taken after a per-sample ascent step,
``g_i = grad l_i(theta + lam grad l_i(theta) / |grad l_i(theta)|)``: two ghost-clipping passes
with per-sample output shifts on models of Linear, Conv2d, Embedding, LayerNorm and GroupNorm
layers, else materialised (:mod:`dpfair.engine.ascent`).

Defaults: Knolle Table 2 (CIFAR-10: ``lam = 0.02``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import NonNegativeFloat

from dpfair.methods.dpsgd import Dpsgd
from dpfair.methods.keyword_spec import FormerSpec
from dpfair.methods.registry import register_method

if TYPE_CHECKING:
    from torch import nn

    from dpfair.engine.gradients import EngineKind, PerSampleGradients


class Bam(Dpsgd):
    """Bias-aware minimisation (Knolle Alg. 2): DPSGD clipping of per-sample ascended gradients."""

    def __init__(self, C: float, lam: float, *, name: str = "bam") -> None:
        super().__init__(C, name=name)
        self.lam = lam

    def per_sample_gradients(self, model: nn.Module, kind: EngineKind) -> PerSampleGradients:
        """The fast ascent (:class:`dpfair.engine.ascent.AscentGhost`) where every trainable
        layer has a shift rule (``ascent.ASCENT_LAYERS``), else the materialised one (``"fast"``
        raises instead)."""
        from dpfair.engine.ascent import AscentGhost, AscentMaterialized, ghost_ascent_obstacle
        from dpfair.engine.gradients import log_once, modifies_in_place

        if kind == "materialized":
            return AscentMaterialized(self.lam)
        reason = ghost_ascent_obstacle(model)
        if reason is None:
            return AscentGhost(self.lam, clone_outputs=modifies_in_place(model))
        if kind == "fast":
            raise ValueError(f"bam's fast path cannot serve this model: {reason}; use engine "
                             "'auto' (materialised ascended gradients)")
        log_once(f"bam: per-sample ascended gradients on the materialised path, because {reason}")
        return AscentMaterialized(self.lam)


@register_method
class BamConfig(FormerSpec):
    method_class = Bam
    name: Literal["bam"] = "bam"
    lam: NonNegativeFloat = 0.02
