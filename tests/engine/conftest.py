"""Small versions of the papers' models (the real ones live in dpfair.models), in float64.

Test modules are imported in importlib mode, so the helpers reach them as the ``nets`` fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor, nn

DTYPE = torch.float64


class Sequences(nn.Module):
    """Linear layers on sequences (batch, 3, 5), one called twice: two calls of one module,
    each with its own group sums."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(5, width), nn.Linear(width, width), nn.Linear(
            width, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.b(torch.tanh(self.a(x))))
        return self.head(torch.tanh(self.b(h)).mean(1))


class ConvNorms(nn.Module):
    """Convolutions (reflect padding, a frozen bias), GroupNorm, LayerNorm and a Linear head of
    ``classes`` outputs: the engine's group sums and each layer's tangent ``f(a; V)``."""

    def __init__(self, classes: int = 2, first: Callable[[Tensor], Tensor] = torch.relu) -> None:
        super().__init__()
        self.first = first
        self.c1 = nn.Conv2d(2, 4, 3, padding=1, padding_mode="reflect")
        self.gn, self.c2 = nn.GroupNorm(2, 4), nn.Conv2d(4, 4, 3, stride=2)
        self.ln, self.fc = nn.LayerNorm(16), nn.Linear(16, classes)
        self.c2.bias.requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        h = self.first(self.gn(self.c1(x)))
        return self.fc(torch.tanh(self.ln(torch.tanh(self.c2(h)).flatten(1))))


def mlp(d_in: int = 12, width: int = 256, n_classes: int = 2) -> nn.Module:
    """Esipova's / Xu's tabular MLP: two hidden tanh layers."""
    return nn.Sequential(
        nn.Linear(d_in, width),
        nn.Tanh(),
        nn.Linear(width, width),
        nn.Tanh(),
        nn.Linear(width, n_classes),
    ).to(DTYPE)


def esipova_cnn() -> nn.Module:
    """Esipova's MNIST CNN: conv 32 and 16 channels, 3x3, tanh, then a linear head (28x28)."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.Tanh(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 16, 3, padding=1),
        nn.Tanh(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 7 * 7, 10),
    ).to(DTYPE)


def zhao_cnn(filters: int = 8, hidden: int = 24) -> nn.Module:
    """Zhao's two-layer CNN (64 filters, FC 500-500, ReLU) at a small width; in-place ReLUs."""
    return nn.Sequential(
        nn.Conv2d(1, filters, 5),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(filters, filters, 5),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(filters * 4 * 4, hidden),
        nn.ReLU(inplace=True),
        nn.Linear(hidden, hidden),
        nn.ReLU(inplace=True),
        nn.Linear(hidden, 10),
    ).to(DTYPE)


MODELS = {
    "mlp": (mlp, (12,), 2),
    "esipova_cnn": (esipova_cnn, (1, 28, 28), 10),
    "zhao_cnn": (zhao_cnn, (1, 28, 28), 10),
}


def batch(shape: tuple[int, ...], n_classes: int, b: int = 6, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, *shape, generator=gen, dtype=DTYPE)
    y = torch.randint(0, n_classes, (b,), generator=gen)
    g = torch.randint(0, 2, (b,), generator=gen)
    return x, y, g


@pytest.fixture
def nets() -> SimpleNamespace:
    return SimpleNamespace(
        DTYPE=DTYPE, MODELS=MODELS, batch=batch, mlp=mlp, esipova_cnn=esipova_cnn, zhao_cnn=zhao_cnn
    )


@pytest.fixture(params=sorted(MODELS))
def model_and_batch(request):
    """Each of the papers' models, seeded, with a batch ``(x, y, g)`` of 4."""
    make, shape, n_classes = MODELS[request.param]
    torch.manual_seed(0)
    return make(), *batch(shape, n_classes, b=4)
