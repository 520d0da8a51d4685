"""``GhostClipping(keep_graph=True)``: the norms, clipped sum and ``<g_i, r>`` are those of the
default engine, and the graphs it hands over (:class:`~dpfair.engine.gradients.KeptGraph`) give
the losses' first and second derivatives, against ``torch.func`` in float64."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, jvp, vmap

from dpfair.engine.gradients import GhostClipping, KeptGraph, Materialized, modifies_in_place
from dpfair.engine.step import per_sample_cross_entropy
from tests.engine.conftest import ConvNorms, Sequences

DTYPE = torch.float64
B = 10


class WithFallback(nn.Module):
    """PReLU has no fast rule: materialised by vmap, and not among the kept calls."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.p, self.b = nn.Linear(5, 7), nn.PReLU(), nn.Linear(7, 2)

    def forward(self, x):
        return self.b(torch.tanh(self.p(self.a(x))))


def mlp() -> nn.Module:
    """Tanh, and a ReLU in place: the engine clones layer outputs."""
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(inplace=True),
                         nn.Linear(16, 2))


def case(name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    models = {"mlp": mlp, "convs": lambda: ConvNorms(3, torch.tanh), "shared": lambda: Sequences(8),
              "fallback": WithFallback}
    shapes = {"convs": (2, 6, 6), "shared": (3, 5)}
    x = torch.randn(B, *shapes.get(name, (5,)), generator=gen, dtype=DTYPE)
    n_classes = 3 if name == "convs" else 2
    return models[name]().to(DTYPE), x, torch.randint(0, n_classes, (B,), generator=gen)


def engine(model: nn.Module, keep_graph: bool, **kwargs) -> GhostClipping:
    return GhostClipping(clone_outputs=modifies_in_place(model), keep_graph=keep_graph, **kwargs)


NAMES = ["mlp", "convs", "shared", "fallback"]


def same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal to rounding: a backward with ``create_graph`` may take a layer's differentiable
    formula instead of its fused kernel (GroupNorm's), so an output gradient may differ in
    its last bit (observed: 3.8e-16 relative, the first convolution's sum, in float64)."""
    assert not got.requires_grad
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_norms_clipped_sum_and_dots_are_those_without_the_graph(name):
    model, x, y = case(name)
    off, on = engine(model, False), engine(model, True)
    norms = off.compute(model, per_sample_cross_entropy, x, y)
    same(on.compute(model, per_sample_cross_entropy, x, y), norms)
    assert torch.equal(on.losses, off.losses) and not on.losses.requires_grad
    weights = (0.5 / norms).clamp(max=1)
    for got, want in zip(on.weighted_grad(weights), off.weighted_grad(weights), strict=True):
        same(got, want)
    r = [torch.randn_like(p) for p in model.parameters() if p.requires_grad]
    same(on.per_sample_dots(r), off.per_sample_dots(r))
    assert off.take_graph() is None  # off: nothing kept


def _tangent(module: nn.Module, a: torch.Tensor, v: dict[nn.Parameter, torch.Tensor]):
    """``f(a; V)``: the layer (linear in its parameters) at its parts of ``v`` (zero for a
    frozen parameter): ``<d_i, f(a_i; V)> = <grad l_i, V>`` for the layer's parameters."""
    own = {n: v.get(p, torch.zeros_like(p)) for n, p in module.named_parameters(recurse=False)}
    return functional_call(module, own, (a,))


@pytest.mark.parametrize("name", NAMES)
def test_the_kept_graph_gives_first_and_second_derivatives(name):
    """From the kept graph: ``sum_i w_i grad l_i`` through the losses, and the Hessian-vector
    product ``sum_i w_i H_i V`` as the gradient of ``sum_i w_i <d_i, f(a_i; V)>`` over the kept
    calls (which needs each call's input and output gradient with their graphs), against
    ``torch.func`` (vmap of grad; jvp of grad)."""
    model, x, y = case(name)
    eng = engine(model, True)
    eng.compute(model, per_sample_cross_entropy, x, y)
    kept = eng.take_graph()
    assert isinstance(kept, KeptGraph) and eng.take_graph() is None  # handed over once
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    frozen = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
    w = torch.rand(B, generator=torch.Generator().manual_seed(2), dtype=DTYPE)
    gen = torch.Generator().manual_seed(3)
    # a fallback layer is no kept call: its part of V is zero, so s is all of <g_i, V>
    slow = {id(p) for m in model.modules() if isinstance(m, nn.PReLU) for p in m.parameters()}
    v = [torch.randn(p.shape, generator=gen, dtype=DTYPE) * (id(p) not in slow) for p in params]

    def loss(theta, xi, yi):
        out = functional_call(model, {**dict(zip(names, theta, strict=True)), **frozen},
                              (xi.unsqueeze(0),))
        return per_sample_cross_entropy(out, yi.unsqueeze(0)).sum()

    def weighted(theta):
        return (w * vmap(loss, in_dims=(None, 0, 0))(theta, x, y)).sum()

    theta = tuple(p.detach() for p in params)
    torch.testing.assert_close(kept.outputs, model(x), rtol=0, atol=1e-15)
    torch.testing.assert_close(
        kept.losses.detach(), vmap(loss, in_dims=(None, 0, 0))(theta, x, y), rtol=0, atol=1e-15)
    first = torch.autograd.grad(kept.losses, params, w, retain_graph=True)
    for got, want in zip(first, grad(weighted)(theta), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)

    # only the fast layers, each with a gradient formed with its graph
    assert all(not isinstance(m, nn.PReLU) for m, *_ in kept.calls)
    assert all(d is not None and d.requires_grad for *_, d in kept.calls)
    if name == "shared":
        assert sum(m is model.b for m, *_ in kept.calls) == 2  # one call each
    by_param = dict(zip(params, v, strict=True))
    s = sum(
        torch.vdot(d.reshape(-1), (w.view(-1, *[1] * (d.dim() - 1)) * _tangent(m, a, by_param))
                   .reshape(-1))
        for m, a, _, d in kept.calls if d is not None
    )
    hvp = torch.autograd.grad(s, params, allow_unused=True)
    _, want = jvp(grad(weighted), (theta,), (tuple(v),))
    for got, expected in zip(hvp, want, strict=True):
        assert expected.abs().max() > 0
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_nothing_is_kept_off_the_factor_path():
    """The low-memory path and a model served whole by the materialised engine keep no graph
    (their norms unchanged); ``release`` drops a graph not taken."""
    model, x, y = case("mlp")
    low = GhostClipping(low_memory=True, keep_graph=True)
    plain_model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 2)).to(DTYPE)
    norms = low.compute(plain_model, per_sample_cross_entropy, x, y)
    assert low.take_graph() is None
    torch.testing.assert_close(
        norms, Materialized().compute(plain_model, per_sample_cross_entropy, x, y))

    class Unbatched(nn.Module):  # a layer without the batch axis: the whole model materialised
        # (named apart from other tests' such layers: the engine logs each message once)
        def __init__(self) -> None:
            super().__init__()
            self.shift, self.fc = nn.Linear(5, 5), nn.Linear(5, 2)

        def forward(self, x):
            return self.fc(x + self.shift(torch.ones(5, dtype=x.dtype)))

    whole = Unbatched().to(DTYPE)
    eng = GhostClipping(keep_graph=True)
    eng.compute(whole, per_sample_cross_entropy, x, y)
    assert eng.take_graph() is None

    eng = engine(model, True)
    eng.compute(model, per_sample_cross_entropy, x, y)
    eng.release()
    assert eng.take_graph() is None
