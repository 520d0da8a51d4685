"""BAM's fast ascent (issue #18, item 3): two ghost-clipping passes with per-sample corrections
(:class:`dpfair.engine.ascent.AscentGhost`) give the ascended per-sample gradients of the
materialised reference (:class:`AscentMaterialized`): the same norms and weighted sums, the same
samples dropped on huge, NaN and infinite inputs; ``lam = 0`` is DP-SGD; a model with a layer
the fast ascent has no shift for is materialised (``"fast"`` refuses it)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from pydantic import TypeAdapter
from torch import nn

from dpfair.engine.ascent import AscentGhost, AscentMaterialized
from dpfair.engine.gradients import modifies_in_place
from dpfair.engine.step import PrivateStep, per_sample_cross_entropy
from dpfair.methods import MethodConfig, build_method

DTYPE = torch.float64
VOCAB = 7
TOL = 1e-5
EXACT = 1e-10  # float64, no input out of range
LAM = 0.5  # large enough that the ascended gradients differ clearly from the plain ones


class SeqClassifier(nn.Module):
    """Linear layers on ``(B, T, d)`` inputs: one on the sequence, then a head on its mean."""

    def __init__(self, d: int = 6, width: int = 8, bias: bool = True) -> None:
        super().__init__()
        self.seq = nn.Linear(d, width, bias=bias)
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.seq(x)).mean(1))


class Twice(nn.Module):
    """One Linear called twice in a forward (its per-sample gradient sums both calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.head = nn.Linear(5, 5), nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.inner(torch.tanh(self.inner(x)))))


class Convs(nn.Module):
    """Convolutions with stride, reflect padding, dilation, groups, 'same' padding, no bias,
    one called twice; input ``(2, 8, 8)``."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, stride=2, padding=1, padding_mode="reflect")
        self.c2 = nn.Conv2d(4, 4, 3, dilation=2, groups=2, padding="same", bias=False)
        self.head = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.c1(x))
        return self.head(torch.tanh(self.c2(h) + self.c2(0.5 * h)).flatten(1))


class FewPositions(nn.Module):
    """Wide convolutions on few positions (the shift's Gram form), one grouped, without bias,
    called twice; input ``(8, 4, 4)``."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(8, 16, 3, padding_mode="circular", padding=1, stride=2)
        self.c2 = nn.Conv2d(16, 16, 2, groups=2, bias=False)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.c1(x))
        return self.head(torch.tanh(self.c2(h) + self.c2(h.flip(-1))).flatten(1))


