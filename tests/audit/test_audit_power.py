"""The audit's power, by simulating the guess game of Steinke, Nasr & Jagielski (2023)
directly: a run is randomised response on each canary's inclusion bit (the mechanism whose
guesses the pure-ε bound describes), so a run leaking ``ε + leak`` and one keeping ``ε`` are
both a few lines, and the audit's own decision (:func:`bound.flags`) judges them."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special

from dpfair.audit import AuditSettings, bound

SETTINGS = AuditSettings()  # the defaults: leak 1 nat, power 80 %, β 5 %, three fractions
GROUPS, DELTA, RUNS = 2, 1e-5, 600


def _default_canaries(claim: float) -> int:
    """What the planner (``run.plan_canaries``) picks for ``GROUPS`` groups."""
    m = bound.canaries_for_power(claim, SETTINGS.leak, SETTINGS.power, SETTINGS.guesses,
                                 SETTINGS.beta / GROUPS, DELTA, 10_000)
    assert m is not None
    return m


def _flag_rates(claim: float, true_epsilon: float, m: int, seed: int) -> dict[str, float]:
    """Share of simulated audits flagging: each group at β (alone) and at β/K, and jointly
    (some group flagged at β/K), for a run that is ``true_epsilon``-randomised response."""
    rng = np.random.default_rng(seed)
    q = float(special.expit(true_epsilon))
    alone = joint_group = joint = 0
    for _ in range(RUNS):
        flagged = []
        for _ in range(GROUPS):
            included = rng.random(m) < 0.5
            out = np.where(rng.random(m) < q, included, ~included)  # right w.p. q
            scores = out + 0.5 * rng.random(m)  # the released bit, ties broken at random
            alone += bound.flags(scores, included, SETTINGS.guesses, SETTINGS.beta, DELTA,
                                 claim)
            flagged.append(bound.flags(scores, included, SETTINGS.guesses,
                                       SETTINGS.beta / GROUPS, DELTA, claim))
        joint_group += sum(flagged)
        joint += any(flagged)
    n = RUNS * GROUPS
    return {"alone": alone / n, "joint_group": joint_group / n, "joint": joint / RUNS}


@pytest.mark.parametrize("claim", [0.5, 2.0])
def test_the_default_audit_catches_the_stated_leak(claim):
    """Every group alone, every group's joint statement and the joint verdict flag a run
    leaking 1 nat over its claim in at least 80 % of simulated audits, as planned."""
    m = _default_canaries(claim)
    planned = bound.detection_power(m, claim, SETTINGS.leak, SETTINGS.guesses,
                                    SETTINGS.beta / GROUPS, DELTA)
    assert planned >= SETTINGS.power
    rates = _flag_rates(claim, claim + SETTINGS.leak, m, seed=1)
    assert min(rates.values()) >= SETTINGS.power, rates
    # the planned power is a lower bound of the audit's (the best of three fractions)
    assert rates["joint_group"] >= planned - 3 * (planned * (1 - planned) / RUNS) ** 0.5


@pytest.mark.parametrize("claim", [0.5, 2.0])
def test_the_default_audit_rarely_flags_a_run_that_keeps_its_claim(claim):
    rates = _flag_rates(claim, claim, _default_canaries(claim), seed=2)
    assert rates["alone"] <= SETTINGS.beta and rates["joint"] <= SETTINGS.beta, rates


def test_the_old_default_at_the_ceiling_rarely_catches_the_leak():
    """The fewest canaries that can certify the claim at all (the former default) flag only
    runs with every guess right: the reason for sizing by power."""
    claim = 2.0
    ceiling = next(m for m in range(2, 10_000)
                   if bound.max_certifiable(m, SETTINGS.guesses, SETTINGS.beta, DELTA) >= claim)
    low = bound.detection_power(ceiling, claim, SETTINGS.leak, SETTINGS.guesses,
                                SETTINGS.beta / GROUPS, DELTA)
    assert low < 0.5 < SETTINGS.power <= bound.detection_power(
        _default_canaries(claim), claim, SETTINGS.leak, SETTINGS.guesses,
        SETTINGS.beta / GROUPS, DELTA)


def test_power_is_the_binomial_tail_beyond_the_rejection_threshold():
    """One fraction: power = P[Binomial(r, expit(ε + leak)) >= v*], v* the fewest correct
    guesses that reject ε (checked against the p-value directly)."""
    m, claim, leak, level = 400, 1.0, 1.0, 0.05
    r = 200
    v_star = next(v for v in range(r + 1) if bound.p_value(m, r, v, claim, 0.0) <= level)
    q = float(special.expit(claim + leak))
    from scipy import stats
    expected = float(stats.binom.sf(v_star - 1, r, q))
    assert bound.detection_power(m, claim, leak, [0.5], level, 0.0) == pytest.approx(expected)
    assert bound.detection_power(m, claim, 0.0, [0.5], level, 0.0) <= level


def test_a_claim_no_canary_count_can_catch_gets_none():
    assert bound.canaries_for_power(8.0, 1.0, 0.8, [0.1, 0.25, 0.5], 0.025, 1e-5, 10_000) is None
