"""DPSGD-F's per-group ε (dpfair.accounting.per_group) against dp_accounting composed by
hand, one step at a time (PLD: never below it; RDP: never above it), and against the run's
own ε."""

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from dpfair.accounting import accountant as acc
from dpfair.accounting import per_group as ga
from dpfair.errors import PrivacyError

Q, DELTA, SIGMA, SIGMA1 = 0.01, 1e-5, 1.0, 10.0


def _exact(multipliers):
    """Oracle: every step its own Poisson-sampled Gaussian, no grid, dp_accounting's RDP."""
    a = rdp.RdpAccountant()
    for z in multipliers:
        a.compose(dp_event.PoissonSampledDpEvent(Q, dp_event.GaussianDpEvent(float(z))))
    return a.get_epsilon(DELTA)


def _exact_pld(multipliers):
    """Oracle: every step its own Poisson-sampled Gaussian, no grid, dp_accounting's PLD
    (dpfair's figure, its multipliers rounded down, must never be below it)."""
    out = pld_lib.identity(value_discretization_interval=1e-3)
    for z in multipliers:
        out = out.compose(pld_lib.from_gaussian_mechanism(
            float(z), sampling_prob=Q, value_discretization_interval=1e-3))
    return out.get_epsilon_for_delta(DELTA)


def _reduced(z):
    return (z ** -2 + SIGMA1 ** -2) ** -0.5


def test_top_bound_throughout_is_the_runs_epsilon():
    steps = 300
    # group ε is an RDP figure: compared with the run's ε under RDP
    run = acc.rdp_epsilon(acc.reduced(acc.run_event(dp_event.ComposedDpEvent(
        [dp_event.GaussianDpEvent(SIGMA), dp_event.GaussianDpEvent(SIGMA1)]), Q, steps)), DELTA)
    pld_run = acc.spend(acc.run_event(dp_event.ComposedDpEvent(
        [dp_event.GaussianDpEvent(SIGMA), dp_event.GaussianDpEvent(SIGMA1)]), Q, steps), DELTA)
    out = ga.group_epsilons(SIGMA, SIGMA1, Q, [[2.0, 2.0]] * steps, DELTA)
    for e in out:  # multipliers rounded down: never below, at most the grid's rounding above
        assert e.accountant == acc.ACCOUNTANT_PLD
        assert pld_run.epsilon <= e.epsilon <= pld_run.epsilon * 1.02
        assert e.epsilon < run  # PLD below RDP


def test_heterogeneous_steps_are_between_the_exact_pld_and_rdp_compositions():
    """30 steps of distinct multipliers for group 1 (group 0 at the top bound): more grid
    cells than MAX_CELLS, so cells are merged (rounded down further); the PLD figure stays
    above the exact PLD composition and below RDP's."""
    rng = np.random.default_rng(3)
    bounds = np.stack([np.full(30, 3.0), 1.0 + 2.0 * rng.random(30)], axis=1)
    out = ga.group_epsilons(SIGMA, SIGMA1, Q, bounds.tolist(), DELTA)
    z = _reduced(SIGMA * 3.0 / bounds[:, 1])
    fine_cells = set(np.floor(np.log(z) / np.log1p(ga.GRID)).tolist())
    assert len(ga.group_event(z, Q).events) <= ga.MAX_CELLS + 1 < len(fine_cells)
    assert out[1].accountant == acc.ACCOUNTANT_PLD
    assert _exact_pld(z) <= out[1].epsilon <= _exact(z)
    assert out[1].epsilon < out[0].epsilon


def test_a_group_at_the_top_bound_on_a_tenth_of_the_steps_pays_for_those_steps():
    # Xu 5.2's figure, eps * mean ratio, is below the eps of the top steps alone: not a bound
    steps, top = 1000, 100
    bounds = [[1.0, 1.0]] * top + [[1.0, 0.1]] * (steps - top)
    run = ga.group_epsilons(SIGMA, None, Q, [[1.0, 1.0]] * steps, DELTA)[0].epsilon
    out = ga.group_epsilons(SIGMA, None, Q, bounds, DELTA)[1].epsilon
    those_alone = acc.epsilon(acc.run_event(dp_event.GaussianDpEvent(SIGMA), Q, top), DELTA)
    xu = run * (top + 0.1 * (steps - top)) / steps
    assert out >= those_alone > xu
    assert out < run  # the other steps are nearly free, not free of cost


