"""Accounting: dp_accounting vs Opacus, the papers' epsilons, every method's run event against
the old closed form (σ_eff), the reduced form, calibration, JSON."""

from __future__ import annotations

import math
import warnings

import pytest
from dp_accounting import dp_event
from opacus.accountants import RDPAccountant

from dpfair.accounting import accountant as acc
from dpfair.errors import PrivacyError
from dpfair.methods import build_method, registered_methods

# Opacus sums the binomial series of A_alpha with signs at fractional orders; dp_accounting 0.6
# adds absolute values (a valid, slightly looser upper bound). At integer orders both are the
# same exact sum, so the oracle comparison uses integer orders; at Opacus's default (fractional)
# orders dp_accounting is never below Opacus and within 0.1%.
INTEGER_ORDERS = list(range(2, 64)) + [128, 256]


def gaussian(sigma: float) -> dp_event.DpEvent:
    return dp_event.GaussianDpEvent(sigma)


def with_counts(sigma: float, count_sigma: float) -> dp_event.DpEvent:
    """A step releasing the noisy sum and a noisy count (adaptive / fair methods)."""
    return dp_event.ComposedDpEvent([gaussian(sigma), gaussian(count_sigma)])


def closed_form(q: float, sigma_eff: float, steps: int) -> dp_event.DpEvent:
    """The run event as dpfair wrote it before a step's releases were named one by one."""
    return dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma_eff)), steps
    )


@pytest.mark.parametrize("q", [0.001, 0.01, 0.1, 0.5])
@pytest.mark.parametrize("sigma", [0.6, 1.0, 2.5])
@pytest.mark.parametrize("steps", [1, 100, 5000])
def test_epsilon_matches_opacus(q, sigma, steps):
    delta = 1e-5
    oracle = RDPAccountant()
    oracle.history = [(sigma, q, steps)]
    event = acc.run_event(gaussian(sigma), q, steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "optimal order is the smallest alpha"
        want = oracle.get_epsilon(delta, alphas=INTEGER_ORDERS)
        want_frac = oracle.get_epsilon(delta, alphas=RDPAccountant.DEFAULT_ALPHAS)
    assert acc.epsilon(event, delta, orders=INTEGER_ORDERS) == pytest.approx(want, rel=1e-6)
    got_frac = acc.epsilon(event, delta, orders=RDPAccountant.DEFAULT_ALPHAS)
    assert got_frac >= want_frac * (1 - 1e-9)
    if want_frac < 10:
        assert got_frac <= want_frac * 1.01


@pytest.mark.parametrize(
    "sigma, n_train, epochs, published",
    [(1.0, 48_336, 20, 2.27), (0.8, 162_770, 30, 2.49)],  # Esipova: Dutch, CelebA
)
def test_esipova_epsilons(sigma, n_train, epochs, published):
    # steps = epochs * ceil(n / B) (round(n / B) gives the same step counts here)
    steps = acc.steps_for_epochs(epochs, n_train, 256)
    assert steps == epochs * round(n_train / 256)
    event = acc.run_event(gaussian(sigma), 256 / n_train, steps)
    assert round(acc.rdp_epsilon(event, 1e-6), 2) == published  # the papers account with RDP
    assert acc.epsilon(event, 1e-6) < published  # the PLD figure for the same noise


@pytest.mark.parametrize("name", sorted(registered_methods()))
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.3])
def test_every_method_keeps_the_epsilon_of_the_old_closed_form(name, sigma):
    """The run event from the method's step event gives the ε of ``SelfComposed(PoissonSampled(q,
    Gaussian((σ^-2 + σ_count^-2)^-1/2)), T)`` (Zhao Lemma 3.1), to 1e-9."""
    q, steps, delta = 256 / 48_336, 3780, 1e-6
    method = build_method(
        registered_methods()[name].example(), n_groups=2, sigma=sigma, expected_batch_size=256
    )
    event = acc.run_event(method.step_event(sigma), q, steps)
    got = acc.epsilon(event, delta)
    if not method.is_private:
        assert event == dp_event.NonPrivateDpEvent() and got == math.inf
        return
    count = method.count_sigma
    sigma_eff = sigma if count is None else (sigma**-2 + count**-2) ** -0.5
    want = acc.epsilon(closed_form(q, sigma_eff, steps), delta)
    assert abs(got - want) <= 1e-9 * max(1.0, want)
    assert acc.reduced(event) == closed_form(q, sigma_eff, steps)


