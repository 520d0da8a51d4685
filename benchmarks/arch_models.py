"""The architectures of issue #18's step-time settings, on random inputs of the right shape.

* :class:`TransformerClassifier` -- token embedding (vocab x dim) and a position embedding
  (called on batched position ids, so every layer carries the batch axis), ``blocks``
  pre-norm blocks of LayerNorm + self-attention built from Linear layers + a GELU MLP, final
  LayerNorm, mean pooling, a linear head. Issue: vocab 8000, dim 256, 4 blocks, T = 128.
* :func:`wide_resnet` -- WideResNet-16-4 (Zagoruyko & Komodakis 2016: 3 groups of 2
  pre-activation basic blocks, widths 16k, 32k, 64k with k = 4) with GroupNorm instead of
  BatchNorm (samples must not interact), for 3 x 32 x 32 inputs.
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """Pre-norm transformer block: attention from a qkv Linear and an output Linear, then MLP."""

    def __init__(self, dim: int, heads: int, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or 4 * dim
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, dim = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        att = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, dim))
        return x + self.mlp(self.ln2(x))


class TransformerClassifier(nn.Module):
    def __init__(
        self, vocab: int, dim: int, blocks: int, seq: int, classes: int, heads: int = 4
    ) -> None:
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(blocks)))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).repeat(len(ids), 1)
        h = self.blocks(self.embed(ids) + self.pos(positions))
        return self.head(self.ln(h).mean(1))


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(32, channels // 4), channels)


class WideBlock(nn.Module):
    """Pre-activation basic block: GN-ReLU-conv3x3-GN-ReLU-conv3x3, 1x1 shortcut on change."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.n1, self.c1 = _norm(c_in), nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.n2, self.c2 = _norm(c_out), nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.short = (
            nn.Conv2d(c_in, c_out, 1, stride, bias=False)
            if stride != 1 or c_in != c_out else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.n1(x))
        out = self.c2(torch.relu(self.n2(self.c1(h))))
        return out + (x if self.short is None else self.short(h))


def wide_resnet(depth: int = 16, k: int = 4, classes: int = 10) -> nn.Module:
    """WideResNet-depth-k with GroupNorm, for 3 x 32 x 32 inputs."""
    n = (depth - 4) // 6
    widths = [16, 16 * k, 32 * k, 64 * k]
    layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)]
    for group in range(3):
        for i in range(n):
            c_in = widths[group] if i == 0 else widths[group + 1]
            layers.append(WideBlock(c_in, widths[group + 1], 2 if group and i == 0 else 1))
    layers += [_norm(widths[3]), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
               nn.Linear(widths[3], classes)]
    return nn.Sequential(*layers)
