"""FairLens's update against its equations written out, on every route its regulariser's
Hessian-vector products take (:mod:`dpfair.engine.regularised`), and its privacy accounting."""

from __future__ import annotations

import copy

import pytest
import torch
from pydantic import TypeAdapter
from torch import nn

from dpfair.engine.gradients import GhostClipping, Materialized, modifies_in_place
from dpfair.engine.regularised import RegularisedGradients, _gram_is_cheaper
from dpfair.engine.step import PrivateStep, per_sample_cross_entropy
from dpfair.methods import MethodConfig, build_method
from tests.engine.conftest import ConvNorms, Sequences

DTYPE = torch.float64
CONFIGS = TypeAdapter(MethodConfig)
B, C, EXPECTED = 12, 0.3, 5.0


def fairlens(gamma1: float = 1.0, gamma2: float = 0.7):
    cfg = CONFIGS.validate_python({"name": "fairlens", "C": C, "gamma1": gamma1, "gamma2": gamma2})
    return build_method(cfg, n_groups=2, sigma=1.0, expected_batch_size=EXPECTED)


def bce(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.binary_cross_entropy_with_logits(
        outputs.reshape(-1), y.to(outputs.dtype), reduction="none"
    )


def flat(params: list[torch.Tensor], grads: tuple) -> torch.Tensor:
    """One vector of ``grads`` (zero where a parameter has none)."""
    pairs = zip(params, grads, strict=True)
    return torch.cat([(torch.zeros_like(p) if t is None else t).flatten() for p, t in pairs])


def reference(model, loss_fn, x, y, g, gamma1: float, gamma2: float) -> torch.Tensor:
    """The clipped sum of ``g_i + r`` divided by the expected batch size, from the equations:
    per-sample gradients one sample at a time (with graphs), ``R1 = |<u, v>|`` with
    ``u = g_{B_a} - g_{B_b}``, ``v = gbar_B - g_B`` (clip factors fixed), ``R2`` from the group
    mean probabilities, ``r = grad(gamma1 R1 + gamma2 R2)`` over the finite samples; a sample
    with a non-finite gradient gets weight 0."""
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for i in range(len(x)):
        loss = loss_fn(model(x[i : i + 1]), y[i : i + 1]).sum()
        grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
        rows.append(flat(params, grads))
    every = torch.stack([row.detach() for row in rows])
    keep = torch.isfinite(every).all(1)
    # no graph through the others
    G = torch.stack([row for row, k in zip(rows, keep, strict=True) if k])
    kx, kg = x[keep], g[keep]
    out = model(kx)
    prob = out.softmax(1)[:, 1] if out.shape[-1] == 2 else out.reshape(-1).sigmoid()
    present = [k for k in (0, 1) if (kg == k).any()]  # an empty group adds nothing
    reg = gamma2 * 0.5 * sum(prob[kg == k].mean() * (1 - prob[kg == k].mean()) for k in present)
    if len(present) == 2:  # R1 compares the two groups
        factors = (C / G.detach().norm(dim=1)).clamp(max=1)
        u = G[kg == 0].mean(0) - G[kg == 1].mean(0)
        v = (factors[:, None] * G).mean(0) - G.mean(0)
        reg = reg + gamma1 * (u @ v).abs()
    r = flat(params, torch.autograd.grad(reg, params, allow_unused=True))
    shifted = every[keep] + r
    weights = (C / shifted.norm(dim=1)).clamp(max=1)
    return (weights[:, None] * shifted).sum(0) / EXPECTED


def step_update(model, loss_fn, x, y, g, engine: str, gamma1=1.0, gamma2=0.7) -> torch.Tensor:
    model = copy.deepcopy(model)
    step = PrivateStep(model, fairlens(gamma1, gamma2), sigma=0.0, expected_batch_size=EXPECTED,
                       engine=engine, loss_fn=loss_fn)
    step(x, y, g, torch.Generator().manual_seed(0))
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])


