"""PrivateStep end to end: noise, scaling, engines, and the three gradient formers."""

from __future__ import annotations

import copy

import pytest
import torch
from dp_accounting import dp_event
from pydantic import TypeAdapter
from scipy import stats
from torch import nn

from dpfair.engine.step import PrivateStep, per_sample_cross_entropy
from dpfair.methods import MethodConfig, build_method, registered_methods
from tests.conftest import biting_method_config

DTYPE = torch.float64
CONFIGS = TypeAdapter(MethodConfig)


def rng(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


#: every registered method, and dpsgd normalised.
KEYS = sorted({*registered_methods(), "dpsgd_normalized"})


def method(key: str, *, n_groups: int = 2, sigma: float = 1.0, expected_batch_size: float = 5.0):
    cfg = CONFIGS.validate_python(biting_method_config(key))
    return build_method(
        cfg, n_groups=n_groups, sigma=sigma, expected_batch_size=expected_batch_size
    )


def private_step(model: nn.Module, meth, **kw) -> PrivateStep:
    """``PrivateStep(model, meth, **kw)``; skips a method whose former refuses this path (BAM's
    fast ascent serves Linear-only models)."""
    try:
        return PrivateStep(model, meth, **kw)
    except ValueError as exc:
        pytest.skip(str(exc))


def grads_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.requires_grad]


def run(model, meth, x, y, g, *, sigma=1.0, engine="auto", seed=0, expected_batch_size=5.0):
    step = PrivateStep(
        model, meth, sigma=sigma, expected_batch_size=expected_batch_size, engine=engine
    )
    info = step(x, y, g, rng(seed))
    return info, grads_of(model)


def loop_gradients(model: nn.Module, x, y, shift=None) -> torch.Tensor:
    """Per-sample gradients ``(B, P)`` one sample at a time, at ``theta + shift``."""
    model = copy.deepcopy(model)
    if shift is not None:
        with torch.no_grad():
            for p, s in zip(model.parameters(), shift, strict=True):
                p.add_(s)
    rows = []
    for i in range(len(x)):
        loss = per_sample_cross_entropy(model(x[i : i + 1]), y[i : i + 1]).sum()
        rows.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, model.parameters())]))
    return torch.stack(rows)


def clipped_mean(per_sample: torch.Tensor, C: float, expected_batch_size: float) -> torch.Tensor:
    factors = (C / per_sample.norm(dim=1)).clamp(max=1)
    return (factors[:, None] * per_sample).sum(0) / expected_batch_size


def flat(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.flatten() for g in grads])


@pytest.mark.parametrize(
    "key", [k for k in KEYS if method(k).privacy_guarantee != "heuristic"]
)  # FairLens's g_i are not per sample: test_fairlens_regularised_gradients_on_both_paths
def test_fast_and_materialised_steps_agree(key, model_and_batch):
    """Two steps (the second one perturbed by DP-SAT, with updated adaptive bounds)."""
    model, x, y, g = model_and_batch
    infos, grads = [], []
    for engine in ("fast", "materialized"):
        step = private_step(
            model, method(key), sigma=1.0, expected_batch_size=5.0, engine=engine
        )
        step(x, y, g, rng(0))
        infos.append(step(x, y, g, rng(1)))
        grads.append(grads_of(model))
    assert infos[0].sensitivity == infos[1].sensitivity
    assert infos[0].state == infos[1].state
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("key", [k for k in KEYS if method(k).is_private])
def test_noise_std_is_sigma_times_sensitivity(key, nets):
    """The gradient noise drawn is the step event's first Gaussian times S (the count noise:
    test_methods.test_count_noise_is_the_count_gaussian_of_the_step_event)."""
    torch.manual_seed(0)
    model = nn.Linear(1024, 2).to(DTYPE)  # 2050 parameters; binary for FairLens
    x, y, g = nets.batch((1024,), 2, b=8)
    fresh = method(key, sigma=1.7)
    event = fresh.step_event(1.7)
    gradient = event.events[0] if isinstance(event, dp_event.ComposedDpEvent) else event
    assert gradient == dp_event.GaussianDpEvent(1.7)
    noisy, with_noise = run(model, copy.deepcopy(fresh), x, y, g, sigma=1.7, seed=3)
    clean, without = run(model, copy.deepcopy(fresh), x, y, g, sigma=0.0, seed=3)
    assert noisy.state == clean.state and noisy.sensitivity == clean.sensitivity
    sigma = gradient.noise_multiplier
    z = (flat(with_noise) - flat(without)) * 5.0 / (sigma * noisy.sensitivity)
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-3
    assert z.std().item() == pytest.approx(1.0, rel=0.05)