def test_reduced_names_the_effective_noise_everywhere():
    s, sc = 0.8, 8.0
    run = acc.run_event(with_counts(s, sc), 0.01, 10)
    sigma_eff = acc.reduced(run).event.event.noise_multiplier
    assert sigma_eff == pytest.approx(0.8 * 10 / math.sqrt(101))
    assert sigma_eff == pytest.approx((s**-2 + sc**-2) ** -0.5) and sigma_eff < s
    plain = acc.run_event(gaussian(1.3), 0.01, 10)
    assert acc.reduced(plain) == plain  # already reduced
    nested = [
        dp_event.ComposedDpEvent([run, acc.score_release_event(5.0)]),
        dp_event.RepeatAndSelectDpEvent(run, 10.0, 0.5),
        acc.MaxOfDpEvent([run, plain]),
    ]
    for event in nested:
        flat = acc.reduced(event)
        assert flat != event and acc.reduced(flat) == flat
        assert acc.event_to_json(acc.reduced(run)) in acc.event_to_json(flat)
        assert acc.epsilon(flat, 1e-5) == pytest.approx(acc.epsilon(event, 1e-5), rel=1e-9)
    # a composition outside Poisson sampling is left alone (it is not one query of one batch)
    loose = with_counts(s, sc)
    assert acc.reduced(loose) == loose
    assert acc.reduced(dp_event.NonPrivateDpEvent()) == dp_event.NonPrivateDpEvent()


def test_run_event_checks_its_arguments():
    with pytest.raises(PrivacyError, match="sample_rate"):
        acc.run_event(gaussian(1.0), 0.0, 10)
    with pytest.raises(PrivacyError, match="steps"):
        acc.run_event(gaussian(1.0), 0.1, 2.5)


def test_noise_for_epsilon_round_trip():
    q, steps, delta = 256 / 48_336, 3780, 1e-6

    def dpsgd(s: float) -> dp_event.DpEvent:
        return acc.run_event(gaussian(s), q, steps)

    sigma = acc.noise_for_epsilon(2.27, dpsgd, delta)
    assert acc.epsilon(dpsgd(sigma), delta) <= 2.27
    assert acc.epsilon(dpsgd(sigma * 0.999), delta) > 2.27
    # Esipova's σ = 1 gives 2.27 under RDP; the PLD figure meets 2.27 with less noise
    assert acc._rdp_noise(2.27, dpsgd, delta) == pytest.approx(1.0, abs=0.01)
    assert 0.85 < sigma < 0.97

    def scaling(s: float) -> dp_event.DpEvent:  # Esipova's σ1 = 10 σ2
        return acc.run_event(with_counts(s, 10 * s), q, steps)

    s2 = acc.noise_for_epsilon(3.0, scaling, delta)
    eps = acc.epsilon(scaling(s2), delta)
    assert eps == pytest.approx(3.0, rel=1e-4) and eps <= 3.0


def test_noise_for_epsilon_with_a_fixed_count_noise():
    """A count noise that does not scale with σ calibrates; it bounds ε from below."""
    q, steps, delta = 0.01, 1000, 1e-6

    def fixed(s: float) -> dp_event.DpEvent:
        return acc.run_event(with_counts(s, 3.0), q, steps)

    sigma = acc.noise_for_epsilon(2.0, fixed, delta)
    eps = acc.epsilon(fixed(sigma), delta)
    assert eps == pytest.approx(2.0, rel=1e-4) and eps <= 2.0
    floor = acc.epsilon(acc.run_event(gaussian(3.0), q, steps), delta)
    with pytest.raises(PrivacyError, match="no sigma <= 1e7 reaches epsilon"):
        acc.noise_for_epsilon(floor * 0.9, fixed, delta)


