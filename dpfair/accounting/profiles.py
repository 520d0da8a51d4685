"""Privacy profile of private selection: the best of K runs (Koskela, Redberg & Wang, ICML 2024).

A search runs a base mechanism Q (one training run and its noisy score) K times, K drawn from a
distribution with probability generating function φ(z) = E[z^K] independent of the data, and
releases only the best run (PrivateTuning; Papernot & Steinke, ICLR 2022, Algorithm 1). Koskela
et al. bound the privacy profile δ_A(ε) of that release directly from the profile δ_Q of one run
(their Section 3, the PGF recipe), where Papernot & Steinke go through Rényi DP. The bound used
here follows their recipe; written out, with F, F' the CDFs of Q's output order under neighbours
X, X' (ties broken by an independent uniform, so they are continuous), A's output density is
``q(y) φ'(F(y))`` and, for any split ε = ε1 + ε2,

    [q φ'(F) − e^ε q' φ'(F')]_+ ≤ φ'(F) [q − e^{ε1} q']_+ + e^{ε1} q' [φ'(F) − e^{ε2} φ'(F')]_+.

φ' increases, so the first term integrates to at most φ'(1)·δ_Q(ε1) = E[K]·δ_Q(ε1). In the
second, u = F'(Y) is uniform under X' and F = h(u) with h(u) ≤ B(u) = min over ε' of
``e^{ε'} u + δ_Q(ε')`` and ``1 − e^{−ε'}(1 − u − δ_Q(ε'))`` (Q is (ε', δ_Q(ε'))-DP on the events
{Y ≤ y} and {Y > y}), so it is at most ``e^{ε1} ∫_0^1 [φ'(B(u)) − e^{ε2} φ'(u)]_+ du``. Hence

    δ_A(ε) ≤ min_{ε1 + ε2 = ε} E[K]·δ_Q(ε1) + e^{ε1}·S(ε2),
    S(ε2) = ∫_0^1 [φ'(B(u)) − e^{ε2} φ'(u)]_+ du

for any law of K: the truncated negative binomial, Poisson and, as Koskela et al. suggest, the
binomial. (The derivation is written out here rather than quoting the paper's theorem
numbers; it is checked against the exact profile of a Gaussian base run in
``tests/accounting/test_profiles.py``.) Every step is evaluated so that it can only grow: δ_Q
is dp_accounting's pessimistic PLD, B uses finitely many ε', the integral is an upper
Riemann sum (B and φ' increase, so each cell takes φ'(B) at its right end and φ' at its left
end) and ε1, ε2 run over one grid.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dpfair.accounting.repeat_select import tnb_gamma
from dpfair.errors import PrivacyError

__all__ = ["Rounds", "selection_profile"]

#: points of the u-grid of the integral S (log-spaced near 0, uniform after)
_U_LOG, _U_LIN = 200, 1000


@dataclass(frozen=True)
class Rounds:
    """The law of K: ``tnb`` (η > -1, mean μ; Papernot & Steinke Definition 1), ``poisson``
    (mean μ) or ``binomial`` (n trials of probability p, as Koskela et al. propose). With
    K = 0 (Poisson, binomial) nothing is released whatever the data: it adds no δ at ε >= 0."""

    kind: str
    mean: float = 1.0
    eta: float = 1.0
    n: int = 0
    p: float = 0.0

    @classmethod
    def from_shape(cls, mean: float, shape: float) -> Rounds:
        """The K of dp_accounting's ``RepeatAndSelectDpEvent(mean, shape)`` (inf: Poisson)."""
        if not mean > 0:
            raise PrivacyError(f"the mean number of runs must be > 0, got {mean}")
        return cls("poisson", mean=mean) if math.isinf(shape) else cls("tnb", mean, shape)

    @property
    def expected(self) -> float:
        """E[K] = φ'(1)."""
        return self.n * self.p if self.kind == "binomial" else self.mean

    def pgf_derivative(self) -> Callable[[np.ndarray], np.ndarray]:
        """φ'(z) on [0, 1]."""
        if self.kind == "poisson":
            mu = self.mean
            return lambda z: mu * np.exp(mu * (z - 1))
        if self.kind == "binomial":
            if self.n < 1 or not 0 < self.p <= 1:
                raise PrivacyError(f"binomial K needs n >= 1, 0 < p <= 1: {self.n}, {self.p}")
            n, p = self.n, self.p
            return lambda z: n * p * (1 - p + p * z) ** (n - 1)
        if self.kind != "tnb":
            raise PrivacyError(f"unknown law of K {self.kind!r}: tnb, poisson or binomial")
        eta = self.eta
        gamma = tnb_gamma(eta, self.mean)
        if gamma >= 1:  # K = 1
            return lambda z: np.ones_like(z)
        if eta == 0:  # logarithmic: φ(z) = log(1 − (1−γ)z) / log γ
            c = (1 - gamma) / -math.log(gamma)
            return lambda z: c / (1 - (1 - gamma) * z)
        # φ(z) = ((1 − (1−γ)z)^−η − 1) / (γ^−η − 1)
        c = eta * (1 - gamma) / math.expm1(-eta * math.log(gamma))
        return lambda z: c * (1 - (1 - gamma) * z) ** (-eta - 1)


