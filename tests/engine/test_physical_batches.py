"""Physical batches (issue #18): a logical batch formed in chunks gives the same step as one
chunk (1e-5), for rules that need every norm of the batch first, with noise drawn once."""

from __future__ import annotations

import copy

import pytest
import torch
from pydantic import TypeAdapter
from torch import nn

from dpfair.engine.step import PrivateStep
from dpfair.errors import ConfigError
from dpfair.methods import MethodConfig, build_method

TOL = 1e-5
METHODS = [
    {"name": "dpsgd", "C": 0.5},
    {"name": "dpsgd_global", "C0": 0.5, "Z": 5.0},  # weights scale with the batch's norms
    {"name": "dpsgd_f", "C0": 0.5},  # counts of the whole batch set the bounds
    {"name": "adaclip"},
    {"name": "dp_sat", "C": 0.5},
    {"name": "bam", "C": 0.5},
    {"name": "nonprivate"},
]


def method(config: dict):
    cfg = TypeAdapter(MethodConfig).validate_python(config)
    return build_method(cfg, n_groups=2, sigma=1.0, expected_batch_size=8.0)


def mlp(dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 16), nn.Tanh(), nn.Dropout(dropout), nn.Linear(16, 3)
    ).to(torch.float64)


def batch(b: int = 11):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(b, 6, generator=gen, dtype=torch.float64)
    return x, torch.randint(0, 3, (b,), generator=gen), torch.randint(0, 2, (b,), generator=gen)


def flat(state: dict) -> list[float]:
    return [v for value in state.values() for v in (value if isinstance(value, list) else [value])]


@pytest.mark.parametrize("config", METHODS, ids=[m["name"] for m in METHODS])
def test_chunks_give_the_step_of_one_chunk(config):
    base, (x, y, g) = mlp(), batch()
    results = []
    for chunk in (None, 4):
        model = copy.deepcopy(base)
        step = PrivateStep(model, method(config), sigma=1.0, expected_batch_size=8.0,
                           max_physical_batch=chunk)
        infos = [step(x, y, g, torch.Generator().manual_seed(2)) for _ in range(2)]
        results.append(([p.grad.clone() for p in model.parameters()], infos))
    (one, one_infos), (chunked, chunked_infos) = results
    for a, b in zip(one, chunked, strict=True):
        torch.testing.assert_close(a, b, atol=TOL, rtol=TOL)
    for a, b in zip(one_infos, chunked_infos, strict=True):
        assert a.sensitivity == pytest.approx(b.sensitivity)
        assert a.nonprivate_batch_loss == pytest.approx(b.nonprivate_batch_loss)
        assert flat(a.state) == pytest.approx(flat(b.state))


def test_the_second_pass_replays_the_first_pass_dropout_masks(monkeypatch):
    """With dropout, each chunk's re-formed norms equal its first norms (no weight shrinks)."""
    from dpfair.engine import step as step_module

    factors = []

    def recording(first, again):
        factors.append(step_module._shrink.__wrapped__(first, again))
        return factors[-1]

    recording.__wrapped__ = step_module._shrink  # type: ignore[attr-defined]
    monkeypatch.setattr(step_module, "_shrink", recording)
    model = mlp(dropout=0.5)
    step = PrivateStep(model, method({"name": "dpsgd", "C": 0.5}), sigma=1.0,
                       expected_batch_size=8.0, max_physical_batch=3)
    step(*batch(), torch.Generator().manual_seed(2))
    assert len(factors) == 3 and all((f == 1).all() for f in factors)


def test_a_reformed_norm_above_the_first_cannot_raise_a_contribution():
    """The second pass's safety net: were a re-formed gradient larger, its weight shrinks."""
    from dpfair.engine.step import _shrink

    first = torch.tensor([1.0, 2.0, 3.0, 1.0])
    again = torch.tensor([1.0, 4.0, 1.0, float("inf")])
    factor = _shrink(first, again)
    torch.testing.assert_close(factor, torch.tensor([1.0, 0.5, 1.0, 0.0]))
    assert (factor * again)[:3].le(first[:3]).all()


def test_fairlens_refuses_chunks_and_bad_sizes_are_refused():
    model = nn.Linear(3, 2)
    with pytest.raises(ConfigError, match="cannot be split"):
        PrivateStep(model, method({"name": "fairlens"}), sigma=1.0, expected_batch_size=8.0,
                    max_physical_batch=4)
    with pytest.raises(ConfigError, match="max_physical_batch"):
        PrivateStep(model, method({"name": "dpsgd"}), sigma=1.0, expected_batch_size=8.0,
                    max_physical_batch=0)