def test_bad_trajectories_are_refused():
    for bad in ([], [[]], [[1.0, -1.0]], [[0.0, 0.0]], [[1.0, float("nan")]]):
        with pytest.raises(PrivacyError):
            ga.group_epsilons(SIGMA, None, Q, bad, DELTA)
    with pytest.raises(PrivacyError):
        ga.group_epsilons(SIGMA, None, 0.0, [[1.0]], DELTA)


def test_a_group_with_bound_zero_and_no_counts_costs_nothing():
    assert ga.group_epsilons(SIGMA, None, Q, [[1.0, 0.0]] * 10, DELTA)[1].epsilon == 0.0


def test_the_bound_fixed_before_training_is_the_worst_the_clip_range_allows():
    """DPSGD-F's range [C0, C0 (1 + B)] lets any group hold the top bound at every step, so
    its fixed per-group bound is the top bound throughout (the run's ε); a reading of a run
    whose bounds favoured a group is below it (data-dependent); disjoint ranges fix less."""
    steps, c0, batch = 300, 0.5, 64.0
    top = ga.group_epsilons(SIGMA, SIGMA1, Q, [[1.0, 1.0]] * steps, DELTA)
    fixed = ga.fixed_group_epsilons(SIGMA, SIGMA1, Q, steps, [(c0, c0 * (1 + batch))] * 2,
                                    DELTA)
    assert [f.epsilon for f in fixed] == pytest.approx([t.epsilon for t in top], rel=1e-9)
    assert all(f.accountant == acc.ACCOUNTANT_PLD for f in fixed)
    favoured = [[2.0, 1.0]] * steps  # group 1 below the top bound at every step
    reading = ga.group_epsilons(SIGMA, SIGMA1, Q, favoured, DELTA)[1].epsilon
    assert reading < fixed[1].epsilon
    # group 1's highest bound 2, group 0 never below 3: a member of 1 always meets 1.5 σ
    disjoint = ga.fixed_group_epsilons(SIGMA, SIGMA1, Q, steps, [(3.0, 4.0), (1.0, 2.0)], DELTA)
    assert disjoint[1].epsilon == pytest.approx(
        ga.group_epsilons(SIGMA, SIGMA1, Q, [[3.0, 2.0]] * steps, DELTA)[1].epsilon, rel=1e-9)
    assert disjoint[1].epsilon < disjoint[0].epsilon == pytest.approx(fixed[0].epsilon)
    for bad in ([(2.0, 1.0)], [(0.0, 0.0)], [(-1.0, 1.0)], [1.0]):
        with pytest.raises(PrivacyError):
            ga.fixed_group_epsilons(SIGMA, None, Q, steps, bad, DELTA)


def test_dpsgd_f_bounds_stay_in_its_clip_range_whatever_the_counts():
    import torch

    from dpfair.methods.dpsgd_f import DpsgdF

    method = DpsgdF(0.5, 10.0, n_groups=3, expected_batch_size=64.0)
    low, high = method.clip_range()
    assert (low, high) == (0.5, 0.5 * 65)
    rng = np.random.default_rng(0)
    extremes = [[1, 0, 0, 0, 5, 9], [0, 0, 0, 3, 3, 3], [1, 1, 1, 0, 0, 0], [200, 0, 1, 0, 0, 0]]
    draws = rng.integers(0, 40, size=(200, 6)).tolist()
    for counts in extremes + draws:
        method.update(torch.tensor(counts, dtype=torch.float64))
        assert low <= float(method.C_k.min()) and float(method.C_k.max()) <= high
    method.update(torch.tensor([1.0, 0, 0, 0, 0, 0]))  # one clipped example, in a group of one
    assert float(method.C_k[0]) == high