def _u_grid() -> np.ndarray:
    return np.unique(np.concatenate(
        [[0.0], np.geomspace(1e-14, 1e-2, _U_LOG), np.linspace(1e-2, 1.0, _U_LIN)]))


def _cdf_bound(u: np.ndarray, eps: np.ndarray, delta_q: np.ndarray) -> np.ndarray:
    """B(u): the largest F(y) where F'(y) = u allowed by Q's profile (module doc)."""
    e = np.exp(eps)[None, :]
    upper = np.min(e * u[:, None] + delta_q[None, :], axis=1)
    lower_tail = np.min(1 - (1 - u[:, None] - delta_q[None, :]) / e, axis=1)
    return np.clip(np.minimum(upper, lower_tail), 0.0, 1.0)


def selection_profile(
    base_delta: Callable[[np.ndarray], np.ndarray], rounds: Rounds, step: float, top: float
) -> tuple[np.ndarray, np.ndarray]:
    """Upper bound on δ_A(ε) at ε = 0, step, 2·step, ..., ≤ top for the best of K runs of a
    base mechanism with privacy profile ``base_delta`` (symmetric: the larger of the two
    neighbouring directions). Returns (ε grid, δ bound), δ non-increasing."""
    if not step > 0 or not top > step:
        raise PrivacyError(f"bad ε grid: step {step}, top {top}")
    dphi = rounds.pgf_derivative()
    # past ε_Q(1e-15) + log(φ'(1)/φ'(0)) + 1 the bound is below 1e-14: the grid stops there
    ratio = float(dphi(np.array([1.0]))[0] / max(float(dphi(np.array([0.0]))[0]), 1e-300))
    coarse = np.arange(0.0, top + 0.5, 0.5)
    small = np.asarray(base_delta(coarse)) <= 1e-15
    stop = coarse[int(np.argmax(small))] if np.any(small) else top
    eps = np.arange(0.0, min(top, stop + math.log(ratio) + 1) + step / 2, step)
    delta_q = np.clip(np.asarray(base_delta(eps), dtype=np.float64), 0.0, 1.0)
    delta_q = np.minimum.accumulate(delta_q)
    u = _u_grid()
    b = _cdf_bound(u, eps, delta_q)
    right = dphi(b[1:])  # φ'(B) at each cell's right end
    left = dphi(u[:-1])  # φ' at each cell's left end
    width = np.diff(u)
    # S(ε2) at grid ε2 up to the first where it is 0 (larger ε2 cannot lower the bound)
    exp_eps = np.exp(eps)
    s = np.maximum(right[None, :] - exp_eps[:, None] * left[None, :], 0.0) @ width
    j_max = int(np.argmax(s <= 0)) if np.any(s <= 0) else len(s) - 1
    first = rounds.expected * delta_q  # E[K]·δ_Q(ε1)
    # δ_A(ε_k) = min over j = k − i in [0, j_max] of first[i] + e^{ε_i} s[j]
    best = np.full(len(eps), np.inf)
    for j in range(j_max + 1):
        cand = first[: len(eps) - j] + exp_eps[: len(eps) - j] * s[j]
        best[j:] = np.minimum(best[j:], cand)
    bound = np.minimum(best, 1.0)
    return eps, np.minimum.accumulate(bound)
