"""bf16 autocast (issue #18): forward and backward in bfloat16, while norms, weights, noise and
the summed update stay in float32, so clipping still bounds each sample's contribution."""

from __future__ import annotations

import pytest
import torch
from pydantic import TypeAdapter
from torch import nn

from dpfair.engine.step import PrivateStep
from dpfair.methods import MethodConfig, build_method

C = 0.05


class Mixed(nn.Module):
    """Embedding, Linear on a sequence, LayerNorm, and a layer materialised alone (PReLU)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(30, 16)
        self.lin = nn.Linear(16, 32)
        self.ln = nn.LayerNorm(32)
        self.act = nn.PReLU()
        self.head = nn.Linear(32, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.ln(self.lin(self.embed(ids)))).mean(1))


@pytest.mark.parametrize("engine", ["auto", "materialized"])
def test_clipping_bounds_every_contribution_under_bf16_autocast(engine):
    torch.manual_seed(0)
    model = Mixed()
    gen = torch.Generator().manual_seed(0)
    ids, y = torch.randint(0, 30, (8, 5), generator=gen), torch.randint(0, 3, (8,), generator=gen)
    cfg = TypeAdapter(MethodConfig).validate_python({"name": "dpsgd", "C": C})
    method = build_method(cfg, n_groups=2, sigma=0.0, expected_batch_size=1.0)
    step = PrivateStep(model, method, sigma=0.0, expected_batch_size=1.0, engine=engine,
                       autocast="bf16")
    with step._precision(ids.device):
        norms = step.engine.compute(model, step.loss_fn, ids, y)
    assert norms.dtype == torch.float32 and (norms > C).all()  # every sample is clipped
    for i in range(len(ids)):
        weights = torch.zeros(len(ids))
        weights[i] = min(1.0, C / float(norms[i]))
        contribution = step.engine.weighted_grad(weights)
        assert all(g.dtype == torch.float32 for g in contribution)
        size = torch.cat([g.flatten() for g in contribution]).norm()
        assert size <= C * (1 + 1e-5)
        assert size == pytest.approx(C, rel=1e-4)  # the norm is the norm of what is summed
    info = step(ids, y, torch.zeros(8, dtype=torch.long), torch.Generator().manual_seed(1))
    assert info.sensitivity == pytest.approx(C)
    assert all(p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()
               for p in model.parameters())
