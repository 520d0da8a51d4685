"""The fast path on sequence models (issue #18): embeddings, Linear and LayerNorm on (B, T, d)
inputs, attention built from Linear layers, and unknown layers materialised one at a time, each
against the materialised reference engine (float64, 1e-5)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from dpfair.engine.gradients import GhostClipping, Materialized, make_engine, plan_layers
from dpfair.engine.layer_grads import materialise_reason
from dpfair.engine.step import per_sample_cross_entropy
from tests.conftest import load_benchmark

Block = load_benchmark("arch_models").Block  # the benchmark's transformer block

TOL = 1e-5
DTYPE = torch.float64


class Transformer(nn.Module):
    """Token and position embeddings, blocks, final LayerNorm, mean pooling, a linear head."""

    def __init__(
        self, vocab: int = 50, dim: int = 16, heads: int = 2, hidden: int = 32, blocks: int = 2,
        seq: int = 7, classes: int = 3, padding_idx: int | None = 0,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=padding_idx)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads, hidden) for _ in range(blocks)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).expand(len(ids), -1)
        h = self.blocks(self.embed(ids) + self.pos(positions))
        return self.head(self.ln(h).mean(1))


def token_batch(b: int = 6, t: int = 7, vocab: int = 50, seed: int = 0):
    """Token ids with repeats inside each sample (few distinct ids) and padding, labels."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 6, (b, t), generator=gen)  # ids 0..5: many repeats, 0 is padding
    ids[:, -1] = torch.randint(0, vocab, (b,), generator=gen)
    return ids, torch.randint(0, 3, (b,), generator=gen)


def assert_paths_agree(fast, model: nn.Module, x, y) -> None:
    ref = Materialized()
    norms = fast.compute(model, per_sample_cross_entropy, x, y)
    torch.testing.assert_close(norms, ref.compute(model, per_sample_cross_entropy, x, y),
                               atol=TOL, rtol=TOL)
    weights = torch.rand(len(x), generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    weights[0] = 0.0
    for a, b in zip(fast.weighted_grad(weights), ref.weighted_grad(weights), strict=True):
        torch.testing.assert_close(a, b, atol=TOL, rtol=TOL)


def test_transformer_takes_the_fast_path_and_agrees_with_the_reference():
    torch.manual_seed(0)
    model = Transformer().to(DTYPE)
    assert plan_layers(model).slow == []
    fast = make_engine(model, "fast")
    assert isinstance(fast, GhostClipping)
    assert_paths_agree(fast, model, *token_batch())


def test_embedding_norms_count_repeated_tokens_once_per_row():
    """A sample repeating one token: its gradient row is the sum of the output gradients."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(5, 3), nn.Flatten(), nn.Linear(12, 2)).to(DTYPE)
    ids = torch.tensor([[1, 1, 1, 1], [1, 2, 3, 4], [4, 4, 2, 2]])
    assert_paths_agree(make_engine(model, "fast"), model, ids, torch.tensor([0, 1, 1]))


class Scale(nn.Module):
    """A layer the fast path has no rule for: a learnt per-feature scale."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain


class Mixed(nn.Module):
    """Known layers around unknown ones: PReLU, a custom scale, and nn.MultiheadAttention
    (which uses its out_proj weight without calling it)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.lin = nn.Linear(8, 8)
        self.act = nn.PReLU()
        self.scale = Scale(8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        h = h + self.attn(h, h, h, need_weights=False)[0]
        h = self.scale(self.act(self.lin(h)))
        return self.head(h.mean(1))


def test_unknown_layers_fall_back_one_by_one_and_log_it_once(caplog):
    torch.manual_seed(0)
    model = Mixed().to(DTYPE)
    slow = {name: why for name, _, why in plan_layers(model).slow}
    assert set(slow) == {"attn", "act", "scale"}
    assert "PReLU" in slow["act"] and "Scale" in slow["scale"]
    with caplog.at_level(logging.INFO, logger="dpfair.engine.gradients"):
        engines = [make_engine(model), make_engine(model)]
    assert all(isinstance(e, GhostClipping) for e in engines)
    assert len([r for r in caplog.records if "layer by layer" in r.getMessage()]) == 1
    with pytest.raises(ValueError, match="PReLU"):
        make_engine(model, "fast")
    ids, y = token_batch(b=5, t=4, vocab=20)
    assert_paths_agree(engines[0], model, ids, y)


def test_materialise_reason_names_the_layer_and_what_is_fast():
    assert materialise_reason(nn.Linear(2, 2)) is None
    assert materialise_reason(nn.Embedding(4, 2)) is None
    assert materialise_reason(nn.ReLU()) is None  # no parameters: nothing to do
    assert "nn.PReLU" in materialise_reason(nn.PReLU())
    assert "scale_grad_by_freq" in materialise_reason(nn.Embedding(4, 2, scale_grad_by_freq=True))
    frozen = nn.PReLU().requires_grad_(False)
    assert materialise_reason(frozen) is None


def test_frequency_scaled_embedding_falls_back_per_sample():
    """scale_grad_by_freq counts tokens per sample on the layer's own vmap, as the reference."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(10, 4, scale_grad_by_freq=True), nn.Flatten(), nn.Linear(20, 2)
    ).to(DTYPE)
    ids = torch.tensor([[1, 1, 2, 3, 1], [4, 4, 4, 4, 4], [0, 1, 2, 3, 9]])
    assert_paths_agree(make_engine(model), model, ids, torch.tensor([0, 1, 0]))


def test_tied_weights_send_the_model_to_the_materialised_path():
    embed = nn.Embedding(6, 4)
    head = nn.Linear(4, 6, bias=False)
    head.weight = embed.weight
    assert isinstance(make_engine(nn.Sequential(embed, nn.Flatten(), head)), Materialized)


class DroppedScale(Scale):
    """An unknown layer drawing randomness inside its own forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(x, 0.5, training=True) * self.gain


def test_a_fallback_layer_with_randomness_is_refused():
    """Its recomputation on single samples would be another function: an error, not a norm."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), DroppedScale(4), nn.Linear(4, 2)).to(DTYPE)
    x = torch.randn(8, 4, dtype=DTYPE)
    with pytest.raises(RuntimeError, match="did not reproduce"):
        make_engine(model).compute(model, per_sample_cross_entropy, x, torch.zeros(8).long())


class SharedPositions(Transformer):
    """Position embeddings of ``arange(T)`` broadcast over the batch: no batch axis."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = self.pos(torch.arange(ids.shape[1])).unsqueeze(0)
        return self.head(self.ln(self.blocks(self.embed(ids) + pos)).mean(1))


def test_a_layer_without_the_batch_axis_sends_the_model_to_the_materialised_path(caplog):
    """Even where T equals the batch size, which output shapes alone cannot tell apart."""
    torch.manual_seed(0)
    model = SharedPositions(seq=6).to(DTYPE)
    with caplog.at_level(logging.INFO, logger="dpfair.engine.gradients"):
        assert_paths_agree(make_engine(model), model, *token_batch(b=6, t=6))
    assert any("pos run on an input without the batch axis" in r.getMessage()
               for r in caplog.records)