def mlp(width: int, d_in: int = 5) -> nn.Sequential:
    """Wide enough at ``B = 12`` for the Gram route on every layer but the head."""
    return nn.Sequential(
        nn.Linear(d_in, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
        nn.Linear(width, width, bias=False), nn.ReLU(inplace=True), nn.Linear(width, 2),
    )


class Tokens(nn.Module):
    """An embedding with a padding row (no gradient there) and a Linear called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.e, self.fc, self.out = nn.Embedding(11, 6, padding_idx=0), nn.Linear(6, 6), (
            nn.Linear(6, 1))

    def forward(self, x):
        return self.out(torch.tanh(self.fc(torch.tanh(self.fc(self.e(x))))).mean(1))


class Untangled(nn.Module):
    """PReLU has no tangent rule: two weighted backwards to the parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.p, self.b = nn.Linear(5, 7), nn.PReLU(), nn.Linear(7, 2)

    def forward(self, x):
        return self.b(self.p(self.a(x)))


def frozen(model: nn.Sequential) -> nn.Sequential:
    model[0].bias.requires_grad_(False)  # the Gram route without its "+ 1"
    model[2].weight.requires_grad_(False)  # ... and with only it
    return model


def case(name: str):
    gen = torch.Generator().manual_seed(1)
    y = torch.randint(0, 2, (B,), generator=gen)
    if name == "tokens":
        x = torch.randint(0, 11, (B, 5), generator=gen)
        x[:, -1] = 0  # padding in every sample
        return Tokens(), bce, x, y
    shapes = {"sequences": (3, 5), "convs": (2, 6, 6)}
    x = torch.randn(B, *shapes.get(name, (5,)), generator=gen, dtype=DTYPE)
    models = {"mlp": lambda: mlp(32), "frozen": lambda: frozen(mlp(32)),
              "sequences": Sequences, "convs": ConvNorms, "untangled": Untangled}
    return models[name](), per_sample_cross_entropy, x, y


ROUTES = ["mlp", "frozen", "sequences", "convs", "tokens", "untangled"]
GROUPS = torch.tensor([0, 1] * (B // 2))


@pytest.mark.parametrize("name", ROUTES)
@pytest.mark.parametrize("engine", ["fast", "auto", "materialized"])
def test_update_equals_the_equations(name, engine):
    if engine == "fast" and name == "untangled":
        pytest.skip("PReLU has no fast rule")
    torch.manual_seed(0)
    model, loss_fn, x, y = case(name)
    model = model.to(DTYPE)
    expected = reference(model, loss_fn, x, y, GROUPS, 1.0, 0.7)
    got = step_update(model, loss_fn, x, y, GROUPS, engine)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_the_mlp_takes_the_gram_route_where_it_is_cheaper():
    model = mlp(32)
    a = torch.zeros(B, 32)
    assert _gram_is_cheaper(model[2], [(a, a, a)])  # 12 * 64 < 3 * 32 * 32
    assert not _gram_is_cheaper(model[6], [(a, a, a)])  # the head: 2 outputs
    assert not _gram_is_cheaper(model[2], [(a, a, a)] * 2)  # called twice
    assert not _gram_is_cheaper(model[2], [(a.view(B, 1, 32),) * 3])  # on sequences


@pytest.mark.parametrize("name", ["mlp", "convs"])
def test_non_finite_samples_are_left_out_of_the_regulariser(name):
    torch.manual_seed(0)
    model, loss_fn, x, y = case(name)
    model = model.to(DTYPE)
    x = x.clone()
    x[3] = float("nan")
    expected = reference(model, loss_fn, x, y, GROUPS, 1.0, 0.7)
    torch.testing.assert_close(step_update(model, loss_fn, x, y, GROUPS, "auto"), expected,
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("gamma1", "gamma2"), [(0.0, 0.7), (1.0, 0.0), (2.5, 0.3)])
def test_each_regulariser_weight(gamma1, gamma2):
    torch.manual_seed(0)
    model, loss_fn, x, y = case("mlp")
    model = model.to(DTYPE)
    expected = reference(model, loss_fn, x, y, GROUPS, gamma1, gamma2)
    got = step_update(model, loss_fn, x, y, GROUPS, "auto", gamma1, gamma2)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_one_group_only_has_no_r1():
    torch.manual_seed(0)
    model, loss_fn, x, y = case("mlp")
    model = model.to(DTYPE)
    ones = torch.ones(B, dtype=torch.long)
    expected = reference(model, loss_fn, x, y, ones, 0.0, 0.7)  # R1 needs both groups
    torch.testing.assert_close(step_update(model, loss_fn, x, y, ones, "auto"), expected,
                               rtol=1e-10, atol=1e-12)


def test_noise_sensitivity_and_event_are_dpsgds():
    """The regulariser changes what is clipped, never the release: the same generator gives
    FairLens the noise DP-SGD draws (std sigma C), the same sensitivity and the same event."""
    torch.manual_seed(0)
    model, loss_fn, x, y = case("mlp")
    model = model.to(DTYPE)
    noises, infos = [], []
    for cfg in ({"name": "fairlens", "C": C}, {"name": "dpsgd", "C": C}):
        meth = build_method(CONFIGS.validate_python(cfg), n_groups=2, sigma=1.3,
                            expected_batch_size=EXPECTED)
        released = []
        for sigma in (1.3, 0.0):
            m = copy.deepcopy(model)
            step = PrivateStep(m, meth, sigma=sigma, expected_batch_size=EXPECTED)
            infos.append(step(x, y, GROUPS, torch.Generator().manual_seed(7)))
            released.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
        noises.append(released[0] - released[1])
        assert meth.step_event(1.3) == build_method(
            CONFIGS.validate_python({"name": "dpsgd", "C": C}), n_groups=2, sigma=1.3,
            expected_batch_size=EXPECTED).step_event(1.3)
    torch.testing.assert_close(noises[0], noises[1], rtol=1e-9, atol=1e-12)
    assert noises[0].abs().max() > 0
    assert infos[0].sensitivity == infos[2].sensitivity == C


def test_a_layer_unfrozen_between_steps_joins_the_regulariser():
    """One former across a change of ``requires_grad`` gives the ``r`` of the materialised
    engine (the route that keeps no per-model state), which the equations check above."""
    torch.manual_seed(0)
    model, loss_fn, x, y = case("mlp")
    model = model.to(DTYPE)
    model[2].requires_grad_(False)
    former = fairlens().per_sample_gradients(model, "auto")
    former.compute(model, loss_fn, x, y, GROUPS)
    model[2].requires_grad_(True)
    former.compute(model, loss_fn, x, y, GROUPS)
    reference_former = fairlens().per_sample_gradients(model, "materialized")
    reference_former.compute(model, loss_fn, x, y, GROUPS)
    for got, want in zip(former.shared, reference_former.shared, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


class GhostWithoutDots(GhostClipping):
    """The fast engine, keeping no factors for ``<g_i, r>`` (as an engine may)."""

    def per_sample_dots(self, vectors):
        return None


class MaterializedWithoutDots(Materialized):
    def per_sample_dots(self, vectors):
        return None


@pytest.mark.parametrize("engine", [GhostWithoutDots, MaterializedWithoutDots])
def test_an_engine_keeping_no_factors_gets_the_cross_terms_by_a_double_backward(engine):
    """``<g_i, r>`` then takes a double backward through the regulariser's forward run again;
    the norms and ``r`` are those of the materialised engine."""
    torch.manual_seed(0)
    model, loss_fn, x, y = case("mlp")
    model = model.to(DTYPE)
    x = x.clone()
    x[3] = float("nan")
    former = RegularisedGradients(engine(clone_outputs=True) if engine is GhostWithoutDots
                                  else engine(), C, 1.0, 0.7)  # the mlp has ReLU(inplace=True)
    norms = former.compute(model, loss_fn, x, y, GROUPS)
    reference_former = fairlens().per_sample_gradients(model, "materialized")
    torch.testing.assert_close(
        norms, reference_former.compute(model, loss_fn, x, y, GROUPS), rtol=1e-10, atol=1e-12,
        equal_nan=True,
    )
    for got, want in zip(former.shared, reference_former.shared, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["mlp", "convs", "sequences"])
def test_bf16_autocast_runs_the_products_in_the_parameters_dtype(name):
    """Under bfloat16 autocast the captured factors are widened, as the engine widens its own:
    the step runs, its update is float32 and within bfloat16's error of the float32 update."""
    torch.manual_seed(0)
    model, loss_fn, x, y = case(name)
    updates = []
    for autocast in ("bf16", "off"):
        m = copy.deepcopy(model)
        step = PrivateStep(m, fairlens(), sigma=0.0, expected_batch_size=EXPECTED,
                           loss_fn=loss_fn, autocast=autocast)
        step(x.float(), y, GROUPS, torch.Generator().manual_seed(0))
        updates.append(torch.cat([p.grad.flatten() for p in m.parameters() if p.requires_grad]))
    assert updates[0].dtype == torch.float32
    assert (updates[0] - updates[1]).norm() < 0.1 * updates[1].norm()


class CountingGhost(GhostClipping):
    """The fast engine, counting the graphs it hands over (``keep_graph``)."""

    taken = 0

    def take_graph(self):
        kept = super().take_graph()
        self.taken += kept is not None
        return kept


class GhostKeepingNone(GhostClipping):
    """The fast engine handing over no graph: the regulariser runs its own forward."""

    def take_graph(self):
        super().take_graph()
        return None


@pytest.mark.parametrize("name", ["mlp", "frozen", "sequences", "convs", "tokens"])
def test_the_tangent_routes_take_the_engines_forward_and_backward(name):
    """Where every norm is finite, R1's products come from the engine's own forward and
    backward (``GhostClipping(keep_graph=True)``); ``r`` and the norms are those of the
    regulariser's own forward and backward, to rounding."""
    torch.manual_seed(0)
    model, loss_fn, x, y = case(name)
    model = model.to(DTYPE)
    formers = [RegularisedGradients(cls(clone_outputs=modifies_in_place(model)), C, 1.0, 0.7)
               for cls in (CountingGhost, GhostKeepingNone)]
    norms = [f.compute(model, loss_fn, x, y, GROUPS) for f in formers]
    assert formers[0].inner.keep_graph and formers[0].inner.taken == 1
    torch.testing.assert_close(norms[0], norms[1], rtol=1e-12, atol=1e-14)
    for got, want in zip(formers[0].shared, formers[1].shared, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(("name", "gamma1"), [("untangled", 1.0), ("mlp", 0.0)])
def test_no_graph_is_kept_where_r1_takes_no_tangent_route(name, gamma1):
    """A layer without a tangent rule (two weighted backwards instead), or no R1 at all: the
    engine's backward keeps no graph (it would cost memory and time for nothing)."""
    torch.manual_seed(0)
    model, loss_fn, x, y = case(name)
    former = RegularisedGradients(CountingGhost(clone_outputs=modifies_in_place(model)), C,
                                  gamma1, 0.7)
    former.compute(model.to(DTYPE), loss_fn, x, y, GROUPS)
    assert not former.inner.keep_graph and former.inner.taken == 0
