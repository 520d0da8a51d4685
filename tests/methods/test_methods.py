"""The clipping rules: sensitivity and count noise of every registered method, hand-computed
values, presets, step events, Zhao's toy."""

from __future__ import annotations

import math

import pytest
import torch
from dp_accounting import dp_event
from pydantic import TypeAdapter, ValidationError
from scipy import stats

from dpfair.methods import (
    Adaptive,
    Dpsgd,
    DpsgdConfig,
    DpsgdF,
    DpsgdGlobal,
    MethodConfig,
    NaiveReweight,
    build_method,
    registered_methods,
)

DTYPE = torch.float64
CONFIGS = TypeAdapter(MethodConfig)
INF, NAN = math.inf, math.nan
#: every registered method at its example (small bounds: the rules bite), and dpsgd normalised.
EXAMPLES = {name: spec.example() for name, spec in registered_methods().items()}
EXAMPLES["dpsgd_normalized"] = DpsgdConfig(C=0.7, normalize=True)
#: those with a proven sensitivity (fairlens is heuristic, nonprivate has no noise).
PRIVATE = sorted(key for key, cfg in EXAMPLES.items() if cfg.privacy_guarantee == "proven")


def built(key: str, *, n_groups: int = 3, sigma: float = 0.5, expected_batch_size: float = 10):
    """The method of ``EXAMPLES[key]``, several groups, few samples."""
    return build_method(
        EXAMPLES[key], n_groups=n_groups, sigma=sigma, expected_batch_size=expected_batch_size
    )


#: the methods that make a noisy count release.
RELEASES_COUNTS = sorted(key for key in PRIVATE if built(key).count_sigma is not None)


