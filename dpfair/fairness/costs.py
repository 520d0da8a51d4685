"""Privacy cost, excess risk, their gaps and Xu's equal cost of privacy (numpy only).

Definitions follow the papers:

* privacy cost ``pi_k = acc_k(theta*) - E[acc_k(theta~)]`` (Esipova et al. 2023, Sec. 3.1, Eq. 1);
* excess risk ``R_k = E[L_k(theta~)] - L_k(theta*)`` (Esipova et al. 2023, Sec. 3.1, Eq. 2);
* gaps ``pi_{a,b} = |pi_a - pi_b|`` and ``R_{a,b} = |R_a - R_b|`` (Esipova et al. 2023, Sec. 3.1);
* equal cost of privacy ``|Delta_i - Delta_j| <= tau`` with ``Delta_k`` the change of group
  k's accuracy from the non-private to the private model, ``tau = 0.05`` (Xu et al. 2021,
  Sec. 5.1 and 6.1.4).

Inputs are arrays of seeds x groups; the same quantities over a table of many runs are in
:mod:`dpfair.fairness.records` (per seed) and :mod:`dpfair.fairness.tables` (mean ± SE).
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

XU_TAU = 0.05


def privacy_cost(reference_acc: npt.ArrayLike, private_acc: npt.ArrayLike) -> np.ndarray:
    """``pi_k = acc_k(theta*) - E[acc_k(theta~)]`` (Esipova et al. 2023, Sec. 3.1, Eq. 1).

    Both inputs are ``(n_seeds, n_groups)`` (or ``(n_groups,)`` for one seed); each side is
    averaged over its seeds, NaN entries ignored.
    """
    return _seed_mean(reference_acc) - _seed_mean(private_acc)


def excess_risk(reference_loss: npt.ArrayLike, private_loss: npt.ArrayLike) -> np.ndarray:
    """``R_k = E[L_k(theta~)] - L_k(theta*)`` (Esipova et al. 2023, Sec. 3.1, Eq. 2).

    Inputs as in :func:`privacy_cost`.
    """
    return _seed_mean(private_loss) - _seed_mean(reference_loss)


def _seed_mean(values: npt.ArrayLike) -> np.ndarray:
    v = np.atleast_2d(np.asarray(values, dtype=np.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(v, axis=0)


def pair_gap(values: npt.ArrayLike, a: int, b: int) -> float:
    """``|v_a - v_b|``: the privacy cost gap or excess risk gap of a named pair of groups
    (Esipova et al. 2023, Sec. 3.1)."""
    v = np.asarray(values, dtype=np.float64)
    return float(abs(v[a] - v[b]))


def max_gap(values: npt.ArrayLike) -> tuple[float, tuple[int, int]]:
    """Largest ``|v_a - v_b|`` over all pairs of groups and the pair ``(a, b)``, a < b.

    NaN groups are ignored; on ties the first pair in ``(a, b)`` order wins.
    """
    v = np.asarray(values, dtype=np.float64)
    best, pair = -math.inf, (-1, -1)
    for a, b in itertools.combinations(range(v.size), 2):
        gap = abs(v[a] - v[b])
        if not math.isnan(gap) and gap > best:
            best, pair = float(gap), (a, b)
    if pair == (-1, -1):
        raise ValueError("max_gap needs at least two groups with a value")
    return best, pair


@dataclass(frozen=True)
class EqualCost:
    """Xu et al. 2021's equal cost of privacy, Sec. 5.1 and 6.1.4.

    ``deltas[k] = acc_k(private) - acc_k(non-private)`` (negative: accuracy lost, the sign of
    Xu's Table 1 "DPSGD vs. SGD"); ``max_gap = max |Delta_i - Delta_j|`` over pairs of
    groups, reached by ``pair``; ``equal`` is ``max_gap <= tau``.
    """

    deltas: np.ndarray
    max_gap: float
    pair: tuple[int, int]
    tau: float
    equal: bool


def equal_cost_of_privacy(
    reference_acc: npt.ArrayLike, private_acc: npt.ArrayLike, tau: float = XU_TAU
) -> EqualCost:
    """Verdict ``|Delta_i - Delta_j| <= tau`` for all pairs (Xu et al. 2021, Sec. 6.1.4).

    Inputs as in :func:`privacy_cost`: accuracies (fractions, since Xu's ``tau = 0.05``
    is on that scale) per seed and group; Delta uses the seed means. NaN groups ignored.
    """
    deltas = -privacy_cost(reference_acc, private_acc)
    gap, pair = max_gap(deltas)
    return EqualCost(deltas=deltas, max_gap=gap, pair=pair, tau=tau, equal=bool(gap <= tau))
