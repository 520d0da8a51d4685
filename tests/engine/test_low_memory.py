"""The engine's low-memory path and memory-budgeted chunks against the materialised reference.

``GhostClipping(low_memory=True)`` forms each layer's norms inside the backward pass and its
weighted sum by a second backward through the retained graph; where a factor would over- or
underflow or a norm is not finite it replays the forward on the factor path. Chunks of samples
follow the memory budget: a budget of one sample must give the norms of one whole chunk.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpfair.engine import conv_grads as conv_grads_module
from dpfair.engine import gradients as gradients_module
from dpfair.engine.gradients import GhostClipping, Materialized
from dpfair.engine.layer_fallback import plan_layers, probe_calls
from dpfair.engine.layer_grads import layer_grads
from dpfair.engine.step import PrivateStep, per_sample_cross_entropy
from dpfair.errors import ConfigError
from dpfair.methods.dpsgd import Dpsgd

TOL = 1e-12
DTYPE = torch.float64


def _wrn_like() -> nn.Module:
    """Every layer kind of a WideResNet and a transformer: convolutions (3x3 'same', strided,
    1x1), GroupNorm, an embedding-free sequence Linear, LayerNorm and a dense head."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(2, 4, 3, padding=1, bias=False)
            self.gn = nn.GroupNorm(2, 4)
            self.c2 = nn.Conv2d(4, 6, 3, stride=2, padding=1)
            self.short = nn.Conv2d(4, 6, 1, stride=2, bias=False)
            self.seq = nn.Linear(6, 5)
            self.ln = nn.LayerNorm(5)
            self.head = nn.Linear(5, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.gn(self.c1(x)))
            h = self.c2(h) + self.short(h)  # (B, 6, 4, 4)
            h = self.ln(torch.tanh(self.seq(h.flatten(2).transpose(1, 2))))  # (B, 16, 5)
            return self.head(h.mean(1))

    torch.manual_seed(0)
    return Net().to(DTYPE)


def _models(nets):
    return [(_wrn_like(), (2, 8, 8), 3), (nets.mlp(width=16), (12,), 2),
            (nets.esipova_cnn(), (1, 28, 28), 10)]


def _agree(engine, model, x, y) -> None:
    ref = Materialized()
    want = ref.compute(model, per_sample_cross_entropy, x, y)
    got = engine.compute(model, per_sample_cross_entropy, x, y)
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite)
    torch.testing.assert_close(got[finite], want[finite], atol=TOL, rtol=TOL)
    weights = torch.where(finite, torch.rand(len(x), dtype=DTYPE), 0.0)
    start = [torch.randn_like(p) for p in model.parameters()]
    into = [s.clone() for s in start]
    engine.add_weighted_grad(weights, into)
    for g, s, w in zip(into, start, ref.weighted_grad(weights), strict=True):
        torch.testing.assert_close(g, s + w, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("kept", ["none", "some", "all"])
def test_low_memory_path_agrees_with_the_materialised_one(kept, nets, monkeypatch):
    """The layers nearest the input whose output gradients fit the budget keep their factors
    (book-keeping); the others' share of the sum comes from a second backward for their
    parameters alone; every split gives the reference's norms and sum."""
    torch.manual_seed(0)
    tokens = nn.Sequential(nn.Embedding(10, 4, padding_idx=0), nn.Flatten(), nn.Linear(12, 2))
    ids = torch.randint(0, 10, (5, 3), generator=torch.Generator().manual_seed(2))
    cases = [(model, *nets.batch(shape, classes, b=5)[:2]) for model, shape, classes in
             _models(nets)] + [(tokens.to(DTYPE), ids, ids[:, 0] % 2)]
    for model, x, y in cases:
        plan = plan_layers(model)
        out = plan.fast[0](x)  # the first layer's output: its gradient's bytes
        first = out.numel() * out.element_size()
        budget = {"none": 0, "some": first, "all": 1 << 40}[kept]  # "some": that layer alone
        monkeypatch.setattr(gradients_module, "engine_budget", lambda device, b=budget: b)
        engine = GhostClipping(low_memory=True)
        _agree(engine, model, x, y)
        n_kept, n_layers = len(engine._layers), len(plan.fast)
        if kept == "all":
            assert engine._graph is None and n_kept == n_layers  # no second backward
        else:  # a second backward, for the other layers' parameters only
            assert engine._graph is not None
            assert (n_kept == 0) if kept == "none" else (0 < n_kept < n_layers)
            assert len(engine._rest) < len(engine._params) or kept == "none"


@pytest.mark.parametrize("kind", ["nan", "huge"])
def test_low_memory_path_replays_on_the_factor_path(kind, nets, monkeypatch):
    """A NaN input (a non-finite norm) or a factor whose square overflows (the Linear's
    input 1e200 with a zero output gradient) sends the step to the factor path."""
    model = nets.mlp(width=16)
    x, y, _ = nets.batch((12,), 2, b=4)
    x[1, 0] = float("nan") if kind == "nan" else 1e200
    monkeypatch.setattr(gradients_module, "engine_budget", lambda device: 0)  # nothing kept
    engine = GhostClipping(low_memory=True)
    _agree(engine, model, x, y)
    assert engine._graph is None  # the factor path


def test_the_replay_draws_the_same_dropout_masks(nets):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.Dropout(0.5), nn.Linear(16, 2)).to(DTYPE)
    x, y, _ = nets.batch((12,), 2, b=4)
    x[1, 0] = float("nan")
    torch.manual_seed(5)
    replayed = GhostClipping(low_memory=True).compute(model, per_sample_cross_entropy, x, y)
    torch.manual_seed(5)
    direct = GhostClipping(low_memory=False).compute(model, per_sample_cross_entropy, x, y)
    torch.testing.assert_close(replayed, direct, rtol=0, atol=0, equal_nan=True)