def test_update_is_the_sum_over_the_expected_batch_size_and_nonprivate_is_the_mean(nets):
    torch.manual_seed(0)
    model = nets.mlp(width=8)
    x, y, g = nets.batch((12,), 2, b=4)
    per_sample = loop_gradients(model, x, y)
    unclipped = build_method(
        CONFIGS.validate_python({"name": "dpsgd", "C": 1e6}),
        n_groups=2,
        sigma=0.0,
        expected_batch_size=10.0,
    )
    _, grads = run(model, unclipped, x, y, g, sigma=0.0, expected_batch_size=10.0)
    torch.testing.assert_close(flat(grads), per_sample.sum(0) / 10.0)
    info, grads = run(
        model, method("nonprivate", expected_batch_size=10.0), x, y, g, expected_batch_size=10.0
    )
    torch.testing.assert_close(flat(grads), per_sample.mean(0))
    assert info.sensitivity == 0.0
    loss = per_sample_cross_entropy(model(x), y).mean().item()
    assert info.nonprivate_batch_loss == pytest.approx(loss)


def test_runs_are_deterministic_under_a_seed(nets):
    torch.manual_seed(0)
    model = nets.mlp(width=8)
    x, y, g = nets.batch((12,), 2)
    first = run(model, method("dpsgd_f"), x, y, g, seed=11)
    second = run(model, method("dpsgd_f"), x, y, g, seed=11)
    assert first[0] == second[0]
    assert torch.equal(flat(first[1]), flat(second[1]))


def test_non_finite_samples_get_weight_zero_and_the_update_stays_finite(nets):
    torch.manual_seed(0)
    model = nets.mlp(width=8)
    x, y, g = nets.batch((12,), 2)
    x[1, 0], x[4, 2] = float("nan"), float("inf")
    keep = torch.tensor([True, False, True, True, False, True])
    for engine in ("fast", "materialized"):
        _, grads = run(model, method("dpsgd"), x, y, g, sigma=0.0, engine=engine)
        expected = clipped_mean(loop_gradients(model, x[keep], y[keep]), 0.3, 5.0)
        torch.testing.assert_close(flat(grads), expected)


def test_an_empty_batch_releases_pure_noise(nets):
    model = nets.mlp(width=8)
    x, y, g = nets.batch((12,), 2, b=0)
    info, grads = run(model, method("dpsgd_f"), x, y, g)
    assert info.sensitivity > 0 and all(torch.isfinite(t).all() for t in grads)
    assert flat(grads).abs().sum() > 0


# ------------------------------------------------------------------ gradient formers


def test_bam_takes_a_per_sample_ascent_step(nets):
    torch.manual_seed(0)
    model = nets.mlp(width=8)
    x, y, g = nets.batch((12,), 2, b=4)
    cfg = CONFIGS.validate_python({"name": "bam", "C": 0.3, "lam": 0.5})
    bam = build_method(cfg, n_groups=2, sigma=0.0, expected_batch_size=5.0)
    _, grads = run(model, bam, x, y, g, sigma=0.0)
    params = [p.detach() for p in model.parameters()]
    rows = []
    for i in range(len(x)):
        gi = loop_gradients(model, x[i : i + 1], y[i : i + 1])[0]
        step = 0.5 * gi / gi.norm()
        shift = list(torch.split(step, [p.numel() for p in params]))
        shift = [s.reshape(p.shape) for s, p in zip(shift, params, strict=True)]
        rows.append(loop_gradients(model, x[i : i + 1], y[i : i + 1], shift)[0])
    torch.testing.assert_close(flat(grads), clipped_mean(torch.stack(rows), 0.3, 5.0))