def esipova_cnn(act: type[nn.Module] = nn.Tanh) -> nn.Module:
    """Esipova's MNIST CNN at a small width (Conv2d, MaxPool, a Linear head), input 1x28x28."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), act(), nn.MaxPool2d(2),
        nn.Conv2d(8, 4, 3, padding=1), act(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(4 * 7 * 7, 3),
    )


class Tokens(nn.Module):
    """A small transformer-like stack: token (with padding_idx) and position embeddings,
    LayerNorm (one without bias), a residual Linear, a head on the mean; input ids ``(5,)``."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(VOCAB, 6, padding_idx=0), nn.Embedding(5, 6)
        self.ln, self.fc = nn.LayerNorm(6), nn.Linear(6, 6)
        self.ln2, self.head = nn.LayerNorm(6, bias=False), nn.Linear(6, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
        h = self.ln(self.emb(ids) + self.pos(positions))
        return self.head(self.ln2(h + torch.tanh(self.fc(h))).mean(1))


class GroupNormRes(nn.Module):
    """Convolutions with GroupNorm and a residual connection (a WideResNet block in small)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.gn1 = nn.Conv2d(2, 4, 3, padding=1), nn.GroupNorm(2, 4)
        self.c2, self.gn2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.GroupNorm(2, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.gn1(self.c1(x)))
        return self.head((h + torch.relu(self.gn2(self.c2(h)))).mean((2, 3)))


class BatchFree(nn.Module):
    """A Linear run on an input without the batch axis (a learned offset of a constant)."""

    def __init__(self) -> None:
        super().__init__()
        self.head, self.offset = nn.Linear(5, 3), nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x) + self.offset(torch.ones(1, 2, dtype=x.dtype))


def mlp(act: type[nn.Module]) -> nn.Module:
    return nn.Sequential(nn.Linear(5, 16), act(), nn.Linear(16, 16), act(), nn.Linear(16, 3))


MODELS = {
    "mlp_tanh": (lambda: mlp(nn.Tanh), (5,)),
    "mlp_relu": (lambda: mlp(nn.ReLU), (5,)),
    "mlp_relu_inplace": (lambda: mlp(lambda: nn.ReLU(inplace=True)), (5,)),
    "logistic": (lambda: nn.Linear(5, 3), (5,)),
    "sequence": (SeqClassifier, (4, 6)),
    "sequence_no_bias": (lambda: SeqClassifier(bias=False), (4, 6)),
    "linear_called_twice": (Twice, (5,)),
    "batch_free_call": (BatchFree, (5,)),  # served whole by the materialised ascent
    "esipova_cnn": (esipova_cnn, (1, 28, 28)),
    "cnn_relu_inplace": (lambda: esipova_cnn(lambda: nn.ReLU(inplace=True)), (1, 28, 28)),
    "convolutions": (Convs, (2, 8, 8)),
    "few_positions": (FewPositions, (8, 4, 4)),
    "tokens": (Tokens, (5,)),  # integer ids below VOCAB
    "groupnorm_resnet": (GroupNormRes, (2, 6, 6)),
}


def model_and_batch(key: str, b: int, seed: int = 0, dtype: torch.dtype = DTYPE):
    make, shape = MODELS[key]
    torch.manual_seed(seed)
    model = make().to(dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    if key == "tokens":
        x = torch.randint(0, VOCAB, (b, *shape), generator=gen)
    else:
        x = torch.randn(b, *shape, generator=gen, dtype=dtype)
    return model, x, torch.randint(0, 3, (b,), generator=gen)


def both(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lam: float = LAM):
    """``(fast, reference)`` engines with their norms on the batch."""
    fast, ref = AscentGhost(lam, modifies_in_place(model)), AscentMaterialized(lam)
    loss = per_sample_cross_entropy
    return (fast, fast.compute(model, loss, x, y)), (ref, ref.compute(model, loss, x, y))


@pytest.mark.parametrize("b", [1, 7, 64])
@pytest.mark.parametrize("key", list(MODELS))
def test_fast_ascent_equals_the_materialised_one(key, b, monkeypatch):
    """Equal to 1e-10 in float64; pass 2's shifts are built from pass 1's per-layer state (a
    convolution's per-sample kernels are not formed again where its norms formed them)."""
    formed = []
    real = torch.nn.grad.conv2d_weight
    monkeypatch.setattr(torch.nn.grad, "conv2d_weight", lambda *a, **k: formed.append(1) or real(
        *a, **k))
    model, x, y = model_and_batch(key, b)
    (fast, fast_norms), (ref, ref_norms) = both(model, x, y)
    if key in ("esipova_cnn", "cnn_relu_inplace", "groupnorm_resnet"):
        assert not formed  # the kernels of pass 1's norms served the shifts
    torch.testing.assert_close(fast_norms, ref_norms, atol=EXACT, rtol=EXACT)
    torch.testing.assert_close(fast.losses, ref.losses, atol=EXACT, rtol=EXACT)
    weights = torch.rand(b, generator=torch.Generator().manual_seed(3), dtype=DTYPE)
    for a, r in zip(fast.weighted_grad(weights), ref.weighted_grad(weights), strict=True):
        torch.testing.assert_close(a, r, atol=EXACT, rtol=EXACT)
    plain = AscentGhost(0.0, modifies_in_place(model))
    plain_norms = plain.compute(model, per_sample_cross_entropy, x, y)
    assert (fast_norms - plain_norms).abs().max() > 1e-3  # the ascent did move every batch


@pytest.mark.parametrize(
    ("key", "layer"), [("sequence", "seq"), ("convolutions", "c1"), ("tokens", "ln")]
)
def test_only_trainable_parameters_ascend(key, layer):
    """A frozen weight neither moves nor counts in ``|g_i|``: the bias alone ascends."""
    model, x, y = model_and_batch(key, 7)
    getattr(model, layer).weight.requires_grad_(False)
    (fast, fast_norms), (ref, ref_norms) = both(model, x, y)
    torch.testing.assert_close(fast_norms, ref_norms, atol=TOL, rtol=TOL)
    weights = torch.linspace(0.1, 1.0, 7, dtype=DTYPE)
    for a, r in zip(fast.weighted_grad(weights), ref.weighted_grad(weights), strict=True):
        torch.testing.assert_close(a, r, atol=TOL, rtol=TOL)


SCALES = {torch.float32: (1e30, 1e20), torch.float64: (1e300, 1e160)}


@pytest.mark.parametrize("dtype", list(SCALES), ids=["float32", "float64"])
@pytest.mark.parametrize(
    "key",
    ["mlp_tanh", "mlp_relu", "sequence", "esipova_cnn", "few_positions", "groupnorm_resnet"],
)
def test_huge_nan_and_inf_samples_are_handled_as_materialised(key, dtype):
    """Rows 1, 2 scaled past the dtype's range, 3 NaN, 4 inf, 5 zero: the same samples have a
    finite, infinite or NaN ascended norm on both paths, equal where finite, and the clipped
    sums agree."""
    model, x, y = model_and_batch(key, 8, dtype=dtype)
    big, bigger = SCALES[dtype]
    x[1] *= big
    x[2] *= bigger
    x[3].view(-1)[0] = math.nan
    x[4].view(-1)[0] = math.inf
    x[5] = 0.0
    (fast, fast_norms), (ref, ref_norms) = both(model, x, y)
    kept = torch.isfinite(ref_norms)
    assert torch.equal(torch.isfinite(fast_norms), kept)
    assert torch.equal(torch.isnan(fast_norms), torch.isnan(ref_norms))
    assert kept[[0, 5, 6, 7]].all() and not kept[[3, 4]].any()
    tol = TOL if dtype == DTYPE else 1e-4
    torch.testing.assert_close(fast_norms[kept], ref_norms[kept], atol=tol, rtol=tol)
    weights = torch.where(kept, 0.3 / ref_norms.clamp(min=0.3), 0.0)
    for a, r in zip(fast.weighted_grad(weights), ref.weighted_grad(weights), strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, r, atol=tol, rtol=tol)


def bam(lam: float, name: str = "bam"):
    config = {"name": name, "C": 0.3} | ({"lam": lam} if name == "bam" else {})
    cfg = TypeAdapter(MethodConfig).validate_python(config)
    return build_method(cfg, n_groups=2, sigma=1.0, expected_batch_size=5.0)


def released(model: nn.Module, method, x, y, engine: str = "auto") -> list[torch.Tensor]:
    model = copy.deepcopy(model)
    step = PrivateStep(model, method, sigma=1.0, expected_batch_size=5.0, engine=engine)
    step(x, y, torch.zeros(len(x), dtype=torch.long), torch.Generator().manual_seed(4))
    return [p.grad for p in model.parameters()]


def test_lam_zero_is_dpsgd():
    model, x, y = model_and_batch("mlp_tanh", 7)
    for a, r in zip(released(model, bam(0.0), x, y), released(model, bam(0.0, "dpsgd"), x, y),
                    strict=True):
        torch.testing.assert_close(a, r, atol=0, rtol=0)


def test_the_step_takes_the_fast_ascent_on_linear_models_and_agrees_with_materialised():
    model, x, y = model_and_batch("sequence", 7)
    step = PrivateStep(model, bam(LAM), sigma=1.0, expected_batch_size=5.0, engine="fast")
    assert isinstance(step.engine, AscentGhost)
    fast = released(model, bam(LAM), x, y, "auto")
    ref = released(model, bam(LAM), x, y, "materialized")
    for a, r in zip(fast, ref, strict=True):
        torch.testing.assert_close(a, r, atol=TOL, rtol=TOL)


class Scale(nn.Module):
    """A layer type with no fast rule."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


@pytest.mark.parametrize(
    "layer", [Scale(), nn.Embedding(10, 4, max_norm=1.0)], ids=["custom", "embedding_max_norm"]
)
def test_a_model_with_another_layer_is_materialised(layer):
    model = nn.Sequential(layer, nn.Flatten(), nn.Linear(4, 2)).to(DTYPE)
    step = PrivateStep(model, bam(LAM), sigma=1.0, expected_batch_size=5.0)
    assert type(step.engine) is AscentMaterialized
    with pytest.raises(ValueError, match=r"0 is not among the layers the fast ascent shifts"):
        PrivateStep(model, bam(LAM), sigma=1.0, expected_batch_size=5.0, engine="fast")


@pytest.mark.parametrize("key", ["tokens", "groupnorm_resnet"])
def test_clipping_bounds_every_ascended_contribution_under_bf16_autocast(key):
    """Both passes under bf16 autocast: the ascended norms are float32 and each sample's
    weighted contribution has exactly the norm it was clipped for."""
    model, x, y = model_and_batch(key, 6, dtype=torch.float32)
    c = 0.05
    step = PrivateStep(model, bam(LAM), sigma=0.0, expected_batch_size=1.0, autocast="bf16")
    assert isinstance(step.engine, AscentGhost)
    with step._precision(x.device):
        norms = step.engine.compute(model, per_sample_cross_entropy, x, y)
    assert norms.dtype == torch.float32 and (norms > c).all()
    for i in range(len(x)):
        weights = torch.zeros(len(x))
        weights[i] = c / float(norms[i])
        size = torch.cat([g.flatten() for g in step.engine.weighted_grad(weights)]).norm()
        assert size == pytest.approx(c, rel=1e-4)
