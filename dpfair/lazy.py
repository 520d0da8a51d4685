"""Names of a package loaded on first use (PEP 562), so importing the package stays light."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


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
