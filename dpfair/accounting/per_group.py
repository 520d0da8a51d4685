"""Per-group ε of DPSGD-F (Xu et al. 2021, Alg. 2), each group accounted on its own steps:
a *data-dependent reading of one run*, and beside it the bound fixed before training.

At step t DPSGD-F clips group k at ``C_tk`` and adds Gaussian noise of std ``σ · max_j C_tj``
to the clipped sum (Xu Alg. 2, line 15), so adding or removing one member of group k moves
the sum by at most ``C_tk``: for that member the step is a Gaussian mechanism of noise
multiplier ``z_tk = σ · max_j C_tj / C_tk`` (≥ σ). The noisy counts ``{m_k, o_k}`` of the
same batch (sensitivity 1, noise ``σ1``) compose in on the same Poisson-sampled batch, so the
step reduces to one Gaussian of multiplier ``(z_tk^-2 + σ1^-2)^-1/2`` (Zhao et al., Lemma
3.1). Group k's ε is that heterogeneous sequence of Poisson-subsampled Gaussians composed
(:func:`group_event`) and accounted by dp_accounting's pessimistic PLD
(:mod:`dpfair.accounting.pld`; RDP, the slower and looser accountant, is its cross-check in the
tests).

Xu's §5.2 figure ``ε · mean_t C_tk / max_j C_tj`` is not a bound when the ratio varies over
the steps (a group at the top bound on a tenth of the steps already pays the ε of those steps
alone), hence this accounting. To keep the composition short, each step's multiplier is
rounded *down* to a geometric grid of ratio ``1 + GRID`` before identical steps are grouped;
if more than :data:`MAX_CELLS` grid cells remain, adjacent cells are merged into runs of about
equal numbers of steps, each at its smallest multiplier (for :func:`group_epsilons` one merge
over every group's steps, so the groups share their cells and each cell's PLD is built
once). A smaller multiplier has a larger ε at every δ (more noise is post-processing), so the
result stays an upper bound.

What the reading is: DPSGD-F's clip bounds ``C_tk`` come from noisy counts of the data, so
:func:`group_epsilons` of a trajectory is an after-the-fact reading of that one run, not a
guarantee fixed in advance (a run whose bounds happened to favour a group reads lower for it;
the figure itself depends on the data). The guarantee fixed before training is
:func:`fixed_group_epsilons`: the worst multiplier a member of group k can meet over every
bound vector the method allows (``Method.clip_range``, DPSGD-F ``[C0, C0 (1 + B)]``),
``σ · max(1, max_{j≠k} low_j / high_k)`` at every step. For DPSGD-F that ratio is 1 (any
group can hold the top bound), so the fixed per-group bound is the run's ε.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
from dp_accounting import dp_event

from dpfair.accounting.accountant import ACCOUNTANT_PLD, Spend
from dpfair.accounting.pld import pld_epsilon
from dpfair.errors import PrivacyError

GRID = 0.01  # multipliers rounded down to powers of 1.01
#: the most distinct multipliers one group's composition holds (each is a PLD to build)
MAX_CELLS = 16

__all__ = ["GRID", "MAX_CELLS", "fixed_group_epsilons", "group_epsilons", "group_event"]


def _multipliers(sigma: float, count_sigma: float | None, bounds: np.ndarray) -> np.ndarray:
    """``(T, K)`` reduced noise multipliers of every step for a member of every group."""
    top = bounds.max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        z = np.where(bounds > 0, sigma * top / np.where(bounds > 0, bounds, 1.0), math.inf)
        inv2 = z ** -2.0 + (0.0 if count_sigma is None else count_sigma ** -2.0)
        return inv2 ** -0.5


def _cell_counts(multipliers: np.ndarray) -> Counter[int]:
    """Grid cell (``z`` rounded down to ``(1 + GRID)^cell``) -> number of steps; steps of
    infinite multiplier (the group's bound is 0 and nothing else is released) cost nothing."""
    z = multipliers[np.isfinite(multipliers)]
    return Counter(np.floor(np.log(z) / math.log1p(GRID)).astype(np.int64).tolist())


def _merge(cells: Counter[int]) -> dict[int, int]:
    """Each cell -> the cell it is accounted at: itself where at most :data:`MAX_CELLS` cells
    are given, else the lowest cell of its run, adjacent cells merged into runs of about
    ``steps / MAX_CELLS`` steps."""
    if len(cells) <= MAX_CELLS:
        return {cell: cell for cell in cells}
    out: dict[int, int] = {}
    per_run, low, steps = sum(cells.values()) / MAX_CELLS, None, 0
    for cell, count in sorted(cells.items()):
        low = cell if low is None else low
        out[cell] = low
        steps += count
        if steps >= per_run:
            low, steps = None, 0
    return out


def _cells(multipliers: np.ndarray, merge: Mapping[int, int] | None = None) -> Counter[int]:
    """Accounted cell -> number of steps: the grid cells mapped by ``merge`` (default: the
    merge of these steps' own cells, :func:`_merge`)."""
    cells = _cell_counts(multipliers)
    merge = _merge(cells) if merge is None else merge
    merged: Counter[int] = Counter()
    for cell, count in cells.items():
        merged[merge[cell]] += count
    return merged


def _cell_event(cell: int, sample_rate: float) -> dp_event.DpEvent:
    z = math.exp(cell * math.log1p(GRID))
    return dp_event.PoissonSampledDpEvent(float(sample_rate), dp_event.GaussianDpEvent(z))


def group_event(multipliers: Sequence[float], sample_rate: float,
                merge: Mapping[int, int] | None = None) -> dp_event.DpEvent:
    """One group's steps as a DpEvent: a Poisson-sampled Gaussian per step, multipliers
    rounded down to the grid (module docstring) and equal ones self-composed; ``merge`` maps
    each grid cell to a cell at or below it (default: :func:`_merge` of these steps)."""
    z = _checked(multipliers, sample_rate)
    return dp_event.ComposedDpEvent([
        dp_event.SelfComposedDpEvent(_cell_event(cell, sample_rate), count)
        for cell, count in sorted(_cells(z, merge).items())
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
) -> list[Spend]:
    """ε of each group at ``delta`` and its accountant, a data-dependent reading of the run
    whose bounds these are (module docstring):
    ``clip_bounds[t][k]`` is group k's clipping bound at step t, one row per step of the run,
    ``sigma`` the gradient noise multiplier, ``count_sigma`` the count noise (``None``: no
    count release)."""
    bounds = np.asarray(clip_bounds, dtype=np.float64)
    if bounds.ndim != 2 or bounds.shape[0] == 0 or bounds.shape[1] == 0:
        raise PrivacyError("clip_bounds must be a non-empty list (steps) of lists (groups)")
    if np.any(bounds < 0) or not np.all(np.isfinite(bounds)) or np.any(bounds.max(axis=1) == 0):
        raise PrivacyError("clipping bounds must be finite, >= 0, and not all 0 in a step")
    if not sigma > 0:
        raise PrivacyError(f"sigma must be > 0, got {sigma}")
    z = _multipliers(sigma, count_sigma, bounds)
    # one merge of every group's cells: the groups share their cells' PLDs (built once each)
    merge = _merge(sum((_cell_counts(z[:, k]) for k in range(z.shape[1])), Counter()))
    return [Spend(pld_epsilon(group_event(z[:, k], sample_rate, merge), delta), delta,
                  ACCOUNTANT_PLD) for k in range(bounds.shape[1])]


def fixed_group_epsilons(
    sigma: float,
    count_sigma: float | None,
    sample_rate: float,
    steps: int,
    clip_ranges: Sequence[tuple[float, float]],
    delta: float,
) -> list[Spend]:
    """Each group's ε bound fixed before training (module docstring): ``clip_ranges[k]`` is
    the ``(low, high)`` every clip bound of group k stays in, whatever the data; every one of
    the ``steps`` steps at the smallest multiplier those ranges allow a member of group k."""
    ranges = np.asarray(clip_ranges, dtype=np.float64)
    if ranges.ndim != 2 or ranges.shape[1] != 2 or steps < 1:
        raise PrivacyError("need at least one step and one (low, high) clip range per group")
    if np.any(ranges[:, 0] < 0) or np.any(ranges[:, 0] > ranges[:, 1]) or np.any(ranges[:, 1] <= 0):
        raise PrivacyError(f"clip ranges must satisfy 0 <= low <= high, 0 < high: {clip_ranges}")
    lows, highs = ranges[:, 0], ranges[:, 1]
    tops = [max(highs[k], float(np.delete(lows, k).max(initial=0.0))) for k in range(len(highs))]
    # one row per group: the least top bound the others allow, group k at its highest bound
    z = _multipliers(sigma, count_sigma, np.stack([tops, highs], axis=1))[:, 1]
    return [Spend(pld_epsilon(group_event([float(z[k])] * steps, sample_rate), delta), delta,
                  ACCOUNTANT_PLD) for k in range(len(z))]
