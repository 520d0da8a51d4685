"""Budget-first planning: the noise that makes a whole release meet a total ε.

A release is a composition of parts (searches, final runs, noisy statistics), each a DpEvent
whose privacy comes from Gaussian noise. The documented split is proportional: every noise
multiplier of the calibrated parts (gradient σ, count σ, score σ) is multiplied by one factor
``s``, the smallest for which the composition, with the parts that keep their noise as
configured, has ε <= the budget at δ by the tightest valid accountant
(:func:`dpfair.accounting.accountant.noise_for_epsilon` on ``s``). Scaling every noise by one
factor keeps the proportions the user chose (Esipova's σ_count = 10 σ stays 10 σ), so no part
gains at another's expense; a part that must keep its noise is listed as fixed.
"""

from __future__ import annotations

from collections.abc import Sequence

from dp_accounting import dp_event

from dpfair import accounting
from dpfair.errors import PrivacyError

__all__ = ["noise_scale_for_budget", "scale_noise"]


def scale_noise(event: dp_event.DpEvent, factor: float) -> dp_event.DpEvent:
    """``event`` with every Gaussian's noise multiplier multiplied by ``factor`` (> 0)."""
    if not factor > 0:
        raise PrivacyError(f"the noise factor must be > 0, got {factor}")
    if isinstance(event, dp_event.GaussianDpEvent):
        return dp_event.GaussianDpEvent(event.noise_multiplier * factor)
    return accounting.map_subevents(event, lambda inner: scale_noise(inner, factor))


def noise_scale_for_budget(
    target_epsilon: float,
    scaled: Sequence[dp_event.DpEvent],
    fixed: Sequence[dp_event.DpEvent],
    delta: float,
) -> float:
    """Smallest factor ``s`` (to 2e-5 relative) such that ``scaled`` with every noise times
    ``s``, composed with ``fixed`` as is, has ε <= ``target_epsilon`` at ``delta``.

    A :class:`PrivacyError` if ``fixed`` alone already exceeds the target (no noise on the
    other parts can bring the total under it) or nothing is calibrated.
    """
    if not scaled:
        raise PrivacyError("budget-first planning needs at least one part whose noise scales")
    floor = accounting.epsilon(dp_event.ComposedDpEvent(list(fixed)), delta) if fixed else 0.0
    if not floor < target_epsilon:
        raise PrivacyError(
            f"the parts that keep their noise already spend ε {floor:.4g} >= the budget "
            f"{target_epsilon:g} at δ = {delta:g}: let them scale too (budget.keep_noise) or "
            "raise budget.epsilon")

    def total(factor: float) -> dp_event.DpEvent:
        return dp_event.ComposedDpEvent([*(scale_noise(e, factor) for e in scaled), *fixed])

    return accounting.noise_for_epsilon(target_epsilon, total, delta)
