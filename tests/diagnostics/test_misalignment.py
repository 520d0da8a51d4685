"""HVP-based excessive-risk terms against explicit Hessians on a tiny float64 model."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from dpfair.data.dataset import Split
from dpfair.diagnostics.bias import batch_gradients
from dpfair.diagnostics.hvp import (
    FlatModel,
    hutchinson_trace,
    hvp,
    max_eigenvalue,
    mean_gradient,
    quadratic_forms,
)
from dpfair.diagnostics.misalignment import (
    direction_step,
    misalignment_report,
    noise_term,
)

LR, C0, SIGMA = 0.3, 0.5, 0.8


def ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y, reduction="none")


@pytest.fixture(scope="module")
def setup() -> tuple[nn.Module, Split]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    n = 40
    x = torch.randn(n, 3, dtype=torch.float64)
    x[:10] *= 4  # group 1: larger inputs, larger gradients
    y = torch.randint(0, 3, (n,))
    g = (torch.arange(n) < 10).long()
    return model, Split(x, y, g)


def explicit(model: nn.Module, split: Split, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """g_{D_a} and the Hessian matrix of the group's mean loss, by plain autograd."""
    fm = FlatModel(model, ce)
    x, y = split.x[split.g == group], split.y[split.g == group]

    def f(theta: torch.Tensor) -> torch.Tensor:
        return ce(functional_call(model, fm.unflatten(theta), (x,)), y).mean()

    theta = fm.theta.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(f(theta), theta)
    return grad, torch.autograd.functional.hessian(f, fm.theta)


def batch(model: nn.Module, split: Split, C: float) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.arange(0, 40, 3)
    return batch_gradients(model, ce, split.x[idx], split.y[idx], C)


@pytest.fixture(scope="module", params=[0, 1])
def group(setup, request) -> tuple:
    """The flat model, group a's rows, and its g_{D_a} and Hessian by plain autograd."""
    model, split = setup
    a = request.param
    x, y = split.x[split.g == a], split.y[split.g == a]
    return (FlatModel(model, ce), x, y, *explicit(model, split, a))


def test_gradient_hvp_quadratic_forms_match_explicit_hessian(group):
    fm, x, y, g, H = group
    v = torch.randn_like(fm.theta)
    w = torch.randn_like(fm.theta)
    assert torch.allclose(mean_gradient(fm, x, y, chunk_size=7), g, atol=1e-12)
    assert torch.allclose(hvp(fm, x, y, v, chunk_size=7), H @ v, atol=1e-12)
    q = quadratic_forms(fm, x, y, [v, w], chunk_size=4)
    assert torch.allclose(q, torch.stack([v @ H @ v, w @ H @ w]), atol=1e-12)
    lam = torch.linalg.eigvalsh(H)
    top = lam[lam.abs().argmax()]
    assert max_eigenvalue(fm, x, y, n_iter=500) == pytest.approx(float(top), rel=1e-6)


def test_hutchinson_within_three_standard_errors(group):
    fm, x, y, _, H = group
    est, se = hutchinson_trace(fm, x, y, n_probes=100, seed=3)
    assert se > 0
    assert abs(est - float(torch.trace(H))) < 3 * se


