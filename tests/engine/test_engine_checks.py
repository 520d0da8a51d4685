"""The fast path's cheap checks give exactly what the per-layer checks give.

``model_layer_grads`` checks the factors of all dense layers for over- and underflow at once
(``all_normal``) and rebalances per layer only when that check fails; ``GhostClipping`` keeps its
layer plan and trainable parameters across steps. Both must change nothing: same norms and the
same weighted sums, bit for bit, on finite, huge, tiny, zero, NaN and infinite factors.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpfair.engine.gradients import GhostClipping, Materialized
from dpfair.engine.layer_grads import all_normal, layer_grads, model_layer_grads
from dpfair.engine.step import per_sample_cross_entropy

NAN, INF = float("nan"), float("inf")


def _clamp_check(t: torch.Tensor) -> bool:
    """The definition: every entry is unchanged by clamping to ``[tiny, max]``."""
    info = torch.finfo(t.dtype)
    return bool((t.clamp(info.tiny, info.max) == t).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_all_normal_is_the_clamp_check(dtype):
    info = torch.finfo(dtype)
    specials = [0.0, info.tiny / 4, info.tiny, 1.0, info.max, INF, NAN]
    for value in specials:
        t = torch.tensor([1.0, 2.0, value, 3.0], dtype=dtype)
        assert all_normal([t]) == _clamp_check(t), value
        # spread over several tensors, the one odd entry in the last
        parts = [torch.ones(3, dtype=dtype), torch.tensor([value], dtype=dtype)]
        assert all_normal(parts) == _clamp_check(torch.cat(parts)), value
    assert all_normal([torch.empty(0, dtype=dtype)])


def test_all_normal_takes_each_dtype_in_its_own_range():
    subnormal32 = torch.tensor([1e-40], dtype=torch.float32)  # a normal number in float64
    assert not all_normal([torch.ones(2, dtype=torch.float64), subnormal32])
    assert all_normal([torch.ones(2, dtype=torch.float64), torch.ones(2)])


Calls = dict[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]


def _calls(kind: str, dtype: torch.dtype) -> Calls:
    """Captured (input, output gradient) of three dense layers (one without bias, one with a
    frozen weight) and one Linear on a sequence, with one sample's factors made ``kind``."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(3)
    b = 6
    layers = [nn.Linear(5, 4), nn.Linear(4, 7, bias=False), nn.Linear(7, 3), nn.Linear(3, 2)]
    layers[2].weight.requires_grad_(False)
    per_layer = {}
    for i, m in enumerate(layers):
        m.to(dtype)
        shape = (b, 4, m.in_features) if i == 3 else (b, m.in_features)
        a = torch.randn(*shape, generator=gen, dtype=dtype)
        d = torch.randn(*shape[:-1], m.out_features, generator=gen, dtype=dtype)
        per_layer[m] = [(a, d)]
    a, d = per_layer[layers[1]][0]
    value = {"huge": 1e30, "tiny": 1e-30, "zero": 0.0, "nan": NAN, "inf": INF}.get(kind)
    if value is not None:
        a[2] = value  # an input factor of the middle dense layer
        if kind == "huge":
            d[2] = 1e-25  # |g|^2 in range, its factors' squares not (float32)
        if kind == "zero":
            d[4] = 0.0
    return per_layer


@pytest.mark.parametrize("kind", ["random", "huge", "tiny", "zero", "nan", "inf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_check_for_all_dense_layers_is_the_per_layer_check(kind, dtype):
    per_layer = _calls(kind, dtype)
    fast = model_layer_grads(per_layer)
    slow = [layer_grads(m, c) for m, c in per_layer.items()]
    assert [type(f) for f in fast] == [type(s) for s in slow]
    for f, s in zip(fast, slow, strict=True):
        torch.testing.assert_close(f.sq_norms(), s.sq_norms(), rtol=0, atol=0, equal_nan=True)
    params = [p for m in per_layer for p in m.parameters() if p.requires_grad]
    weights = torch.rand(6, generator=torch.Generator().manual_seed(5), dtype=dtype)
    weights[2] = 0.0  # the odd sample is dropped, as the rule drops a non-finite one
    keep = None if kind == "random" else weights != 0
    sums = []
    for layers in (fast, slow):
        into = {p: torch.zeros_like(p) for p in params}
        for layer in layers:
            layer.add_weighted(weights, keep, into)
        sums.append(into)
    for p in params:
        assert torch.isfinite(sums[0][p]).all()
        torch.testing.assert_close(sums[0][p], sums[1][p], rtol=0, atol=0)


def test_the_plan_follows_requires_grad_between_steps():
    """A layer frozen after the first step: its parameters leave the weighted sum, as a fresh
    engine (and the materialised path) gives."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    engine, weights = GhostClipping(), torch.rand(5, dtype=torch.float64)
    engine.compute(model, per_sample_cross_entropy, x, y)
    assert len(engine.weighted_grad(weights)) == 4
    model[0].weight.requires_grad_(False)
    ref = Materialized()
    norms = engine.compute(model, per_sample_cross_entropy, x, y)
    torch.testing.assert_close(norms, ref.compute(model, per_sample_cross_entropy, x, y))
    got, want = engine.weighted_grad(weights), ref.weighted_grad(weights)
    assert len(got) == len(want) == 3
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
