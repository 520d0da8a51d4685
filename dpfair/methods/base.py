"""The one interface every training method implements.

A method is a *clipping rule*: at its current released state it turns per-sample gradient
norms (and group ids) into per-sample weights ``w_i`` and a sensitivity ``S`` such that removing
one sample changes ``sum_i w_i g_i`` by at most ``S``. Some rules also make a noisy side release
per step (counts with L2 sensitivity 1, noise std ``count_sigma``) that updates their state,
either before clipping (Xu's DPSGD-F: counts -> C_k -> clip) or after it (adaptive clipping:
clip at C_t, then the count sets C_{t+1}). Methods that change how ``g_i`` itself is formed
(BAM, DP-SAT, FairLens) override the single hook :meth:`Method.per_sample_gradients`.

What one step releases is described as data by :meth:`Method.step_event` (a dp_accounting
``DpEvent``); :func:`dpfair.accounting.accountant.run_event` turns it into the run's event.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from dpfair.engine import State
from dpfair.engine.collective import ALONE, Collective
from dpfair.lazy import lazy_module

if TYPE_CHECKING:  # a configuration check needs none of them (dp_accounting loads scipy)
    from dp_accounting import dp_event
    from torch import Tensor, nn

    from dpfair.engine.gradients import EngineKind, PerSampleGradients

#: torch loads when a rule first runs: a method's config is checked without it.
torch = lazy_module("torch")

PrivacyGuarantee = Literal["proven", "heuristic", "none"]


@dataclass(frozen=True)
class StepRule:
    """Per-sample weights ``(B,)`` and the L2 sensitivity of ``sum_i w_i g_i``."""

    weights: Tensor
    sensitivity: float


def _all_finite(norms: Tensor) -> bool:
    """Whether every norm is finite, by one reduction: norms are >= 0 or NaN, so their sum is
    finite only if each is (a sum that overflows on finite norms takes the masking path, which
    is exact too)."""
    return math.isfinite(norms.sum())


def group_counts(mask: Tensor, groups: Tensor, n_groups: int, dtype: torch.dtype) -> Tensor:
    """``#{i in group k : mask_i}`` for every group ``k``: one sample moves one entry by 1."""
    return torch.bincount(groups[mask], minlength=n_groups)[:n_groups].to(dtype)


