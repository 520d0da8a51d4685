"""Per-group ε of DPSGD-F (Xu et al. 2021, Alg. 2), each group accounted on its own steps.

At step t DPSGD-F clips group k at ``C_tk`` and adds Gaussian noise of std ``σ · max_j C_tj``
to the clipped sum (Xu Alg. 2, line 15), so adding or removing one member of group k moves
the sum by at most ``C_tk``: for that member the step is a Gaussian mechanism of noise
multiplier ``z_tk = σ · max_j C_tj / C_tk`` (≥ σ). The noisy counts ``{m_k, o_k}`` of the
same batch (sensitivity 1, noise ``σ1``) compose in on the same Poisson-sampled batch, so the
step reduces to one Gaussian of multiplier ``(z_tk^-2 + σ1^-2)^-1/2`` (Zhao et al., Lemma
3.1). Group k's ε is that heterogeneous sequence of Poisson-subsampled Gaussians composed by
dp_accounting's RDP accountant (:func:`group_event`).

Xu's §5.2 figure ``ε · mean_t C_tk / max_j C_tj`` is not a bound when the ratio varies over
the steps (a group at the top bound on a tenth of the steps already pays the ε of those steps
alone), hence this accounting. To keep the composition short, each step's multiplier is
rounded *down* to a geometric grid of ratio ``1 + GRID`` before identical steps are grouped:
a smaller multiplier has a larger ε, so the result stays an upper bound (at most about
``GRID`` relatively above the exact composition).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_accountant

from dpfair.errors import PrivacyError
from dpfair.privacy.accounting import DEFAULT_ORDERS, rdp_curve

GRID = 0.01  # multipliers rounded down to powers of 1.01

__all__ = ["GRID", "group_epsilons", "group_event"]


def _multipliers(sigma: float, count_sigma: float | None, bounds: np.ndarray) -> np.ndarray:
    """``(T, K)`` reduced noise multipliers of every step for a member of every group."""
    top = bounds.max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        z = np.where(bounds > 0, sigma * top / np.where(bounds > 0, bounds, 1.0), math.inf)
        inv2 = z ** -2.0 + (0.0 if count_sigma is None else count_sigma ** -2.0)
        return inv2 ** -0.5


def _cells(multipliers: np.ndarray) -> Counter[int]:
    """Grid cell (``z`` rounded down to ``(1 + GRID)^cell``) -> number of steps; steps of
    infinite multiplier (the group's bound is 0 and nothing else is released) cost nothing."""
    z = multipliers[np.isfinite(multipliers)]
    return Counter(np.floor(np.log(z) / math.log1p(GRID)).astype(np.int64).tolist())


def _cell_event(cell: int, sample_rate: float) -> dp_event.DpEvent:
    z = math.exp(cell * math.log1p(GRID))
    return dp_event.PoissonSampledDpEvent(float(sample_rate), dp_event.GaussianDpEvent(z))


def group_event(multipliers: Sequence[float], sample_rate: float) -> dp_event.DpEvent:
    """One group's steps as a DpEvent: a Poisson-sampled Gaussian per step, multipliers
    rounded down to the grid (module docstring) and equal ones self-composed."""
    z = _checked(multipliers, sample_rate)
    return dp_event.ComposedDpEvent([
        dp_event.SelfComposedDpEvent(_cell_event(cell, sample_rate), count)
        for cell, count in sorted(_cells(z).items())
    ])


def _checked(multipliers: Sequence[float], sample_rate: float) -> np.ndarray:
    if not 0 < sample_rate <= 1:
        raise PrivacyError(f"sample_rate must be in (0, 1], got {sample_rate}")
    z = np.asarray(multipliers, dtype=np.float64)
    if z.ndim != 1 or z.size == 0 or np.any(~(z > 0)):
        raise PrivacyError("need at least one step and noise multipliers > 0")
    return z


def group_epsilons(
    sigma: float,
    count_sigma: float | None,
    sample_rate: float,
    clip_bounds: Sequence[Sequence[float]],
    delta: float,
) -> list[float]:
    """ε of each group at ``delta`` (module docstring): ``clip_bounds[t][k]`` is group k's
    clipping bound at step t, one row per step of the run, ``sigma`` the gradient noise
    multiplier, ``count_sigma`` the count noise (``None``: no count release)."""
    bounds = np.asarray(clip_bounds, dtype=np.float64)
    if bounds.ndim != 2 or bounds.shape[0] == 0 or bounds.shape[1] == 0:
        raise PrivacyError("clip_bounds must be a non-empty list (steps) of lists (groups)")
    if np.any(bounds < 0) or not np.all(np.isfinite(bounds)) or np.any(bounds.max(axis=1) == 0):
        raise PrivacyError("clipping bounds must be finite, >= 0, and not all 0 in a step")
    if not sigma > 0:
        raise PrivacyError(f"sigma must be > 0, got {sigma}")
    z = _multipliers(sigma, count_sigma, bounds)
    cells = [_cells(_checked(z[:, k], sample_rate)) for k in range(bounds.shape[1])]
    orders = np.asarray(DEFAULT_ORDERS, dtype=np.float64)
    curve = {c: rdp_curve(_cell_event(c, sample_rate), orders)  # each cell once, all groups
             for c in sorted(set().union(*cells))}
    out = []
    for mine in cells:
        rdp = sum((n * curve[c] for c, n in mine.items()), np.zeros_like(orders))
        out.append(float(rdp_accountant.compute_epsilon(orders, rdp, delta)[0]))
    return out