def test_json_round_trip():
    run = acc.run_event(with_counts(1.1, 11.0), 0.01, 50)
    events = [
        run,
        dp_event.ComposedDpEvent([run, acc.score_release_event(5.0)]),
        dp_event.RepeatAndSelectDpEvent(run, 10.0, math.inf),
        dp_event.RepeatAndSelectDpEvent(run, 10.0, 0.5),
        acc.MaxOfDpEvent([run, acc.run_event(gaussian(1.0), 0.02, 30)]),
        acc.reduced(run),
        dp_event.NonPrivateDpEvent(),
    ]
    for ev in events:
        s = acc.event_to_json(ev)
        assert "Infinity" not in s
        back = acc.event_from_json(s)
        assert back == ev
        assert acc.event_to_json(back) == s
    with pytest.raises(ValueError, match="unknown DpEvent"):
        acc.event_from_json('{"type": "Bogus"}')
    with pytest.raises(PrivacyError, match="not a DpEvent"):
        acc.event_to_json(None)
    with pytest.raises(PrivacyError, match="not the JSON of a DpEvent"):
        acc.event_from_json("null")


def test_nonprivate_is_infinite_and_never_none():
    nonprivate = dp_event.NonPrivateDpEvent()
    assert acc.epsilon(nonprivate, 1e-5) == math.inf
    assert acc.run_event(nonprivate, 0.1, 100) == nonprivate
    with pytest.raises(PrivacyError, match="not a DpEvent"):
        acc.epsilon(None, 1e-5)


def test_max_of_event_and_negative_shape():
    a, b = acc.run_event(gaussian(1.0), 0.01, 100), acc.run_event(gaussian(1.0), 0.05, 20)
    m = acc.epsilon(acc.MaxOfDpEvent([a, b]), 1e-5)
    assert m >= max(acc.epsilon(a, 1e-5), acc.epsilon(b, 1e-5)) - 1e-12
    # shape in (-1, 0): our formula, continuous with dp_accounting's at shape 0
    e0 = acc.epsilon(dp_event.RepeatAndSelectDpEvent(a, 10.0, 0.0), 1e-5)
    e_small = acc.epsilon(dp_event.RepeatAndSelectDpEvent(a, 10.0, -1e-6), 1e-5)
    assert e_small == pytest.approx(e0, rel=1e-4)


def test_tnb_mean_inverse():
    for eta in [-0.5, 0.0, 0.5, 1.0, 3.0]:
        for mu in [1.5, 10.0, 64.0]:
            g = acc.tnb_gamma(eta, mu)
            assert acc.tnb_mean(g, eta) == pytest.approx(mu, rel=1e-9)


@pytest.mark.parametrize("event", [
    acc.run_event(with_counts(1.1, 10.0), 0.05, 380),
    dp_event.ComposedDpEvent([
        dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(0.05, gaussian(1.0)), 7),
        dp_event.NoOpDpEvent(),
        dp_event.SelfComposedDpEvent(dp_event.ComposedDpEvent([
            dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(0.05, gaussian(1.0)), 3),
            gaussian(4.0)]), 5),
        dp_event.SelfComposedDpEvent(gaussian(2.0), 0),
        dp_event.PoissonSampledDpEvent(0.01, with_counts(0.8, 3.0))]),
    dp_event.ComposedDpEvent([gaussian(1.0), dp_event.NonPrivateDpEvent()]),
    dp_event.NoOpDpEvent(),
])
def test_rdp_with_each_curve_once_is_dp_accountings_to_the_bit(event):
    """The RDP walk that computes each mechanism's curve once per process gives dp_accounting's
    own accountant's RDP curve and ε exactly (twice: the second from the cached curves)."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_accountant

    want = rdp_accountant.RdpAccountant(list(acc.DEFAULT_ORDERS))
    want.compose(event)
    for _ in range(2):
        curve = acc.rdp_curve(event)
        assert curve.tobytes() == want.rdp.tobytes()
        assert acc.rdp_epsilon(event, 1e-5) == want.get_epsilon(1e-5)
        curve += 1.0  # the caller's own array: the cached curves stay as they were