def test_report_terms_equal_explicit_formulas(setup):
    model, split = setup
    g_B, gbar_B = batch(model, split, C0)
    rep = misalignment_report(
        model, ce, split, [0, 1], gbar_B, g_B, LR, C0, SIGMA, n_probes=20, power_iters=30
    )
    assert rep["privacy"] == "non-private"
    r = gbar_B.norm() / g_B.norm()
    u = g_B.norm() * gbar_B / gbar_B.norm()  # M_B g_B
    for a in (0, 1):
        g_Da, H = explicit(model, split, a)
        mag = LR * g_Da @ ((1 - r) * g_B) + LR**2 / 2 * (r**2 - 1) * (g_B @ H @ g_B)
        dr = LR * g_Da @ (r * (g_B - u)) + LR**2 / 2 * r**2 * (u @ H @ u - g_B @ H @ g_B)
        clip = LR * g_Da @ (g_B - gbar_B) + LR**2 / 2 * (gbar_B @ H @ gbar_B - g_B @ H @ g_B)
        got = rep["groups"][a]
        assert got["R_mag"] == pytest.approx(float(mag), rel=1e-10, abs=1e-14)
        assert got["R_dir"] == pytest.approx(float(dr), rel=1e-10, abs=1e-14)
        assert got["R_clip"] == pytest.approx(float(clip), rel=1e-10, abs=1e-14)
        assert got["R_clip"] == pytest.approx(got["R_mag"] + got["R_dir"], rel=1e-10)
        assert got["R_noise"] == pytest.approx(noise_term(got["trace_H"], LR, C0, SIGMA))
        # Eq. 8: the first-order part of R^dir is η ‖g_{D_a}‖ E[‖ḡ_B‖ (cos θ − cos θ̄)].
        pair = next(p for p in rep["pairs"] if p["a"] == a)
        assert got["R_dir_inner_product_term"] == pytest.approx(
            LR * got["norm_g_D"] * pair["X_a"], rel=1e-10
        )
    for p in rep["pairs"]:
        na, nb = rep["groups"][p["a"]]["norm_g_D"], rep["groups"][p["b"]]["norm_g_D"]
        sq = float(gbar_B.norm() ** 2)
        assert p["prop3_rhs"] == pytest.approx(nb / na * p["X_b"] + sq / na, rel=1e-10)
        assert p["prop3_holds"] == (p["prop3_lhs"] > p["prop3_rhs"])
        assert p["R_dir_gap_lower_bound"] == pytest.approx(
            LR * (na * p["X_a"] - nb * p["X_b"] - sq), rel=1e-10
        )
        assert p["tran_R_clip_gap_lower_bound"] <= 0
    assert isinstance(rep["lr_assumption_holds"], bool)


def test_two_batches_average_the_expectations(setup):
    model, split = setup
    g1, c1 = batch(model, split, C0)
    g2, c2 = batch_gradients(model, ce, split.x[1:30:2], split.y[1:30:2], C0)
    kw = {"n_probes": 2, "power_iters": 0}
    both = misalignment_report(
        model, ce, split, [0, 1], torch.stack([c1, c2]), torch.stack([g1, g2]), LR, C0, SIGMA,
        **kw,
    )
    one = [misalignment_report(model, ce, split, [0, 1], c, g, LR, C0, SIGMA, **kw)
           for g, c in ((g1, c1), (g2, c2))]
    for a in (0, 1):
        for key in ("R_mag", "R_dir", "R_clip"):
            mean = (one[0]["groups"][a][key] + one[1]["groups"][a][key]) / 2
            assert both["groups"][a][key] == pytest.approx(mean, rel=1e-10)


def test_no_clipping_gives_no_direction_or_magnitude_error(setup):
    model, split = setup
    g_B, gbar_B = batch(model, split, 1e9)
    assert torch.equal(g_B, gbar_B)
    rep = misalignment_report(model, ce, split, [0, 1], gbar_B, g_B, LR, C0, SIGMA,
                              n_probes=2, power_iters=0)
    for a in (0, 1):
        assert rep["groups"][a]["R_dir"] == pytest.approx(0, abs=1e-15)
        assert rep["groups"][a]["R_mag"] == pytest.approx(0, abs=1e-15)
        assert rep["groups"][a]["R_clip"] == pytest.approx(0, abs=1e-15)


def test_exact_scale_gives_no_magnitude_error(setup):
    model, split = setup
    g_B, gbar_B = batch(model, split, 0.05)
    rotated = direction_step(g_B, gbar_B)  # clipped direction, unclipped norm
    rep = misalignment_report(model, ce, split, [0, 1], rotated, g_B, LR, C0, SIGMA,
                              n_probes=2, power_iters=0)
    for a in (0, 1):
        assert rep["groups"][a]["R_mag"] == pytest.approx(0, abs=1e-14)
        assert abs(rep["groups"][a]["R_dir"]) > 1e-6


def test_bad_inputs_are_refused(setup):
    model, split = setup
    g_B, gbar_B = batch(model, split, C0)
    with pytest.raises(ValueError, match="shape"):
        misalignment_report(model, ce, split, [0], gbar_B[:-1], g_B, LR, C0, SIGMA)
    with pytest.raises(ValueError, match="zero batch gradient"):
        misalignment_report(model, ce, split, [0], torch.zeros_like(g_B), g_B, LR, C0, SIGMA)
    with pytest.raises(ValueError, match="no samples"):
        misalignment_report(model, ce, split, [7], gbar_B, g_B, LR, C0, SIGMA, n_probes=2)