class Method(ABC):
    """A clipping rule with optional noisy count releases; see the module docstring.

    Subclasses implement :meth:`_weights` and, if they release counts, :meth:`counts` and
    :meth:`update`. The base class draws the count noise and zeroes non-finite gradients, once.
    """

    #: "proven": sum_i w_i g_i has sensitivity S; "heuristic": it has not (FairLens);
    #: "none": no noise at all (non-private baseline).
    privacy_guarantee: ClassVar[PrivacyGuarantee] = "proven"
    #: True when the step's counts are released before clipping and set this step's bounds.
    releases_before_clipping: ClassVar[bool] = False
    #: True when ``g_i`` holds terms of the whole batch (FairLens): the batch cannot be split
    #: over processes.
    batch_terms: ClassVar[bool] = False

    def __init__(self, name: str, *, count_sigma: float | None = None) -> None:
        self.name = name
        #: noise std of the side release (counts), ``None`` for a method without one.
        self.count_sigma = count_sigma

    def clip_range(self) -> tuple[float, float] | None:
        """The range every per-group clip bound stays in whatever the data (None: no
        per-group bounds), from which a per-group ε bound is fixed before training
        (:func:`dpfair.accounting.per_group.fixed_group_epsilons`)."""
        return None

    @property
    def is_private(self) -> bool:
        """False only for the non-private baseline (``privacy_guarantee == "none"``)."""
        return self.privacy_guarantee != "none"

    def step_event(self, sigma: float) -> dp_event.DpEvent:
        """What one step releases, on one Poisson-sampled batch.

        The noisy sum ``sum_i w_i g_i + N(0, sigma^2 S^2 I)`` is ``GaussianDpEvent(sigma)``
        (unit sensitivity after dividing by ``S``); a count release adds
        ``GaussianDpEvent(count_sigma)`` (L2 sensitivity 1), composed with it. A zero noise
        (``sigma = 0``) releases in the clear: ``NonPrivateDpEvent``.
        """
        from dp_accounting import dp_event

        if not sigma >= 0:
            raise ValueError(f"sigma must be >= 0, got {sigma}")
        noises = [float(sigma)] + ([] if self.count_sigma is None else [float(self.count_sigma)])
        if min(noises) == 0:
            return dp_event.NonPrivateDpEvent()
        if len(noises) == 1:
            return dp_event.GaussianDpEvent(noises[0])
        return dp_event.ComposedDpEvent([dp_event.GaussianDpEvent(s) for s in noises])

    # -- the clipping rule -----------------------------------------------------------------

    @abstractmethod
    def _weights(self, norms: Tensor, groups: Tensor) -> tuple[Tensor, float]:
        """Weights and sensitivity at the current state; ``norms`` may contain ``inf``."""

    def rule(self, norms: Tensor, groups: Tensor) -> StepRule:
        """Weights and sensitivity at the current released state, without any release.

        A sample whose gradient norm is not finite gets weight 0, so the update stays finite.
        """
        return self._rule(norms, groups, _all_finite(norms))

    def _rule(self, norms: Tensor, groups: Tensor, finite: bool) -> StepRule:
        """:meth:`rule`, told whether every norm is finite (then no sample needs weight 0)."""
        weights, sensitivity = self._weights(norms, groups)
        if not finite:
            weights = torch.where(torch.isfinite(norms), weights, 0.0)
        return StepRule(weights, float(sensitivity))

    # -- side releases ---------------------------------------------------------------------

    def counts(self, norms: Tensor, groups: Tensor) -> Tensor | None:
        """The exact counts this method releases (L2 sensitivity 1), or ``None``."""
        return None

    def update(self, noisy_counts: Tensor) -> None:  # noqa: B027 - optional hook
        """Updates the state from the released ``counts + N(0, count_sigma^2 I)``."""

    def release(self, norms: Tensor, groups: Tensor, generator: torch.Generator,
                collective: Collective = ALONE) -> None:
        """This step's side release: the counts (over the whole batch, summed over the
        ``collective``'s processes) plus their own Gaussian noise, drawn once."""
        counts = self.counts(norms, groups)
        if counts is None:
            return
        assert self.count_sigma is not None, "a method that releases counts sets count_sigma"
        if collective.draws_noise:
            noise = torch.randn(
                counts.shape, generator=generator, device=counts.device, dtype=counts.dtype
            )
            counts = counts + self.count_sigma * noise
        collective.sum_([counts])
        self.update(counts)

    # -- one step --------------------------------------------------------------------------

    def step_rule(self, norms: Tensor, groups: Tensor, generator: torch.Generator,
                  collective: Collective = ALONE) -> StepRule:
        """This step's weights and sensitivity, with the side release in the paper's order.

        Called once per step with the per-sample gradient norms ``(B,)`` and group ids ``(B,)``
        (this process's part of the batch: its counts are summed over the ``collective``);
        count noise is drawn from ``generator``. A NaN norm counts as an infinite one.
        """
        finite = _all_finite(norms)
        if not finite:
            norms = torch.where(torch.isnan(norms), math.inf, norms)
        if self.releases_before_clipping:
            self.release(norms, groups, generator, collective)
        rule = self._rule(norms, groups, finite)
        if not self.releases_before_clipping:
            self.release(norms, groups, generator, collective)
        return rule

    def state(self) -> State:
        """Current clip bounds and released statistics, for trajectories."""
        return {}

    # -- the gradient former hook ------------------------------------------------------------

    def per_sample_gradients(self, model: nn.Module, kind: EngineKind) -> PerSampleGradients:
        """How ``g_i`` is formed: ``grad l_i(theta)``."""
        from dpfair.engine.gradients import make_engine

        return make_engine(model, kind)
