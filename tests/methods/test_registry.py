"""The method registry: discovery, one name per method, the union, did-you-mean, and a new
method with a side release working end to end from its own module alone."""

from __future__ import annotations

import math
from typing import Literal

import pytest
import torch
from dp_accounting import dp_event
from pydantic import PositiveFloat, TypeAdapter, ValidationError

from dpfair import accounting
from dpfair.methods import (
    COUNT_SIGMA_FACTOR,
    BuildContext,
    MethodConfig,
    MethodSpec,
    build_method,
    method_config_union,
    register_method,
    registered_methods,
)
from dpfair.methods import registry as registry_module
from dpfair.methods.dpsgd import Dpsgd, DpsgdConfig

BUILTIN = {
    "adaclip",
    "adaptive",
    "bam",
    "bounded_adaptive",
    "dp_sat",
    "dpsgd",
    "dpsgd_f",
    "dpsgd_global",
    "dpsgd_global_adapt",
    "fairlens",
    "naive_reweight",
    "nonprivate",
}


def test_every_builtin_module_is_discovered_and_in_the_union():
    assert BUILTIN <= set(registered_methods())
    adapter = TypeAdapter(MethodConfig)
    for name, spec in registered_methods().items():
        example = spec.example()
        assert example.name == name and isinstance(example, spec)
        assert adapter.validate_python(example.model_dump()) == example
        method = build_method(example, n_groups=2, sigma=1.0, expected_batch_size=10)
        assert isinstance(method, spec.method_class)
        assert method.privacy_guarantee == example.privacy_guarantee
        assert method.is_private == example.is_private == (name != "nonprivate")


def test_a_name_registered_twice_raises(monkeypatch):
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))

    class AnotherDpsgd(DpsgdConfig):
        pass

    with pytest.raises(ValueError, match="method name 'dpsgd' is registered twice"):
        register_method(AnotherDpsgd)
    assert register_method(DpsgdConfig) is DpsgdConfig  # the same class again is harmless


def test_an_unknown_method_names_the_close_one():
    with pytest.raises(ValidationError) as info:
        TypeAdapter(MethodConfig).validate_python({"name": "dpsgdd"})
    message = str(info.value)
    assert "unknown method 'dpsgdd'; did you mean 'dpsgd'?" in message
    assert "(methods: adaclip, adaptive," in message


def test_count_noise_defaults_to_ten_sigma():
    assert COUNT_SIGMA_FACTOR == 10
    ctx = BuildContext(n_groups=2, sigma=0.7, expected_batch_size=10)
    assert ctx.count_sigma(None) == pytest.approx(7.0) and ctx.count_sigma(2.0) == 2.0


class CountedDpsgd(Dpsgd):
    """A new method with a side release: DPSGD that also releases how many samples it clipped."""

    def __init__(self, C: float, count_sigma: float) -> None:
        super().__init__(C, name="counted_dpsgd")
        self.count_sigma = count_sigma
        self.clipped = math.nan

    def counts(self, norms: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        return (norms > self.C).sum().to(norms.dtype).reshape(1)

    def update(self, noisy_counts: torch.Tensor) -> None:
        self.clipped = float(noisy_counts)


class CountedDpsgdConfig(MethodSpec):
    method_class = CountedDpsgd
    name: Literal["counted_dpsgd"] = "counted_dpsgd"
    C: PositiveFloat = 1.0
    sigma_count: PositiveFloat | None = None

    def build(self, ctx: BuildContext) -> CountedDpsgd:
        return CountedDpsgd(self.C, ctx.count_sigma(self.sigma_count))

    @classmethod
    def example(cls) -> CountedDpsgdConfig:
        return cls(C=0.7)


def test_a_new_method_needs_only_its_own_module(monkeypatch):
    """Registered, it validates through the union, builds, and its side release is accounted."""
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    register_method(CountedDpsgdConfig)
    cfg = TypeAdapter(method_config_union()).validate_python({"name": "counted_dpsgd"})
    method = build_method(cfg, n_groups=2, sigma=0.8, expected_batch_size=10)
    step = method.step_event(0.8)
    assert step == dp_event.ComposedDpEvent(
        [dp_event.GaussianDpEvent(0.8), dp_event.GaussianDpEvent(8.0)]
    )
    run = accounting.run_event(step, 0.01, 100)
    reduced = accounting.run_event(dp_event.GaussianDpEvent((0.8**-2 + 8.0**-2) ** -0.5), 0.01, 100)
    assert accounting.epsilon(run, 1e-5) == pytest.approx(accounting.epsilon(reduced, 1e-5))
    rule = method.step_rule(torch.tensor([0.5, 2.0, 3.0]), torch.zeros(3, dtype=int), gen(0))
    assert rule.sensitivity == 1.0 and math.isfinite(method.clipped)


def test_discovery_imports_every_module_of_a_package(tmp_path, monkeypatch):
    """A method file dropped into a methods package is registered without any other edit."""
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    package = tmp_path / "more_methods"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "plain.py").write_text(
        "from typing import Literal\n"
        "from dpfair.methods.dpsgd import Dpsgd, DpsgdConfig\n"
        "from dpfair.methods.registry import register_method\n"
        "@register_method\n"
        "class PlainConfig(DpsgdConfig):\n"
        "    name: Literal['plain'] = 'plain'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry_module.discover("more_methods")
    assert registered_methods()["plain"].__module__ == "more_methods.plain"


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)
