"""The number of runs K, drawn once per study (Papernot & Steinke, ICLR 2022).

* ``tnb``: K ~ truncated negative binomial TNB(η, γ) with mean μ (Definition 1; η = 0
  logarithmic, η = 1 geometric). γ solves ``mean(γ) = μ`` with ``mean = η(1-γ)/(γ(1-γ^η))``
  (η ≠ 0) or ``(1/γ-1)/log(1/γ)`` (η = 0), the convention of dp_accounting.
* ``poisson``: K ~ Poisson(μ) (Theorem 6); K may be 0 (probability e^-μ).
* ``binomial``: K ~ Binomial(n_runs, p) (Koskela, Redberg & Wang, ICML 2024); K may be 0
  (probability (1-p)^n_runs).
* ``fixed``: K = ``n_runs``; ``grid``: K = the number of grid points.

K is drawn (inverse CDF for TNB, ``Generator.poisson`` / ``binomial`` otherwise) when the
study is created and kept in the study (the private working state); a resumed study reads it
back, never redraws it. The generator is seeded from OS entropy (``SeedSequence()``), so K
cannot be recomputed from any setting; with ``TuningConfig.reproducible`` it is
``numpy.random.default_rng(SeedSequence([seed, 75]))``.
"""

from __future__ import annotations

import math
from typing import overload

import numpy as np

from dpfair import accounting
from dpfair.tuning.config import TuningConfig

__all__ = ["K_STREAM", "draw_k", "sample_tnb"]

K_STREAM = 75  # "K": the SeedSequence stream of the K draw


@overload
def sample_tnb(eta: float, mu: float, rng: np.random.Generator, size: None = None) -> int: ...
@overload
def sample_tnb(eta: float, mu: float, rng: np.random.Generator, size: int) -> np.ndarray: ...
def sample_tnb(
    eta: float, mu: float, rng: np.random.Generator, size: int | None = None
) -> np.ndarray | int:
    """Draw from TNB(η, γ) with mean ``mu`` by inverse CDF.

    P(K=1) = η(1-γ)/(γ^-η - 1) (η ≠ 0) or (1-γ)/log(1/γ) (η = 0), and
    P(K=k+1) = P(K=k)·(1-γ)(k+η)/(k+1) (Papernot & Steinke, Definition 1).
    """
    gamma = accounting.tnb_gamma(eta, mu)
    u = rng.random(size)
    if gamma >= 1.0:
        out = np.ones_like(u, dtype=np.int64)
        return int(out) if size is None else out
    if eta == 0:
        p = (1 - gamma) / -math.log(gamma)
    else:
        p = eta * (1 - gamma) / math.expm1(-eta * math.log(gamma))
    umax = float(np.max(u))
    pmf = [p]
    cdf = p
    k = 1
    while cdf < umax and k < 10_000_000:
        p *= (1 - gamma) * (k + eta) / (k + 1)
        cdf += p
        pmf.append(p)
        k += 1
        if p < 1e-300:  # numerically exhausted: the rest of the mass rounds to the last k
            break
    cum = np.cumsum(pmf)
    ks = np.minimum(np.searchsorted(cum, u, side="right"), len(cum) - 1) + 1
    return int(ks) if size is None else ks.astype(np.int64)


def draw_k(cfg: TuningConfig, n_grid: int) -> int:
    """The number of runs: drawn for tnb/poisson/binomial (secret or seeded, see the module
    doc), else fixed."""
    if cfg.mode == "fixed":
        return int(cfg.n_runs or 0)
    if cfg.mode == "grid":
        return n_grid
    entropy = np.random.SeedSequence([cfg.seed, K_STREAM] if cfg.reproducible else None)
    rng = np.random.default_rng(entropy)
    if cfg.mode == "poisson":
        return int(rng.poisson(cfg.mu))
    if cfg.mode == "binomial":
        return int(rng.binomial(int(cfg.n_runs or 0), float(cfg.p or 0.0)))
    return int(sample_tnb(cfg.eta, cfg.mu, rng))