def rng(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def weighted_sum(weights: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    keep = (weights != 0)[:, None]
    return torch.where(keep, weights[:, None] * grads, 0).sum(0)


def special_gradients(kind: str, b: int = 12, d: int = 5) -> torch.Tensor:
    grads = torch.randn(b, d, generator=rng(1), dtype=DTYPE)
    value = {"random": None, "huge": 1e30, "tiny": 1e-30, "zero": 0.0, "nan": NAN, "inf": INF}[kind]
    if value is not None:
        grads[[0, 5]] = value
    grads[7, 2] = {"nan": NAN, "inf": -INF}.get(kind, grads[7, 2].item())
    return grads


@pytest.mark.parametrize("kind", ["random", "huge", "tiny", "zero", "nan", "inf"])
@pytest.mark.parametrize("key", PRIVATE)
def test_removing_one_sample_moves_the_update_by_at_most_s(key, kind):
    grads = special_gradients(kind)
    groups = torch.tensor([0, 1, 2, 0, 0, 1, 0, 0, 1, 0, 0, 0])
    norms = grads.norm(dim=1)
    method = built(key)
    for seed in range(3):  # released state from real noisy counts (dpsgd_f: C_k; adaptive: C_t)
        method.step_rule(norms, groups, rng(seed))
    full = method.rule(norms, groups)
    total = weighted_sum(full.weights, grads)
    assert torch.isfinite(total).all() and full.sensitivity > 0
    for j in range(len(norms)):
        keep = torch.arange(len(norms)) != j
        without = method.rule(norms[keep], groups[keep])
        assert without.sensitivity == full.sensitivity  # S depends on the released state only
        change = (total - weighted_sum(without.weights, grads[keep])).norm()
        assert change <= full.sensitivity * (1 + 1e-9), (j, change, full.sensitivity)


@pytest.mark.parametrize("key", RELEASES_COUNTS)
def test_released_counts_have_sensitivity_one(key):
    norms = torch.tensor([0.1, 2.0, INF, 0.5, 3.0, 0.7, 0.69], dtype=DTYPE)
    groups = torch.tensor([0, 1, 1, 2, 0, 0, 1])
    method = built(key, sigma=1.0, expected_batch_size=7)
    counts = method.counts(norms, groups)
    for j in range(len(norms)):
        keep = torch.arange(len(norms)) != j
        assert (counts - method.counts(norms[keep], groups[keep])).norm() <= 1


@pytest.mark.parametrize("key", RELEASES_COUNTS)
def test_count_noise_is_the_count_gaussian_of_the_step_event(key):
    """The step event names the noise actually drawn: Gaussian(σ) for the sum (checked in
    test_step), then Gaussian(σ_count) for the counts, whose residuals are N(0, σ_count²)."""
    sigma = 0.9
    method = built(key, sigma=sigma)
    event = method.step_event(sigma)
    assert isinstance(event, dp_event.ComposedDpEvent)
    gradient, count = event.events
    assert gradient == dp_event.GaussianDpEvent(sigma)
    norms = torch.linspace(0.0, 2.0, 30, dtype=DTYPE)
    groups = torch.arange(30) % 3
    exact = method.counts(norms, groups)
    released: list[torch.Tensor] = []
    method.update = released.append  # the noisy counts, before the rule's own rounding
    gen = rng(12)
    for _ in range(2000):
        method.release(norms, groups, gen)
    z = ((torch.stack(released) - exact) / count.noise_multiplier).flatten().numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert z.std() == pytest.approx(1.0, rel=0.05)


# ---------------------------------------------------------------- hand-computed rules


def test_dpsgd_f_bounds_from_released_counts():
    method = DpsgdF(1.0, 10.0, n_groups=3, expected_batch_size=8)
    norms = torch.tensor([2.0, 0.5, 3.0, 0.2, 0.1, 0.3], dtype=DTYPE)
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    assert method.counts(norms, groups).tolist() == [2, 0, 0, 2, 2, 0]  # m_0..m_2, o_0..o_2
    # noisy counts are floored and clamped at 0: m~ = (2, 0, 0), o~ = (2, 1, 0)
    method.update(torch.tensor([2.7, 0.2, -3.0, 2.1, 1.9, 0.4], dtype=DTYPE))
    # C_0 = 1 (1 + (2/4) / (2/8)) = 3; C_1 = 1 (1 + 0); b~_2 = 0 -> C_2 = C0
    assert method.state()["C_k"] == pytest.approx([3.0, 1.0, 1.0])
    rule = method.rule(torch.tensor([6.0, 2.0, 0.5], dtype=DTYPE), torch.tensor([0, 1, 0]))
    assert rule.weights.tolist() == pytest.approx([0.5, 0.5, 1.0])
    assert rule.sensitivity == 3.0
    method.update(torch.tensor([0.3, -1.0, 0.0, 5.0, 5.0, 0.0], dtype=DTYPE))  # m~ = 0
    assert method.state()["C_k"] == [1.0, 1.0, 1.0]


def test_dpsgd_f_releases_counts_with_its_own_sigma_before_clipping():
    method = DpsgdF(1.0, 7.0, n_groups=2, expected_batch_size=4)
    norms = torch.tensor([2.0, 0.5, 3.0, 0.2], dtype=DTYPE)
    groups = torch.tensor([0, 0, 1, 1])
    rule = method.step_rule(norms, groups, rng(3))
    noise = torch.randn(4, generator=rng(3), dtype=DTYPE)
    released = (method.counts(norms, groups) + 7.0 * noise).floor().clamp(min=0)
    state = method.state()
    assert state["m_released"] + state["o_released"] == released.tolist()
    bounds = torch.tensor(state["C_k"], dtype=DTYPE)
    assert rule.weights.tolist() == pytest.approx((bounds[groups] / norms).clamp(max=1).tolist())


def test_naive_reweight_theta():
    method = NaiveReweight(0.5, 10.0, n_groups=3, expected_batch_size=12)
    method.update(torch.tensor([3.6, 0.4, -2.0], dtype=DTYPE))  # b~ floored, clamped >= 1
    assert method.state()["theta_k"] == pytest.approx([4 / 3, 4.0, 4.0])  # (B/K) / b~_k
    rule = method.rule(torch.tensor([1.0, 0.25], dtype=DTYPE), torch.tensor([0, 1]))
    assert rule.weights.tolist() == pytest.approx([4 / 3 * 0.5, 4.0])
    assert rule.sensitivity == pytest.approx(0.5 * 4.0)


def test_dpsgd_global_zeroes_above_z_and_scales_by_c0_over_z():
    rule = DpsgdGlobal(1.0, 4.0).rule(
        torch.tensor([0.0, 1.0, 4.0, 4.0001, INF, NAN], dtype=DTYPE), torch.zeros(6, dtype=int)
    )
    assert rule.weights.tolist() == [0.25, 0.25, 0.25, 0.0, 0.0, 0.0]
    assert rule.sensitivity == 1.0
    with pytest.raises(ValidationError):
        CONFIGS.validate_python({"name": "dpsgd_global", "C0": 2.0, "Z": 1.0})


def test_dpsgd_clips_and_normalises():
    norms = torch.tensor([0.0, 0.5, 2.0], dtype=DTYPE)
    groups = torch.zeros(3, dtype=int)
    assert Dpsgd(1.0).rule(norms, groups).weights.tolist() == [1.0, 1.0, 0.5]
    normalised = Dpsgd(2.0, normalize=True).rule(norms, groups)
    assert normalised.weights.tolist() == [0.5, 0.5, 0.5] and normalised.sensitivity == 1.0


@pytest.mark.parametrize("C_LB", [0.0, 1.9])
def test_adaptive_clips_at_c_t_then_updates_it(C_LB):
    method = Adaptive(s=0.5, C0=2.0, eta_C=0.2, gamma=0.5, tau=1.5, C_LB=C_LB, sigma_count=3.0,
                      expected_batch_size=10)
    norms = torch.tensor([1.0, 2.5, 3.5, 4.0, 10.0], dtype=DTYPE)
    rule = method.step_rule(norms, torch.zeros(5, dtype=int), rng(4))
    assert rule.weights.tolist() == pytest.approx([0.25, 0.2, 0.5 / 3.5, 0.125, 0.05])
    assert rule.sensitivity == 0.5
    b_tilde = (3 + 3.0 * torch.randn(1, generator=rng(4), dtype=DTYPE).item()) / 10
    expected = max(C_LB, 2.0 * math.exp(0.2 * (b_tilde - 0.5)))
    assert method.state()["C"] == pytest.approx(expected)
    assert method.state()["b_released"] == pytest.approx(b_tilde)


def test_presets_resolve_to_the_adaptive_rule():
    def built(**cfg):
        return build_method(
            CONFIGS.validate_python(cfg), n_groups=2, sigma=0.8, expected_batch_size=256
        )

    esipova = built(name="dpsgd_global_adapt", C0=0.5, Z0=50, eta_Z=0.1, tau=0.7, sigma2=10)
    assert (esipova.s, esipova.C, esipova.eta_C, esipova.gamma, esipova.tau, esipova.C_LB) == (
        0.5,
        50,
        1.0,
        0.1,
        0.7,
        0.0,
    )
    assert esipova.count_sigma == 10 and esipova.name == "dpsgd_global_adapt"
    # Esipova Alg. 2: gamma_i = C0 / Z below Z, C0 / |g_i| above; Z <- Z exp(-eta_Z + b~)
    weights = esipova.rule(
        torch.tensor([10.0, 50.0, 100.0], dtype=DTYPE), torch.zeros(3, dtype=int)
    )
    assert weights.weights.tolist() == pytest.approx([0.01, 0.01, 0.005])
    esipova.update(torch.tensor([64.0], dtype=DTYPE))
    assert esipova.C == pytest.approx(50 * math.exp(-0.1 + 64 / 256))

    adaclip = built(name="adaclip")
    assert (adaclip.s, adaclip.tau, adaclip.C_LB, adaclip.count_sigma) == (1.0, 1.0, 0.0, 8.0)
    bounded = built(name="bounded_adaptive", C_LB=0.1)
    assert (bounded.gamma, bounded.tau, bounded.eta_C, bounded.C_LB) == (0.5, 2.5, 0.2, 0.1)
    assert bounded.count_sigma == pytest.approx(8.0)  # 10 sigma
    assert built(name="dpsgd_f").count_sigma == pytest.approx(8.0)  # Xu: sigma1 = 10 sigma2


def test_configs_reject_unknown_fields_and_methods():
    with pytest.raises(ValidationError):
        CONFIGS.validate_python({"name": "dpsgd", "clip": 1.0})
    with pytest.raises(ValidationError, match="unknown method 'dpsgd_magic'; did you mean"):
        CONFIGS.validate_python({"name": "dpsgd_magic"})
    with pytest.raises(ValueError, match="two groups"):
        build_method(
            CONFIGS.validate_python({"name": "fairlens"}),
            n_groups=3,
            sigma=1.0,
            expected_batch_size=10,
        )


def test_privacy_labels():
    def label(name):
        method = build_method(
            CONFIGS.validate_python({"name": name}), n_groups=2, sigma=1.0, expected_batch_size=10
        )
        return method.privacy_guarantee, method.count_sigma

    assert label("fairlens") == ("heuristic", None)
    assert label("nonprivate") == ("none", None)
    assert label("dpsgd") == ("proven", None)
    assert label("naive_reweight") == ("proven", 10.0)


def test_step_events():
    def event(name, sigma=1.0):
        method = build_method(
            CONFIGS.validate_python({"name": name}), n_groups=2, sigma=sigma, expected_batch_size=10
        )
        return method.step_event(sigma)

    gaussian = dp_event.GaussianDpEvent
    assert event("dpsgd") == event("fairlens") == event("bam") == gaussian(1.0)
    assert event("nonprivate") == event("nonprivate", 0.0) == dp_event.NonPrivateDpEvent()
    assert event("dpsgd_f", 0.5) == dp_event.ComposedDpEvent([gaussian(0.5), gaussian(5.0)])
    fixed = {"name": "adaclip", "sigma_count": 3.0}
    adaclip = build_method(
        CONFIGS.validate_python(fixed), n_groups=2, sigma=0.5, expected_batch_size=10
    )
    assert adaclip.step_event(0.5) == dp_event.ComposedDpEvent([gaussian(0.5), gaussian(3.0)])
    assert event("dpsgd", 0.0) == dp_event.NonPrivateDpEvent()  # no noise: in the clear
    with pytest.raises(ValueError, match="sigma must be >= 0"):
        event("dpsgd", -1.0)


# -------------------------------------------------------------- count noise distribution


def test_dpsgd_f_count_noise_is_gaussian_with_sigma1():
    sigma1, draws = 40.0, 400
    method = DpsgdF(1.0, sigma1, n_groups=2, expected_batch_size=2000)
    norms = torch.cat([torch.full((600,), 2.0), torch.full((900,), 0.5)]).to(DTYPE)
    groups = torch.cat([torch.zeros(300), torch.ones(300), torch.zeros(500), torch.ones(400)])
    groups = groups.long()
    counts = method.counts(norms, groups)  # 300, 300, 500, 400: far from the clamp at 0
    gen, residuals = rng(5), []
    for _ in range(draws):
        method.release(norms, groups, gen)
        state = method.state()
        residuals.append(torch.tensor(state["m_released"] + state["o_released"]) - counts)
    z = ((torch.stack(residuals) + 0.5) / sigma1).flatten().numpy()  # undo the floor on average
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert z.std() == pytest.approx(1.0, rel=0.05)


def test_adaptive_count_noise_is_gaussian_with_sigma_count():
    sigma_count, B = 5.0, 50
    method = Adaptive(s=1.0, C0=1.0, eta_C=0.2, gamma=0.5, tau=1.0, C_LB=0.0,
                      sigma_count=sigma_count, expected_batch_size=B)
    norms = torch.linspace(0.0, 2.0, 40, dtype=DTYPE)
    gen, noise = rng(6), []
    for _ in range(2000):
        method.C = 1.0
        b_t = int((norms > 1.0).sum())
        method.release(norms, torch.zeros(40, dtype=int), gen)
        b_tilde = math.log(method.C) / 0.2 + 0.5  # invert C_{t+1} = C_t exp(eta (b~ - gamma))
        noise.append((b_tilde * B - b_t) / sigma_count)
    assert stats.kstest(noise, "norm").pvalue > 1e-3


# --------------------------------------------------------------------------- Zhao's toy


def zhao_toy(C_LB: float, steps: int = 300) -> tuple[float, float]:
    """Mean estimation on bimodal data (60% at 0, 40% at 1) with loss 1/2 (x - mu)^2 and
    normalised adaptive clipping (tau = 1, gamma = 0.5), no noise (Zhao, Fig. 1 left)."""
    x = torch.cat(
        [0.01 * torch.randn(600, generator=rng(7)), 1 + 0.01 * torch.randn(400, generator=rng(8))]
    ).to(DTYPE)
    method = Adaptive(s=1.0, C0=1.0, eta_C=0.2, gamma=0.5, tau=1.0, C_LB=C_LB, sigma_count=0.0,
                      expected_batch_size=len(x))
    mu, groups, gen = 0.5, torch.zeros(len(x), dtype=int), rng(9)
    for _ in range(steps):
        grads = x - mu  # descent direction of each per-sample loss
        rule = method.step_rule(grads.abs(), groups, gen)
        mu += 0.05 * float((rule.weights * grads).sum()) / len(x)
    return mu, method.C


def test_zhao_toy_unbounded_collapses_to_the_majority_and_bounded_recovers_the_mean():
    mu, bound = zhao_toy(C_LB=0.0)
    assert abs(mu) < 0.05 and bound < 0.1
    mu, bound = zhao_toy(C_LB=1.0)
    assert mu == pytest.approx(0.4, abs=0.01) and bound == 1.0
