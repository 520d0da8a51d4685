"""The one-run ε lower bound of Steinke, Nasr & Jagielski, "Privacy Auditing with One (1)
Training Run" (NeurIPS 2023, arXiv:2305.08846).

Setting: ``m`` canaries, each included in the training data independently with probability
1/2. The auditor scores every canary, guesses "included" for the ``k+`` highest scores and
"excluded" for the ``k-`` lowest, and abstains on the rest; ``r = k+ + k-`` guesses, ``v`` of
them correct. Their main theorem with abstentions, for an (ε, δ)-DP training run:

    P[v correct] ≤ P[Binomial(r, e^ε / (1 + e^ε)) ≥ v]
                   + 2 m δ · max_{1 ≤ i ≤ v} P[v - i ≤ Binomial(r, e^ε / (1 + e^ε)) < v] / i

(the δ term is their bound for approximate DP; with δ = 0 it is the pure-ε theorem). This
right-hand side is :func:`p_value`. Every ε whose p-value is at most β is rejected at
confidence 1 - β, so the lower bound is the largest such ε, found by bisection
(:func:`epsilon_lower_bound`) and rounded *down* (the lower end of the final bracket, an ε
that is itself rejected). Trying several guess counts is paid for by a Bonferroni
correction (β divided by the number of counts tried, :func:`best_guesses`), so the reported
bound keeps its confidence.

What an audit can show at most: with every guess right, ``m`` canaries reject no ε above
:func:`max_certifiable` (about 0.68 for 20 canaries, 4.8 for 1,000 at β = 0.05 with three
guess fractions and δ = 1e-6), so an audit meant to catch a claimed ε needs
:func:`canaries_needed` canaries per group.

The Gaussian (f-DP) view (:func:`mu_lower_bound`): a μ-GDP mechanism is
(ε, δ_μ(ε))-DP with δ_μ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2) (Dong, Roth & Su 2022,
Cor. 2.13), so rejecting (ε_lb, δ) also rejects every μ with δ_μ(ε_lb) ≤ δ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

_EPS_MAX = 50.0  # no audit of m <= 10^9 canaries can reject an ε this large


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Probability of ``v`` or more correct guesses out of ``r`` (``m`` canaries) under
    (ε, δ)-DP: the theorem's right-hand side (module docstring), at most 1."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need epsilon >= 0 and 0 <= delta <= 1, got {epsilon}, {delta}")
    q = float(special.expit(epsilon))  # accuracy of ε-randomised response
    tail = float(stats.binom.sf(v - 1, r, q))
    if delta == 0 or v == 0:
        return min(1.0, tail)
    i = np.arange(1, v + 1)
    below = np.cumsum(stats.binom.pmf(v - i, r, q))  # P[v - i <= Bin < v]
    return min(1.0, tail + 2 * m * delta * float(np.max(below / i)))


def epsilon_lower_bound(m: int, r: int, v: int, beta: float, delta: float) -> float:
    """The largest ε that ``v`` correct guesses out of ``r`` reject at confidence ``1 - beta``
    (0 when they reject none), by bisection on :func:`p_value`, which grows with ε."""
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    return _largest_below(lambda eps: p_value(m, r, v, eps, delta) <= beta, 0.0, _EPS_MAX)


def _largest_below(holds: Callable[[float], bool], lo: float, hi: float,
                   xtol: float = 1e-7) -> float:
    """For ``holds`` true up to a threshold and false above it: a point where it holds within
    ``xtol`` below the threshold (``lo`` when it fails there, ``hi`` when it holds there).
    The bisection keeps the bracket's lower end, so the answer never overshoots."""
    if not holds(lo):
        return lo
    if holds(hi):
        return hi
    while hi - lo > xtol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo


@dataclass(frozen=True)
class Guesses:
    """The guesses behind a bound: ``r`` made (half on the highest scores, half on the
    lowest), ``v`` correct, and the ε lower bound at the corrected confidence."""

    r: int
    v: int
    epsilon: float


def guess(scores: np.ndarray, included: np.ndarray, r: int) -> tuple[int, int]:
    """``(r, v)``: guess "included" for the ``ceil(r/2)`` highest scores and "excluded" for
    the ``floor(r/2)`` lowest; ``v`` counts the correct guesses."""
    order = np.argsort(scores, kind="stable")
    k_pos, k_neg = (r + 1) // 2, r // 2
    top = order[len(order) - k_pos :] if k_pos else order[:0]
    v = int(included[top].sum()) + int((~included[order[:k_neg]]).sum())
    return r, v


def best_guesses(
    scores: np.ndarray,
    included: np.ndarray,
    fractions: Sequence[float],
    beta: float,
    delta: float,
) -> Guesses:
    """The highest lower bound over guessing a fraction ``f`` of the canaries for each ``f``
    in ``fractions``, each at confidence ``1 - beta / len(fractions)`` (Bonferroni)."""
    scores, included = np.asarray(scores, dtype=float), np.asarray(included, dtype=bool)
    m = len(scores)
    if m == 0 or included.shape != scores.shape:
        raise ValueError(f"need one inclusion bit per score, got {included.shape} for {m}")
    if not fractions or any(not 0 < f <= 1 for f in fractions):
        raise ValueError(f"guess fractions must be in (0, 1], got {list(fractions)}")
    level = beta / len(fractions)
    found = [
        Guesses(r, v, epsilon_lower_bound(m, r, v, level, delta))
        for r, v in (guess(scores, included, max(1, round(f * m))) for f in fractions)
    ]
    return max(found, key=lambda g: g.epsilon)


def max_certifiable(m: int, fractions: Sequence[float], beta: float, delta: float) -> float:
    """The largest ε an audit of ``m`` canaries can ever certify: every guess right, at the
    best of ``fractions`` (each at ``beta / len(fractions)``, as :func:`best_guesses`)."""
    level = beta / len(fractions)
    return max(epsilon_lower_bound(m, r, r, level, delta)
               for r in {max(1, round(f * m)) for f in fractions})


def canaries_needed(epsilon: float, fractions: Sequence[float], beta: float, delta: float,
                    most: int) -> int:
    """The fewest canaries (at most ``most``) whose :func:`max_certifiable` reaches
    ``epsilon``; ``most`` when even that many cannot (the caller reports the ceiling)."""
    can = lambda m: max_certifiable(m, fractions, beta, delta) >= epsilon  # noqa: E731
    if can(1):
        return 1
    if not can(most):
        return most
    lo, hi = 1, most  # can(lo) false, can(hi) true
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if can(mid) else (mid, hi)
    return hi


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ_μ(ε) of μ-GDP (module docstring); 0 for μ = 0."""
    if mu <= 0:
        return 0.0
    norm = stats.norm
    return float(
        norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)
    )


def mu_lower_bound(epsilon_lb: float, delta: float) -> float:
    """The largest μ whose μ-GDP is rejected with ``(epsilon_lb, delta)``: δ_μ(ε_lb) = δ."""
    if epsilon_lb <= 0 or delta <= 0:
        return 0.0
    hi = 1.0
    while gdp_delta(hi, epsilon_lb) < delta:
        hi *= 2
    return _largest_below(lambda mu: gdp_delta(mu, epsilon_lb) <= delta, 0.0, hi)
