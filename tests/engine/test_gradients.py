"""The fast (ghost-norm) path against the materialised reference."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from dpfair.engine.gradients import GhostClipping, Materialized, make_engine
from dpfair.engine.step import per_sample_cross_entropy

TOL = 1e-5
DTYPE = torch.float64


def assert_paths_agree(model: nn.Module, x, y, loss_fn=per_sample_cross_entropy) -> None:
    fast, ref = make_engine(model, "fast"), Materialized()
    fast_norms, ref_norms = fast.compute(model, loss_fn, x, y), ref.compute(model, loss_fn, x, y)
    torch.testing.assert_close(fast_norms, ref_norms, atol=TOL, rtol=TOL)
    torch.testing.assert_close(fast.losses, ref.losses)
    weights = torch.rand(len(x), generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    weights[0] = 0.0
    expected = ref.weighted_grad(weights)
    for a, b in zip(fast.weighted_grad(weights), expected, strict=True):
        torch.testing.assert_close(a, b, atol=TOL, rtol=TOL)
    # <g_i, r> for every sample (FairLens) from the kept factors, as from the materialised ones
    r = [torch.randn_like(g) for g in expected]
    torch.testing.assert_close(fast.per_sample_dots(r), ref.per_sample_dots(r), atol=TOL, rtol=TOL)
    # adding in place (as the step adds the update to its noise) leaves what was there
    start = [torch.randn_like(g) for g in expected]
    for engine in (fast, ref):
        into = [s.clone() for s in start]
        engine.add_weighted_grad(weights, into)
        for got, s, want in zip(into, start, expected, strict=True):
            torch.testing.assert_close(got, s + want, atol=TOL, rtol=TOL)


def test_paths_agree_on_the_papers_models(model_and_batch):
    model, x, y, _ = model_and_batch
    assert isinstance(make_engine(model), GhostClipping)
    assert_paths_agree(model, x, y)


class Sequence(nn.Module):
    """Linear layers on sequences (T = 5): one takes the Gram trick, one materialises, one is
    called twice (shared weights), and one bias is frozen."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(16, 16)  # T (d + p) = 160 < d p = 256: Gram
        self.narrow = nn.Linear(16, 3)  # 5 * 19 > 48: materialised
        self.shared = nn.Linear(3, 3)
        self.head = nn.Linear(3, 2)
        self.head.bias.requires_grad_(False)

    def forward(self, x):
        h = self.narrow(torch.tanh(self.wide(x)))
        h = self.shared(torch.tanh(self.shared(h)))
        return self.head(h.mean(1))


class Convs(nn.Module):
    """Grouped, dilated, strided, 'same' and reflect-padded convolutions; c1-c3 have many
    positions (per-sample weights by kernel taps), c4 few (Gram trick over im2col patches)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, padding="same", dilation=2)
        self.c2 = nn.Conv2d(4, 6, 3, stride=2, groups=2, padding=1, padding_mode="reflect")
        self.c3 = nn.Conv2d(6, 3, (2, 3), bias=False)
        self.c4 = nn.Conv2d(3, 16, (3, 2), dilation=(1, 2), padding=(0, 1))
        self.head = nn.Linear(16 * 2 * 3, 3)

    def forward(self, x):
        h = torch.tanh(self.c3(torch.tanh(self.c2(torch.tanh(self.c1(x))))))
        return self.head(torch.tanh(self.c4(h)).flatten(1))


class Normalised(nn.Module):
    """GroupNorm after a convolution and LayerNorm (one without bias) after a linear layer
    whose weight is frozen (its bias alone is trained)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.gn = nn.GroupNorm(2, 4)
        self.lin = nn.Linear(4 * 5 * 5, 6)
        self.ln = nn.LayerNorm(6, bias=False)
        self.head = nn.Linear(6, 2)
        self.lin.weight.requires_grad_(False)

    def forward(self, x):
        h = torch.tanh(self.gn(self.conv(x))).flatten(1)
        return self.head(torch.tanh(self.ln(self.lin(h))))


@pytest.mark.parametrize(
    ("make", "shape"),
    [(Sequence, (5, 16)), (Convs, (2, 9, 9)), (Normalised, (2, 7, 7))],
    ids=["sequence", "convs", "normalised"],
)
def test_paths_agree_on_sequences_shared_layers_conv_variants_and_norms(make, shape, nets):
    torch.manual_seed(0)
    model = make().to(DTYPE)
    x, y, _ = nets.batch(shape, 2, b=5)
    assert_paths_agree(model, x, y)


def test_non_finite_sample_is_confined_to_its_row(nets):
    torch.manual_seed(0)
    model = nets.mlp(width=16)
    x, y, _ = nets.batch((12,), 2, b=4)
    x[1, 0], x[2, 3] = float("nan"), float("inf")
    for engine in (GhostClipping(), Materialized()):
        norms = engine.compute(model, per_sample_cross_entropy, x, y)
        assert torch.isfinite(norms[[0, 3]]).all() and not torch.isfinite(norms[[1, 2]]).any()
        weights = torch.tensor([1.0, 0.0, 0.0, 0.5], dtype=DTYPE)
        assert all(torch.isfinite(g).all() for g in engine.weighted_grad(weights))
        into = [torch.ones_like(g) for g in engine.weighted_grad(weights)]
        engine.add_weighted_grad(weights, into)
        assert all(torch.isfinite(g).all() for g in into)


def test_auto_falls_back_layer_by_layer_and_logs_the_reason_once(caplog, nets):
    """An unknown layer (PReLU) is materialised alone; the Linear layers keep ghost norms."""
    model = nn.Sequential(nn.Linear(4, 4), nn.PReLU(), nn.Linear(4, 2)).to(DTYPE)
    with caplog.at_level(logging.INFO, logger="dpfair.engine.gradients"):
        assert isinstance(make_engine(model), GhostClipping)
        assert isinstance(make_engine(model), GhostClipping)
    assert len([r for r in caplog.records if "PReLU" in r.getMessage()]) == 1
    with pytest.raises(ValueError, match="PReLU"):
        make_engine(model, "fast")
    x, y, _ = nets.batch((4,), 2, b=5)
    ref = Materialized()
    norms = make_engine(model).compute(model, per_sample_cross_entropy, x, y)
    torch.testing.assert_close(norms, ref.compute(model, per_sample_cross_entropy, x, y))
    assert isinstance(make_engine(nets.mlp(width=4), "materialized"), Materialized)
    with pytest.raises(ValueError, match="engine must be"):
        make_engine(nets.mlp(width=4), "materialised")


def test_loss_must_be_per_sample(nets):
    model = nets.mlp(width=4)
    x, y, _ = nets.batch((12,), 2)
    with pytest.raises(ValueError, match="per sample"):
        GhostClipping().compute(model, nn.CrossEntropyLoss(), x, y)


def test_in_place_output_change_is_caught_without_cloning(nets):
    model = nets.zhao_cnn()
    x, y, _ = nets.batch((1, 28, 28), 10, b=2)
    with pytest.raises(RuntimeError, match="in place"):
        GhostClipping(clone_outputs=False).compute(model, per_sample_cross_entropy, x, y)
    assert make_engine(model).clone_outputs