def test_chunks_of_one_sample_give_the_whole_batch_norms(nets):
    model = _wrn_like()
    calls = {}
    x, y, _ = nets.batch((2, 8, 8), 3, b=5)
    engine = GhostClipping(low_memory=False)
    engine.keeps_calls = True  # keep the captured factors
    engine.compute(model, per_sample_cross_entropy, x, y)
    calls = engine._calls
    for module, c in calls.items():
        whole = layer_grads(module, c, budget=1 << 40).sq_norms()
        chunked = layer_grads(module, c, budget=1).sq_norms()
        torch.testing.assert_close(chunked, whole, atol=1e-12, rtol=1e-12)


def test_a_small_engine_memory_cap_gives_more_smaller_chunks_and_the_same_sum(nets, monkeypatch):
    """``max_engine_memory`` (MiB) caps the step: at 3 MiB a 16-channel 32x32 convolution's
    per-sample intermediates (~0.4 MB a sample) come a few samples at a time (physical batches
    the cap fits), and the step's clipped sum (no noise) is the uncapped one."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.Tanh(), nn.Flatten(),
                          nn.Linear(16 * 32 * 32, 2)).to(DTYPE)
    x, y, g = nets.batch((16, 32, 32), 2, b=6)
    real, sizes = conv_grads_module.chunks, []

    def spy(batch: int, per_sample: int, budget: int) -> list:
        sizes.append([s.stop - s.start for s in real(batch, per_sample, budget)])
        return real(batch, per_sample, budget)

    monkeypatch.setattr(conv_grads_module, "chunks", spy)
    sums, chunked = {}, {}
    for cap in (None, 3):
        sizes = []
        step = PrivateStep(model, Dpsgd(0.3), sigma=0.0, expected_batch_size=6.0,
                           max_engine_memory=cap)
        step(x, y, g, torch.Generator().manual_seed(0))
        sums[cap], chunked[cap] = [p.grad.clone() for p in model.parameters()], sizes
    assert chunked[None] == [[6]]  # the conv layer, one chunk
    assert len(chunked[3]) > 2 and all(sum(c) < 6 for c in chunked[3])
    for capped, whole in zip(sums[3], sums[None], strict=True):
        torch.testing.assert_close(capped, whole, rtol=1e-10, atol=1e-10)
    with pytest.raises(ConfigError, match="max_engine_memory must be >= 1"):
        PrivateStep(model, Dpsgd(0.3), sigma=0.0, expected_batch_size=6.0, max_engine_memory=0)


def _engine_tensors(value, seen=None) -> list[torch.Tensor]:
    """Every tensor an engine's attributes reach (lists, tuples, dicts, engines inside it),
    parameters left out: what it holds between steps."""
    seen = set() if seen is None else seen
    if id(value) in seen or isinstance(value, nn.Module | nn.Parameter):
        return []
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.keys()) + list(value.values())
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        value = list(vars(value).values())
    elif not isinstance(value, list | tuple):
        return []
    return [t for v in value for t in _engine_tensors(v, seen)]


@pytest.mark.parametrize("budget", [1 << 40, 1000], ids=["factors", "low-memory"])
def test_the_first_step_takes_the_path_of_the_later_ones_and_nothing_is_held(
    budget, nets, monkeypatch
):
    """The low-memory path is chosen from the model and the batch shape before the first step
    (the plan's probe forward), not from the last step's size: step 1 takes the path step 2
    takes. After a step the engine holds no tensor but the detached losses (no factors, no
    retained graph), and both paths give the same clipped sum."""
    monkeypatch.setattr(gradients_module, "engine_budget", lambda device: budget)
    x, y, g = nets.batch((2, 8, 8), 3, b=5)
    model = _wrn_like()
    step = PrivateStep(model, Dpsgd(0.3), sigma=0.0, expected_batch_size=5.0)
    engine, paths = step.engine, []
    decide = engine._low_memory

    def spy(plan, x, budget):
        paths.append(decide(plan, x, budget))
        return paths[-1]

    monkeypatch.setattr(engine, "_low_memory", spy)
    for _ in range(2):
        step(x, y, g, torch.Generator().manual_seed(0))
        held = _engine_tensors(engine)
        assert [t for t in held if t is not engine.losses] == []
    assert paths == [budget == 1000] * 2
    reference = PrivateStep(_wrn_like(), Dpsgd(0.3), sigma=0.0, expected_batch_size=5.0,
                            engine="materialized")
    reference(x, y, g, torch.Generator().manual_seed(0))
    for got, want in zip(model.parameters(), reference.model.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, atol=1e-12, rtol=1e-12)


def test_the_probe_counts_the_output_gradients_the_factor_path_holds(nets):
    """The probe's bytes per sample, times the batch, are the bytes of the layer outputs whose
    gradients the factor path takes (every layer trainable here)."""
    model = _wrn_like()
    x, _, _ = nets.batch((2, 8, 8), 3, b=5)
    plan = plan_layers(model)
    outputs: list[torch.Tensor] = []
    handles = [m.register_forward_hook(lambda m, a, o: outputs.append(o)) for m in plan.fast]
    model(x)
    for h in handles:
        h.remove()
    held = sum(o.numel() * o.element_size() for o in outputs if o.requires_grad)
    assert probe_calls(model, plan, x)[1] * len(x) == held
