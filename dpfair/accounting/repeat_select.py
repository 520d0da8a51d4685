"""Repeat a run a random number of times and keep the best (Papernot & Steinke, ICLR 2022).

K, the number of runs, is truncated negative binomial TNB(η, γ) (η > -1; η = 0 logarithmic,
η = 1 geometric) or Poisson (``shape = inf``). dp_accounting 0.6 computes the RDP of the best of
K runs for η ≥ 0 (through :mod:`dpfair.accounting.dp_accounting_private`); Papernot & Steinke allow
η > -1, and η in (-1, 0) is computed here with the same formula and order optimisation.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize

from dpfair.accounting.dp_accounting_private import repeat_and_select_rdp
from dpfair.errors import PrivacyError

__all__ = ["repeat_and_select_curve", "tnb_gamma", "tnb_mean", "tnb_repeat_and_select"]


def tnb_mean(gamma: float, eta: float) -> float:
    """Mean of the truncated negative binomial TNB(η, γ) (Papernot & Steinke, Definition 1).

    ``η(1-γ) / (γ(1-γ^η))`` for η ≠ 0, ``(1/γ - 1) / log(1/γ)`` for η = 0 (logarithmic).
    """
    if not 0 < gamma <= 1:
        raise PrivacyError(f"gamma must be in (0, 1], got {gamma}")
    if eta <= -1:
        raise PrivacyError(f"eta must be > -1, got {eta}")
    if gamma == 1:
        return 1.0
    lg = math.log(gamma)
    if eta == 0:
        return (1 / gamma - 1) / (-lg)
    return eta * (1 - gamma) / (gamma * -math.expm1(eta * lg))


def tnb_gamma(eta: float, mean: float) -> float:
    """γ of TNB(η, γ) with the given mean (≥ 1), by root finding (γ=1/mean for η=1).

    Returns the root rounded *down* (smaller γ = larger log(1/γ) = conservative), as
    dp_accounting does.
    """
    if eta <= -1:
        raise PrivacyError(f"eta must be > -1, got {eta}")
    if mean < 1:
        raise PrivacyError(f"mean number of runs must be >= 1, got {mean}")
    if mean == 1:
        return 1.0
    if eta == 1:
        return 1.0 / mean

    # mean(γ) decreases from +inf (γ→0) to 1 (γ→1); work in log γ.
    def f(log_g: float) -> float:
        return math.log(tnb_mean(math.exp(log_g), eta)) - math.log(mean)

    hi = -1e-12
    lo = -1.0
    while f(lo) < 0:
        lo *= 2
        if lo < -1e4:
            raise PrivacyError(f"cannot find gamma for eta={eta}, mean={mean}")
    root = optimize.brentq(f, lo, hi, xtol=1e-15, rtol=1e-15, maxiter=500)
    return math.exp(root) * (1 - 1e-12)


def tnb_repeat_and_select(
    orders: np.ndarray, rdp: np.ndarray, mean: float, shape: float
) -> np.ndarray:
    """Papernot & Steinke Theorem 2, with dp_accounting's order optimisation (any η > -1)."""
    gamma = tnb_gamma(shape, mean)
    c = (1 + shape) * np.min((1 - 1 / orders) * rdp - math.log(gamma) / orders)
    out = np.full_like(orders, np.inf, dtype=np.float64)
    mask = orders > 1
    out[mask] = rdp[mask] + math.log(mean) / (orders[mask] - 1) + c
    # monotonicity of RDP in the order
    best = np.inf
    idx = np.argsort(orders)[::-1]
    for i in idx:
        best = min(best, out[i])
        out[i] = best
    return out


def repeat_and_select_curve(
    orders: np.ndarray, rdp: np.ndarray, mean: float, shape: float
) -> np.ndarray:
    """RDP at ``orders`` of the best of K runs, each with RDP ``rdp``; K has mean ``mean`` and
    shape ``shape`` (η > -1, or ``inf`` for Poisson)."""
    if shape >= 0:
        return repeat_and_select_rdp(orders, rdp, mean, shape)
    return tnb_repeat_and_select(orders, rdp, mean, shape)
