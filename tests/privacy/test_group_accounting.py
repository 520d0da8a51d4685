"""DPSGD-F's per-group ε (dpfair.privacy.group_accounting) against dp_accounting composed by
hand, one step at a time, and against the run's own ε."""

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from dpfair.errors import PrivacyError
from dpfair.privacy import accounting as acc
from dpfair.privacy import group_accounting as ga

Q, DELTA, SIGMA, SIGMA1 = 0.01, 1e-5, 1.0, 10.0


def _exact(multipliers):
    """Oracle: every step its own Poisson-sampled Gaussian, no grid, dp_accounting's RDP."""
    a = rdp.RdpAccountant()
    for z in multipliers:
        a.compose(dp_event.PoissonSampledDpEvent(Q, dp_event.GaussianDpEvent(float(z))))
    return a.get_epsilon(DELTA)


def _reduced(z):
    return (z ** -2 + SIGMA1 ** -2) ** -0.5


def test_top_bound_throughout_is_the_runs_epsilon():
    steps = 300
    run = acc.epsilon(acc.reduced(acc.run_event(dp_event.ComposedDpEvent(
        [dp_event.GaussianDpEvent(SIGMA), dp_event.GaussianDpEvent(SIGMA1)]), Q, steps)), DELTA)
    out = ga.group_epsilons(SIGMA, SIGMA1, Q, [[2.0, 2.0]] * steps, DELTA)
    for e in out:  # multipliers rounded down: never below, at most the grid's rounding above
        assert run <= e <= run * 1.02


def test_heterogeneous_steps_match_the_exact_composition():
    rng = np.random.default_rng(3)
    bounds = 1.0 + rng.random((24, 2))
    out = ga.group_epsilons(SIGMA, SIGMA1, Q, bounds.tolist(), DELTA)
    for k in range(2):
        z = _reduced(SIGMA * bounds.max(axis=1) / bounds[:, k])
        exact = _exact(z)
        assert exact <= out[k] <= exact * 1.02


def test_a_group_at_the_top_bound_on_a_tenth_of_the_steps_pays_for_those_steps():
    # Xu 5.2's figure, eps * mean ratio, is below the eps of the top steps alone: not a bound
    steps, top = 1000, 100
    bounds = [[1.0, 1.0]] * top + [[1.0, 0.1]] * (steps - top)
    run = ga.group_epsilons(SIGMA, None, Q, [[1.0, 1.0]] * steps, DELTA)[0]
    out = ga.group_epsilons(SIGMA, None, Q, bounds, DELTA)
    those_alone = acc.epsilon(acc.run_event(dp_event.GaussianDpEvent(SIGMA), Q, top), DELTA)
    xu = run * (top + 0.1 * (steps - top)) / steps
    assert out[1] >= those_alone > xu
    assert out[1] < run  # the other steps are nearly free, not free of cost


def test_bad_trajectories_are_refused():
    for bad in ([], [[]], [[1.0, -1.0]], [[0.0, 0.0]], [[1.0, float("nan")]]):
        with pytest.raises(PrivacyError):
            ga.group_epsilons(SIGMA, None, Q, bad, DELTA)
    with pytest.raises(PrivacyError):
        ga.group_epsilons(SIGMA, None, 0.0, [[1.0]], DELTA)


def test_a_group_with_bound_zero_and_no_counts_costs_nothing():
    assert ga.group_epsilons(SIGMA, None, Q, [[1.0, 0.0]] * 10, DELTA)[1] == 0.0
