"""The loop's optimizers make torch.optim's updates, and the loop loads no torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from dpfair.training.optim import Adam, Sgd


def _models(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    other = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    other.load_state_dict(model.state_dict())
    return model, other


@pytest.mark.parametrize(("kind", "options"), [
    ("sgd", {}),
    ("sgd", {"momentum": 0.9}),
    ("sgd", {"momentum": 0.5, "weight_decay": 0.01}),
    ("adam", {}),
    ("adam", {"weight_decay": 0.1}),
])
def test_updates_equal_torch_optims_step_by_step(kind, options):
    ours_model, torch_model = _models()
    ours_cls, torch_cls = (Sgd, torch.optim.SGD) if kind == "sgd" else (Adam, torch.optim.Adam)
    ours = ours_cls(ours_model.parameters(), lr=0.05, **options)
    reference = torch_cls(torch_model.parameters(), lr=0.05, **options)
    gen = torch.Generator().manual_seed(1)
    for step in range(6):
        x = torch.randn(8, 5, generator=gen, dtype=torch.float64)
        for model, opt in ((ours_model, ours), (torch_model, reference)):
            opt.zero_grad(set_to_none=True)
            model(x).square().sum().backward()
            if step == 2:  # a parameter without a gradient is left alone, as torch does
                model[0].bias.grad = None
            opt.step()
        for a, b in zip(ours_model.parameters(), torch_model.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-15)


def test_an_empty_parameter_list_is_refused():
    with pytest.raises(ValueError, match="empty parameter list"):
        Sgd([], lr=0.1)


def test_training_imports_no_dynamo():
    """torch.optim's optimizers import torch._dynamo (seconds); the loop's do not."""
    code = (
        "import sys, torch\n"
        "from dpfair.training.optim import Adam, Sgd\n"
        "m = torch.nn.Linear(3, 2)\n"
        "for opt in (Sgd(m.parameters(), lr=0.1, momentum=0.9), Adam(m.parameters(), lr=0.1)):\n"
        "    m(torch.randn(4, 3)).sum().backward(); opt.step(); opt.zero_grad()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
