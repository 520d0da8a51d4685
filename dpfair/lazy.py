"""Names of a package (PEP 562) and whole modules loaded on first use, so importing stays light."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import cast


def lazy_getattr(package: str, modules: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: name ``n`` is imported from the submodule
    ``modules[n]`` when first asked for, then kept in the package like an eager import."""

    def __getattr__(name: str) -> object:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


class _LazyModule:
    """Stands for the module ``name`` and imports it when one of its attributes is first read."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> object:
        module = sys.modules.get(self._name) or importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported on first use>"


def lazy_module(name: str) -> ModuleType:
    """The module ``name``, imported when first used: ``torch = lazy_module("torch")`` lets a
    module that defines settings beside their torch code be imported, and its settings
    checked, before torch loads (about 2 s)."""
    return cast(ModuleType, _LazyModule(name))
