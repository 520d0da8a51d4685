"""The step-time benchmark's yardsticks measure what they claim to."""

from __future__ import annotations

import copy
from types import ModuleType

import pytest
import torch

from dpfair.models import build_model, parse_model_config
from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def step_speed() -> ModuleType:
    return load_benchmark("step_speed")


def test_hand_written_dpsgd_is_the_same_update_as_dpfairs_dpsgd(step_speed):
    """The yardstick does dpsgd's work, no less: three steps from one model and one noise seed
    end where dpfair's dpsgd ends, and the parameters did move."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 12, generator=gen)
    y = torch.randint(0, 2, (64,), generator=gen)
    g = torch.randint(0, 2, (64,), generator=gen)
    torch.manual_seed(0)
    base = build_model(parse_model_config({"name": "mlp", "hidden": [16, 16]}), (12,), 2)
    ours, written = copy.deepcopy(base), copy.deepcopy(base)
    arms = [
        step_speed.method_arm("dpsgd", {"name": "dpsgd", "C": 1.0}, ours, (x, y, g), 2),
        step_speed.handwritten_arm(written, x, y, 64),
    ]
    for _ in range(3):
        for arm in arms:
            arm.step()
    for p, q, p0 in zip(ours.parameters(), written.parameters(), base.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6)
        assert not torch.equal(p, p0)


@pytest.mark.parametrize("index", [3, 4], ids=["transformer", "wide_resnet"])
def test_issue_18_models_take_the_fast_path_at_every_layer(step_speed, index):
    """The benchmark's transformer and WideResNet measure the fast path, not a fallback: no
    layer is materialised and every layer runs on the batch axis."""
    from dpfair.engine.gradients import plan_layers, probe_calls

    setting = step_speed.SETTINGS[index]
    model, (x, _, _), info = step_speed._synthetic(setting, torch.device("cpu"), 0)
    plan = plan_layers(model)
    assert plan.slow == [] and len(plan.fast) > 10
    assert probe_calls(model, plan, x[:2])[0] == []
    assert info["n_params"] == sum(p.numel() for p in model.parameters())


def test_kernel_count_and_allocator_records_read_a_profile(step_speed):
    """Views and allocations launch nothing, a composite op counts its parts, a _foreach_ op
    counts once; the allocator's records see a tensor freed before the step ends at the peak
    and not at the end, where the kept result is."""
    from torch.profiler import ProfilerActivity, profile

    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        c = torch.mm(a, b).t().unsqueeze(0)  # one kernel, then views
        torch.linalg.vecdot(a, b)  # composite: mul and sum
        torch._foreach_add_([a, b], [b, a])  # one launch
        big = torch.empty(1 << 20)  # 4 MiB, allocated and freed: no kernel
        big.fill_(1.0)  # one kernel
        del big
    events = list(prof.events())
    assert step_speed.kernel_count(events) == 5
    start, peak, end = step_speed.allocator_records(prof)
    assert peak - start >= (4 << 20) + (end - start) and end - start >= 64 * 64 * 4
    assert c.numel() == 64 * 64
