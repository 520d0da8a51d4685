"""The per-layer cost model (the mixed ghost clipping of Bu, Wang, Zha & Karypis, ICML 2023,
Sec. 3) and the grouped convolution norms, each route against the materialised reference
(float64): a layer where ``T^2`` far exceeds ``p d`` materialises its per-sample gradients,
one where ``p d`` far exceeds ``T^2`` takes the ``T x T`` Gram (ghost) route, and either way
the norms and the clipped sum are the reference's; convolutions of one shape form their norms
together, and a budget too small for two of them keeps them apart."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpfair.engine import conv_grads as conv_grads_module
from dpfair.engine.conv_grads import ConvGrads
from dpfair.engine.factors import engine_memory
from dpfair.engine.gradients import GhostClipping, Materialized
from dpfair.engine.layer_grads import SequenceGrads
from dpfair.engine.step import per_sample_cross_entropy

TOL = 1e-12
DTYPE = torch.float64


class Tokens(nn.Module):
    """One Linear on ``(B, T, d_in)`` positions, mean-pooled, then a head."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.seq, self.head = nn.Linear(d_in, d_out), nn.Linear(d_out, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.seq(x)).mean(1))


class Convs(nn.Module):
    """``depth`` 3x3 'same' convolutions of one shape (``c`` channels), then a head."""

    def __init__(self, c: int, size: int, depth: int = 1, bias: bool = True) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(c, c, 3, padding=1, bias=bias) for _ in range(depth))
        self.head = nn.Linear(c * size * size, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = torch.tanh(conv(x))
        return self.head(x.flatten(1))


def _agree(engine: GhostClipping, model: nn.Module, x: torch.Tensor) -> None:
    """Norms and ``sum_i w_i g_i`` as the reference's."""
    y = torch.arange(len(x)) % 3
    ref = Materialized()
    want = ref.compute(model, per_sample_cross_entropy, x, y)
    torch.testing.assert_close(engine.compute(model, per_sample_cross_entropy, x, y), want,
                               atol=TOL, rtol=TOL)
    weights = torch.rand(len(x), generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    for got, ref_sum in zip(engine.weighted_grad(weights), ref.weighted_grad(weights), strict=True):
        torch.testing.assert_close(got, ref_sum, atol=TOL, rtol=TOL)


def _layers(engine: GhostClipping, kind: type) -> list:
    return [layer for layer in engine._layers if isinstance(layer, kind)]


@pytest.mark.parametrize(("t", "width", "gram"), [(256, 2, False), (2, 64, True)])
def test_a_sequence_layer_takes_the_cheaper_route_and_the_exact_sum(t, width, gram):
    """``T = 256`` positions of a 2 x 2 Linear (``T^2 = 65536 >> p d = 4``): per-sample
    gradients materialised; ``T = 2`` of a 64 x 64 one (``T^2 = 4 << p d = 4096``): Gram."""
    torch.manual_seed(0)
    model = Tokens(width, width).to(DTYPE)
    x = torch.randn(5, t, width, dtype=DTYPE)
    engine = GhostClipping()
    _agree(engine, model, x)
    (layer,) = _layers(engine, SequenceGrads)
    assert layer.gram is gram


@pytest.mark.parametrize(("c", "size", "routes"), [(1, 24, {"taps", "im2col"}), (48, 2, {"gram"})])
def test_a_convolution_takes_the_cheaper_route_and_the_exact_sum(c, size, routes):
    """A 1-channel 24 x 24 convolution (``T^2 = 331776 >> p d = 9``) materialises its
    per-sample kernels and keeps them for the weighted sum (``sum_i w_i G_i``, no
    ``conv2d_weight``); a 48-channel 2 x 2 one (``T^2 = 16 << p d = 20736``) takes the Gram
    route over its patches and sums by the contraction of its factors."""
    torch.manual_seed(0)
    model = Convs(c, size).to(DTYPE)
    engine = GhostClipping()
    _agree(engine, model, torch.randn(5, c, size, size, dtype=DTYPE))
    (layer,) = _layers(engine, ConvGrads)
    assert layer.route in routes
    assert (layer.grads is not None) is ("gram" not in routes)


def test_kernels_beyond_the_budget_are_not_kept():
    """With no room beside the output gradients, an instantiated convolution keeps no
    kernels and sums by ``conv2d_weight``, with the same result."""
    torch.manual_seed(0)
    model = Convs(1, 24).to(DTYPE)
    x = torch.randn(5, 1, 24, 24, dtype=DTYPE)
    engine = GhostClipping()
    engine.compute(model, per_sample_cross_entropy, x, torch.arange(5) % 3)
    held = int(engine._held_per_input * x.numel())  # the output gradients' bytes
    with engine_memory(held):
        engine = GhostClipping(low_memory=False)
        _agree(engine, model, x)
    (layer,) = _layers(engine, ConvGrads)
    assert layer.route != "gram" and layer.grads is None


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("low_memory", [False, True])
def test_convolutions_of_one_shape_form_their_norms_together(bias, low_memory, monkeypatch):
    """Three convolutions of one shape: one grouped pass of tap matmuls for all three, on the
    factor path and inside the low-memory path's backward, with the reference's norms and sum."""
    real, groups = conv_grads_module.grouped_norms, []

    def spy(layers: list[ConvGrads]):
        groups.append(len(layers))
        return real(layers)

    monkeypatch.setattr("dpfair.engine.norm_sum.grouped_norms", spy)
    monkeypatch.setattr(conv_grads_module, "cheapest", lambda *args: "taps")
    torch.manual_seed(0)
    model = Convs(4, 6, depth=3, bias=bias).to(DTYPE)
    _agree(GhostClipping(low_memory=low_memory), model, torch.randn(5, 4, 6, 6, dtype=DTYPE))
    assert groups == [3]


def test_a_budget_for_one_convolution_keeps_them_apart(monkeypatch):
    """Where two convolutions' intermediates exceed the budget together, each forms its own
    norms (no group), with the same result."""
    real, groups = conv_grads_module.grouped_norms, []
    monkeypatch.setattr("dpfair.engine.norm_sum.grouped_norms",
                        lambda layers: groups.append(len(layers)) or real(layers))
    monkeypatch.setattr(conv_grads_module, "cheapest", lambda *args: "taps")
    torch.manual_seed(0)
    model = Convs(4, 6, depth=3).to(DTYPE)
    x = torch.randn(5, 4, 6, 6, dtype=DTYPE)
    probe = GhostClipping()
    probe.compute(model, per_sample_cross_entropy, x, torch.arange(5) % 3)
    one = _layers(probe, ConvGrads)[0].held_bytes()
    assert groups == [3]  # the default budget holds all three
    groups.clear()
    with engine_memory(one + one // 2):  # room for one convolution's intermediates, not two
        _agree(GhostClipping(low_memory=False), model, x)
    assert groups == []
