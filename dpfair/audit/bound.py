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
guess fractions and δ = 1e-6). Reaching the claim is not enough to catch a leak: at the
ceiling only a run with every guess right is flagged. :func:`detection_power` is the
probability that an audit flags a run leaking a stated amount over its claim, and
:func:`canaries_for_power` the canaries that make it likely (computed for randomised
response, the mechanism whose guesses the pure-ε bound describes exactly).

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
        for r, v in (guess(scores, included, _guesses(f, m)) for f in fractions)
    ]
    return max(found, key=lambda g: g.epsilon)


def max_certifiable(m: int, fractions: Sequence[float], beta: float, delta: float) -> float:
    """The largest ε an audit of ``m`` canaries can ever certify: every guess right, at the
    best of ``fractions`` (each at ``beta / len(fractions)``, as :func:`best_guesses`)."""
    level = beta / len(fractions)
    return max(epsilon_lower_bound(m, r, r, level, delta)
               for r in {_guesses(f, m) for f in fractions})


def rejects(m: int, r: int, v: int, epsilon: float, beta: float, delta: float) -> bool:
    """Whether ``v`` correct guesses out of ``r`` reject (ε, δ)-DP at confidence ``1 - beta``:
    :func:`p_value` at most ``beta`` (the test behind :func:`epsilon_lower_bound`)."""
    return p_value(m, r, v, epsilon, delta) <= beta


def flags(scores: np.ndarray, included: np.ndarray, fractions: Sequence[float], beta: float,
          delta: float, epsilon: float) -> bool:
    """Whether the audit rejects the claim ``epsilon``: some fraction's guesses (each at
    ``beta / len(fractions)``, as :func:`best_guesses`) reject it. A false flag of a run that
    keeps its claim has probability at most ``beta``."""
    scores, included = np.asarray(scores, dtype=float), np.asarray(included, dtype=bool)
    m, level = len(scores), beta / len(fractions)
    return any(rejects(m, *guess(scores, included, _guesses(f, m)), epsilon, level, delta)
               for f in fractions)


def _guesses(fraction: float, m: int) -> int:
    return max(1, round(fraction * m))


def _threshold(m: int, r: int, epsilon: float, level: float, delta: float) -> int | None:
    """The fewest correct guesses out of ``r`` that reject ``epsilon`` at ``level`` (None:
    not even ``r``), by bisection on :func:`p_value`, which falls as ``v`` grows."""
    if not rejects(m, r, r, epsilon, level, delta):
        return None
    if rejects(m, r, 0, epsilon, level, delta):
        return 0
    lo, hi = 0, r  # rejects at hi, not at lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if rejects(m, r, mid, epsilon, level, delta) else (mid, hi)
    return hi


def detection_power(m: int, epsilon: float, leak: float, fractions: Sequence[float],
                    beta: float, delta: float) -> float:
    """The probability (at least) that an audit of ``m`` canaries rejects the claim
    ``epsilon`` of a run that leaks ``epsilon + leak``: the run as (ε + leak)-randomised
    response, which makes each guess right independently with probability
    ``e^(ε+leak) / (1 + e^(ε+leak))``, so ``v ~ Binomial(r, that)`` (Steinke et al. 2023,
    the mechanism for which their bound is tight). The best of ``fractions`` flags when any
    does, so the largest single-fraction power is a lower bound of the audit's."""
    q = float(special.expit(epsilon + leak))
    level, found = beta / len(fractions), 0.0
    for r in {_guesses(f, m) for f in fractions}:
        v = _threshold(m, r, epsilon, level, delta)
        if v is not None:
            found = max(found, float(stats.binom.sf(v - 1, r, q)))
    return found


def canaries_for_power(epsilon: float, leak: float, power: float,
                       fractions: Sequence[float], beta: float, delta: float,
                       most: int) -> int | None:
    """A canary count (the fewest, up to the rounding of guess counts) whose
    :func:`detection_power` reaches ``power``; None when ``most`` canaries cannot. Bisection:
    the power grows with ``m`` but for the rounding of ``f · m``, and the count returned is
    checked to reach ``power``."""
    reach = lambda m: detection_power(m, epsilon, leak, fractions, beta, delta) >= power  # noqa: E731
    if not reach(most):
        return None
    lo, hi = 0, most  # reach(hi) holds; lo is below every count tried
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reach(mid) else (mid, hi)
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
