"""Adaptive clipping whose bound collapses or explodes (issue #14, item 7).

Zhao Alg. 2's update ``C_{t+1} = max(C_LB, C_t exp(eta_C (b~ - gamma)))`` is floored at
``C_MIN``: the bound stays positive and movable, the weights stay finite and the sensitivity
stays ``s``, in float32 (where ``1 / C_t`` overflowed below about ``3e-39``) as in float64.
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from pydantic import TypeAdapter
from torch import nn

from dpfair.engine.step import PrivateStep
from dpfair.methods import Adaptive, MethodConfig, build_method
from dpfair.methods.adaptive import C_MIN

EXPECTED_BATCH = 5.0
#: every adaptive preset with gamma at the top: once no norm exceeds ``tau C_t`` (here all
#: norms are 0), ``b~ - gamma`` is about -1 and ``C_t`` falls by ``e^-5`` a step (``e^-1`` for
#: Esipova's, whose step size is 1 and ``gamma = eta_Z``).
COLLAPSING = {
    "adaptive": {"eta_C": 5.0, "gamma": 1.0, "sigma_count": 0.1},
    "adaclip": {"eta_C": 5.0, "gamma": 1.0, "sigma_count": 0.1},
    "dpsgd_global_adapt": {"C0": 2.0, "eta_Z": 1.0, "sigma2": 0.1},
    "bounded_adaptive": {"C_LB": 1e-300, "eta_C": 5.0, "gamma": 1.0, "sigma_count": 0.1},
}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])


def build(name: str, **overrides: float) -> Adaptive:
    cfg = TypeAdapter(MethodConfig).validate_python({"name": name, **overrides})
    method = build_method(cfg, n_groups=2, sigma=1.0, expected_batch_size=EXPECTED_BATCH)
    assert isinstance(method, Adaptive)
    return method


def rng(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@DTYPES
@pytest.mark.parametrize("name", sorted(COLLAPSING))
def test_a_collapsing_bound_stops_at_c_min_and_grows_back(name, dtype):
    method = build(name, **COLLAPSING[name])
    floor = max(method.C_LB, C_MIN)
    zeros, groups, gen = torch.zeros(5, dtype=dtype), torch.zeros(5, dtype=torch.long), rng()
    bounds = []
    for _ in range(200):  # far past float32's underflow (and float64's) without the floor
        rule = method.step_rule(zeros, groups, gen)
        assert torch.isfinite(rule.weights).all() and (rule.weights > 0).all()
        assert rule.sensitivity == method.s
        bounds.append(method.C)
    assert min(bounds) > 0 and method.C == floor == min(bounds)
    norms = torch.tensor([0.0, 1e-30, C_MIN, 1e-10, 1.0], dtype=dtype)
    rule = method.rule(norms, groups)
    assert (rule.weights * norms <= method.s * (1 + 1e-6)).all()
    method.gamma = 0.0  # every norm above tau C_t: b~ is about 1, the bound grows again
    method.step_rule(torch.ones(5, dtype=dtype), groups, gen)
    assert method.C > floor


@pytest.mark.parametrize("name", sorted(COLLAPSING))
def test_huge_count_noise_keeps_the_step_running(name, nets):
    """Count noise of std 1e6 throws ``C_t`` to its floor and to the largest float."""
    noise = {"dpsgd_global_adapt": {"sigma2": 1e6}}.get(name, {"sigma_count": 1e6})
    method = build(name, **{**COLLAPSING[name], **noise})
    torch.manual_seed(0)
    model = nets.mlp(width=16).to(torch.float32)
    x, y, g = nets.batch((12,), 2, b=6)
    step = PrivateStep(model, method, sigma=1.0, expected_batch_size=EXPECTED_BATCH)
    bounds, gen = [], rng(1)
    for _ in range(40):
        info = step(x.to(torch.float32), y, g, gen)
        assert info.sensitivity == method.s
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())
        bounds.append(method.C)
    assert min(bounds) == max(method.C_LB, C_MIN) and max(bounds) == sys.float_info.max


@DTYPES
@pytest.mark.parametrize("name", sorted(COLLAPSING))
def test_at_the_floor_removing_any_sample_moves_the_update_by_at_most_s(name, dtype):
    """Samples with gradients far below the floor (a float32 squared norm of 0: weight
    ``s / C_MIN``), near it and above it."""
    method = build(name, **COLLAPSING[name])
    method.C = max(method.C_LB, C_MIN)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(12, 16, bias=False), nn.Tanh(), nn.Linear(16, 2, bias=False)
    ).to(dtype)
    x, y = torch.randn(6, 12, generator=rng(), dtype=dtype), torch.tensor([0, 1, 0, 1, 0, 1])
    x[1] *= 1e-30  # |g_i| about 1e-30
    x[2] *= 1e-10  # |g_i| about 1e-20
    x[3] *= 1e-8  # |g_i| about 1e-16

    def update(keep: torch.Tensor) -> torch.Tensor:
        step = PrivateStep(model, copy.deepcopy(method), sigma=0.0, expected_batch_size=1.0)
        step(x[keep], y[keep], torch.zeros(int(keep.sum()), dtype=torch.long), rng())
        return torch.cat([p.grad.flatten().double() for p in model.parameters()])

    full = update(torch.ones(len(x), dtype=torch.bool))
    assert torch.isfinite(full).all()
    for j in range(len(x)):
        moved = (full - update(torch.arange(len(x)) != j)).norm()
        assert moved <= method.s * (1 + 1e-5)


def test_dpsgd_global_adapt_names_eta_z_when_it_is_out_of_range():
    from pydantic import ValidationError

    from dpfair.methods import DpsgdGlobalAdaptConfig

    with pytest.raises(ValidationError, match="eta_Z"):
        DpsgdGlobalAdaptConfig(eta_Z=1.5)
