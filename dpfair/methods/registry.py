"""The method registry: a method is one module plus ``@register_method``.

Each module of this package holds a method's pydantic config (a :class:`MethodSpec`, strict,
frozen, discriminated on its ``name`` literal), its rule (a :class:`Method`) and the
registration of the config. :func:`registered_methods` imports every module of the package
first (:func:`discover`), so a new method file needs no edit anywhere else; the union
``dpfair.methods.MethodConfig`` is :func:`method_config_union` of what it finds.

Count noise defaults to ``COUNT_SIGMA_FACTOR`` times the gradient noise multiplier, the papers'
setting: Xu 6.1.3 (``sigma1 = 10 sigma``), Esipova App. B (``sigma_2 ~ 10 sigma``), Zhao App. A.3
(``sigma_count = 10 sigma``); a config's ``None`` count noise means that default.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, ClassVar, Self, TypeVar, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from dpfair.errors import did_you_mean
from dpfair.methods.base import Method, PrivacyGuarantee

#: count noise defaults to this multiple of the gradient noise multiplier (Xu, Esipova, Zhao).
COUNT_SIGMA_FACTOR = 10.0


@dataclass(frozen=True)
class BuildContext:
    """What a method is built for: the number of groups, the gradient noise multiplier σ and
    the expected batch size ``q n``."""

    n_groups: int
    sigma: float
    expected_batch_size: float

    def count_sigma(self, value: float | None) -> float:
        """A count release's noise std: ``value``, or ``COUNT_SIGMA_FACTOR * sigma`` if None."""
        return COUNT_SIGMA_FACTOR * self.sigma if value is None else value


class MethodSpec(BaseModel):
    """A method's configuration; subclasses set ``name: Literal["..."]`` with that default,
    ``method_class`` (the rule they build), :meth:`build` and :meth:`example`. Every number
    is finite: an infinite clip bound would bound no one's contribution (sensitivity ∞)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    #: the rule this config builds; its ``privacy_guarantee`` is the config's.
    method_class: ClassVar[type[Method]]
    name: str

    @property
    def privacy_guarantee(self) -> PrivacyGuarantee:
        return self.method_class.privacy_guarantee

    @property
    def is_private(self) -> bool:
        """False only for the non-private baseline (it needs no σ and has ε = ∞)."""
        return self.privacy_guarantee != "none"

    @abstractmethod
    def build(self, ctx: BuildContext) -> Method:
        """A fresh rule (initial state) for ``ctx``."""

    @classmethod
    @abstractmethod
    def example(cls) -> Self:
        """A representative config at settings where the rule bites on unit-scale gradients
        (property tests run every registered method at its example)."""


_REGISTRY: dict[str, type[MethodSpec]] = {}
_Spec = TypeVar("_Spec", bound=type[MethodSpec])


def register_method(spec: _Spec) -> _Spec:
    """Class decorator: registers a :class:`MethodSpec` under its ``name``; a name taken by
    another class raises ``ValueError``."""
    if inspect.isabstract(spec):
        raise TypeError(f"{spec.__qualname__} leaves {sorted(spec.__abstractmethods__)} abstract")
    name = spec.model_fields["name"].default
    if not isinstance(name, str):
        raise TypeError(f"{spec.__qualname__} needs a default name, e.g. name: Literal['x'] = 'x'")
    taken = _REGISTRY.get(name)
    if taken is not None and taken is not spec:
        raise ValueError(
            f"method name {name!r} is registered twice: {taken.__module__}.{taken.__qualname__} "
            f"and {spec.__module__}.{spec.__qualname__}"
        )
    _REGISTRY[name] = spec
    return spec


def discover(package: str = __package__) -> None:
    """Imports every module of ``package`` (default: this one); each registers its methods."""
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        importlib.import_module(f"{package}.{info.name}")


def registered_methods() -> dict[str, type[MethodSpec]]:
    """Every registered method config by name, the built-in ones included, sorted by name."""
    discover()
    return dict(sorted(_REGISTRY.items()))


def _known_name(value: object) -> object:
    """An unknown method name is an error naming the close one and every known one."""
    name = value.get("name") if isinstance(value, Mapping) else None
    if isinstance(name, str) and name not in _REGISTRY:
        known = sorted(_REGISTRY)
        raise ValueError(
            f"unknown method {name!r}{did_you_mean(name, known)} (methods: {', '.join(known)})"
        )
    return value


def method_config_union() -> object:
    """``Annotated[Union[<every registered config>], Field(discriminator="name")]``."""
    specs = tuple(registered_methods().values())
    return Annotated[Union[specs], Field(discriminator="name"), BeforeValidator(_known_name)]  # noqa: UP007


def build_method(
    cfg: MethodSpec, *, n_groups: int, sigma: float, expected_batch_size: float
) -> Method:
    """The method ``cfg`` names, for ``n_groups`` groups, noise multiplier ``sigma`` and
    expected batch size ``q n``."""
    return cfg.build(BuildContext(n_groups, sigma, expected_batch_size))