def test_dp_sat_ascends_along_the_previous_private_gradient_and_restores_theta(nets):
    torch.manual_seed(0)
    model = nets.mlp(width=8)
    x, y, g = nets.batch((12,), 2)
    step = PrivateStep(model, method("dp_sat"), sigma=1.0, expected_batch_size=5.0)
    step(x, y, g, rng(1))  # first step: no previous release, plain DPSGD
    released = grads_of(model)
    before = [p.detach().clone() for p in model.parameters()]
    step.sigma = 0.0
    step(x, y, g, rng(2))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    shift = [0.05 * r / flat(released).norm() for r in released]
    expected = clipped_mean(loop_gradients(model, x, y, shift), 0.3, 5.0)
    torch.testing.assert_close(flat(grads_of(model)), expected)


@pytest.mark.parametrize("key", ["bam", "dp_sat"])
def test_sharpness_formers_keep_gradients_per_sample(key, nets):
    """Removing one sample leaves every other g_i, hence its norm, unchanged."""
    torch.manual_seed(0)
    model = nets.mlp(width=8)
    x, y, g = nets.batch((12,), 2)
    meth = method(key)
    step = PrivateStep(model, meth, sigma=1.0, expected_batch_size=5.0)
    step(x, y, g, rng(0))  # gives DP-SAT a released direction
    norms = step.engine.compute(model, per_sample_cross_entropy, x, y, g)
    sub = step.engine.compute(model, per_sample_cross_entropy, x[1:], y[1:], g[1:])
    torch.testing.assert_close(norms[1:], sub)


def fairlens_reference(model, x, y, g, C, gamma1, gamma2) -> torch.Tensor:
    """FairLens by brute force: per-sample gradients with graphs, R1 and R2 as written."""
    params = list(model.parameters())
    per_sample = []
    for i in range(len(x)):
        loss = per_sample_cross_entropy(model(x[i : i + 1]), y[i : i + 1]).sum()
        per_sample.append(
            torch.cat([t.flatten() for t in torch.autograd.grad(loss, params, create_graph=True)])
        )
    G = torch.stack(per_sample)
    factors = (C / G.detach().norm(dim=1)).clamp(max=1)
    in_a, in_b = g == 0, g == 1
    u = G[in_a].mean(0) - G[in_b].mean(0)
    v = (factors[:, None] * G).mean(0) - G.mean(0)
    prob = model(x).softmax(1)[:, 1]
    f_a, f_b = prob[in_a].mean(), prob[in_b].mean()
    reg = gamma1 * (u @ v).abs() + gamma2 * 0.5 * (f_a * (1 - f_a) + f_b * (1 - f_b))
    r = torch.cat([t.flatten() for t in torch.autograd.grad(reg, params)])
    return clipped_mean(G.detach() + r, C, 5.0)


def test_fairlens_regularised_gradients_on_both_paths(nets):
    torch.manual_seed(0)
    model = nets.mlp(width=8)
    x, y, g = nets.batch((12,), 2)
    expected = fairlens_reference(model, x, y, g, 0.3, 1.0, 1.0)
    for engine in ("fast", "materialized"):
        info, grads = run(model, method("fairlens"), x, y, g, sigma=0.0, engine=engine)
        torch.testing.assert_close(flat(grads), expected)


def test_fairlens_gradients_depend_on_other_samples_hence_heuristic(nets):
    torch.manual_seed(0)
    model = nets.mlp(width=8)
    x, y, g = nets.batch((12,), 2)
    meth = method("fairlens")
    assert meth.privacy_guarantee == "heuristic"
    engine = meth.per_sample_gradients(model, "auto")
    norms = engine.compute(model, per_sample_cross_entropy, x, y, g)
    sub = engine.compute(model, per_sample_cross_entropy, x[1:], y[1:], g[1:])
    assert not torch.allclose(norms[1:], sub)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("key", KEYS)
def test_steps_run_on_cuda_with_a_cuda_generator(key, nets):
    torch.manual_seed(0)
    model = nets.mlp(width=16).cuda()
    x, y, g = (t.cuda() for t in nets.batch((12,), 2))
    results = []
    for engine in ("fast", "materialized"):
        step = private_step(
            model, method(key), sigma=1.0, expected_batch_size=5.0, engine=engine
        )
        generator = torch.Generator(device="cuda").manual_seed(0)
        step(x, y, g, generator)
        results.append(flat(grads_of(model)))
    assert results[0].is_cuda and torch.isfinite(results[0]).all()
    torch.testing.assert_close(results[0], results[1])
