"""``max_engine_memory`` bounds the whole step's allocations, as the CPU allocator records them,
with the update unchanged; a cap below one sample's step is refused with its floor."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from dpfair.engine.step import PrivateStep
from dpfair.errors import ConfigError
from dpfair.methods import build_method
from dpfair.methods.dpsgd import DpsgdConfig
from dpfair.methods.fairlens import FairLensConfig

B = 192


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
        nn.GroupNorm(4, 16), nn.Tanh(), nn.Flatten(), nn.Linear(16 * 16 * 16, 10),
    ).double()


def _mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, 256), nn.LayerNorm(256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(),
        nn.Linear(256, 10),
    ).double()


MODELS = {"cnn": (_cnn, (3, 16, 16)), "mlp": (_mlp, (64,))}


def _peak_mib(step: PrivateStep, *args) -> float:
    """The most the step allocates above what was allocated when it started (MiB), from the
    allocator's own records (each allocation and free with its running total)."""
    records: list[tuple[int, int, int]] = []

    def walk(event) -> None:
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            records.append((event.start_time_ns, fields.alloc_size, fields.total_allocated))
        for child in event.children:
            walk(child)

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(*args)
    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    records.sort()
    start = records[0][2] - records[0][1]
    return (max(r[2] for r in records) - start) / 2**20


def _step(name: str, cap: int | None, method_config=None) -> tuple[PrivateStep, tuple]:
    build, shape = MODELS[name]
    torch.manual_seed(0)
    model = build()
    method = build_method(method_config or DpsgdConfig(C=1.0), n_groups=2, sigma=1.0,
                          expected_batch_size=B)
    step = PrivateStep(model, method, sigma=1.0, expected_batch_size=B, max_engine_memory=cap)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, *shape, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (B,), generator=gen)
    g = torch.randint(0, 2, (B,), generator=gen)
    return step, (x, y, g)


@pytest.mark.parametrize(("name", "cap"), [("cnn", 6), ("cnn", 24), ("mlp", 4)])
def test_the_cap_bounds_the_measured_peak_and_leaves_the_update(name, cap):
    free, args = _step(name, None)
    capped, _ = _step(name, cap)
    free_peak = _peak_mib(free, *args, torch.Generator().manual_seed(2))
    assert free_peak > cap  # the cap has work to do
    assert _peak_mib(capped, *args, torch.Generator().manual_seed(2)) <= cap
    assert 1 <= capped.cap_batch < B  # it split the batch
    for a, b in zip(free.params, capped.params, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-12)


def test_a_cap_below_one_samples_step_is_refused_with_its_floor():
    step, (x, y, _) = _step("mlp", 1)
    with pytest.raises(ConfigError, match=r"max_engine_memory 1 MiB is below .* needs, (\d+) MiB"
                       ) as info:
        step.plan_memory(x, y)
    floor = int(info.value.args[0].split("set max_engine_memory to at least ")[1].split(",")[0])
    ok, _ = _step("mlp", floor)
    assert ok.plan_memory(x, y) >= 1


def test_a_method_that_cannot_split_its_batch_is_refused_where_the_cap_would_split_it():
    step, (x, y, _) = _step("mlp", 4, FairLensConfig(C=1.0))
    with pytest.raises(ConfigError, match="cannot be split"):
        step.plan_memory(x, y)
