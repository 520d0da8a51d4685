"""Deprecated: ``dpfair.privacy`` was split into three packages, by job.

- :mod:`dpfair.engine`: per-sample gradients and the private step;
- :mod:`dpfair.accounting`: events, PLD, privacy profiles, the noise for a budget;
- :mod:`dpfair.methods`: the training methods.

Every old import path (``dpfair.privacy.accounting``, ``dpfair.privacy.methods.dpsgd``, ...)
still works for one release and warns with its new place.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

#: old module under ``dpfair.privacy`` -> its new place
MOVED = {
    **{name: f"dpfair.engine.{name}" for name in (
        "ascent", "conv_factors", "factors", "gradients", "layer_dots", "layer_fallback",
        "layer_grads", "low_memory", "model_check", "regularised", "step")},
    "accounting": "dpfair.accounting.accountant",
    "budget": "dpfair.accounting.calibration",
    "dp_accounting_private": "dpfair.accounting.dp_accounting_private",
    "events": "dpfair.accounting.events",
    "group_accounting": "dpfair.accounting.per_group",
    "pld": "dpfair.accounting.pld",
    "profiles": "dpfair.accounting.profiles",
    "repeat_select": "dpfair.accounting.repeat_select",
    "methods": "dpfair.methods",
}


def new_name(old: str) -> str | None:
    """``dpfair.privacy.X[.Y]`` -> the module's new name, or None when X never lived here."""
    prefix = f"{__name__}."
    if not old.startswith(prefix):
        return None
    head, _, rest = old[len(prefix):].partition(".")
    if head not in MOVED:
        return None
    return MOVED[head] + (f".{rest}" if rest else "")


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old name as the module at its new place (the same module object)."""

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001, ANN201 - importlib's API
        if new_name(fullname) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return types.ModuleType(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        target = new_name(module.__name__)
        warnings.warn(f"{module.__name__} moved to {target}; import it from there "
                      "(the old path goes in the next release)", DeprecationWarning, stacklevel=2)
        # importlib returns whatever sys.modules holds under the name once this returns
        sys.modules[module.__name__] = importlib.import_module(target)


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
