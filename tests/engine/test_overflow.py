"""Overflowing inputs (issue #14, item 7): the fast and materialised paths drop the same samples.

A sample whose squared gradient norm overflows the model's dtype has an infinite norm on both
paths, hence weight 0; every other sample, however large its input, has the same norm and adds
the same clipped gradient on both paths. Each batch holds an ordinary sample, samples scaled past
the square root of the dtype's range (``1e30`` and ``1e20`` in float32, ``1e300`` and ``1e160``
in float64), and samples with a NaN and an infinite input.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import TypeAdapter
from torch import nn

from dpfair.engine.gradients import GhostClipping, Materialized, make_engine
from dpfair.engine.step import PrivateStep, per_sample_cross_entropy
from dpfair.methods import MethodConfig, build_method
from dpfair.methods.adaptive import C_MIN

TOL = 1e-5
SCALES = {torch.float32: (1e30, 1e20), torch.float64: (1e300, 1e160)}
DTYPES = pytest.mark.parametrize("dtype", list(SCALES), ids=["float32", "float64"])
EXPECTED_BATCH = 5.0


class Factored(nn.Module):
    """The fast path's factored layers: a convolution with few positions and a Linear on a
    sequence (both by the Gram trick), with GroupNorm and LayerNorm; input ``(2, 4, 4)``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 16, 3)  # 4 positions: 4 (18 + 16) < 18 * 16
        self.gn = nn.GroupNorm(4, 16)
        self.seq = nn.Linear(16, 16)  # on 4 positions: 4 (16 + 16) < 16 * 16
        self.ln = nn.LayerNorm(16)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gn(torch.tanh(self.conv(x))).flatten(2).transpose(1, 2)
        return self.head(torch.tanh(self.ln(self.seq(h))).mean(1))


@pytest.fixture(params=["mlp", "esipova_cnn", "zhao_cnn", "factored"])
def family(request, nets):
    """``(make_model, input shape, classes)`` for each model family of tests/privacy."""
    if request.param == "factored":
        return Factored, (2, 4, 4), 2
    return nets.MODELS[request.param]


def overflow_batch(family, dtype: torch.dtype, nets):
    """A seeded model in ``dtype`` and a batch of 6: rows 1, 2 scaled, 3 NaN, 4 inf."""
    make, shape, n_classes = family
    torch.manual_seed(0)
    model = make().to(dtype)
    x, y, g = nets.batch(shape, n_classes, b=6)
    x = x.to(dtype)
    big, bigger = SCALES[dtype]
    x[1] *= big
    x[2] *= bigger
    x[3].view(-1)[0] = math.nan
    x[4].view(-1)[0] = math.inf
    return model, x, y, g


def dpsgd(C: float = 0.3):
    cfg = TypeAdapter(MethodConfig).validate_python({"name": "dpsgd", "C": C})
    return build_method(cfg, n_groups=2, sigma=0.0, expected_batch_size=EXPECTED_BATCH)


@DTYPES
def test_paths_drop_the_same_samples_and_agree_on_the_rest(family, dtype, nets):
    model, x, y, g = overflow_batch(family, dtype, nets)
    fast, ref = make_engine(model, "fast"), Materialized()
    assert isinstance(fast, GhostClipping)
    fast_norms = fast.compute(model, per_sample_cross_entropy, x, y)
    ref_norms = ref.compute(model, per_sample_cross_entropy, x, y)
    kept = torch.isfinite(ref_norms)
    assert torch.equal(torch.isfinite(fast_norms), kept)
    assert kept[[0, 5]].all() and not kept[[3, 4]].any()
    torch.testing.assert_close(fast_norms[kept], ref_norms[kept], atol=TOL, rtol=TOL)
    rule = dpsgd()
    fast_w, ref_w = rule.rule(fast_norms, g).weights, rule.rule(ref_norms, g).weights
    assert torch.equal(fast_w == 0, ~kept) and torch.equal(ref_w == 0, ~kept)
    for a, b in zip(fast.weighted_grad(fast_w), ref.weighted_grad(ref_w), strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=TOL, rtol=TOL)


@DTYPES
@pytest.mark.parametrize("engine", ["fast", "materialized"])
def test_removing_any_sample_moves_the_update_by_at_most_s(family, dtype, engine, nets):
    model, x, y, g = overflow_batch(family, dtype, nets)

    def update(keep: torch.Tensor) -> torch.Tensor:
        step = PrivateStep(
            model, dpsgd(), sigma=0.0, expected_batch_size=EXPECTED_BATCH, engine=engine
        )
        info = step(x[keep], y[keep], g[keep], torch.Generator().manual_seed(0))
        assert info.sensitivity == pytest.approx(0.3)
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert torch.isfinite(grads).all()
        return grads.double() * EXPECTED_BATCH

    full = update(torch.ones(len(x), dtype=torch.bool))
    for j in range(len(x)):
        moved = (full - update(torch.arange(len(x)) != j)).norm()
        assert moved <= 0.3 * (1 + TOL)


def test_a_zero_gradient_on_a_huge_input_adds_nothing_at_the_largest_weight(nets):
    """A rule's weight is at most ``s / C`` (``2^63 s`` at adaptive clipping's floor): on a zero
    gradient it must not meet a huge input as ``inf * 0`` in the fast path's weighted sum."""
    torch.manual_seed(0)
    model = nets.mlp().to(torch.float32)
    x, y, _ = nets.batch((12,), 2, b=4)
    x = x.to(torch.float32)
    x[1] *= 1e30
    weights = torch.full((4,), 10.0 / C_MIN)

    def zero_loss(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 0.0 * outputs.sum(1)

    for engine in (make_engine(model, "fast"), Materialized()):
        assert (engine.compute(model, zero_loss, x, y) == 0).all()
        assert all((t == 0).all() for t in engine.weighted_grad(weights))
