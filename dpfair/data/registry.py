"""Dataset registry: name -> (options model, loader), and kind -> (options model, loader).

Built-in datasets register under their name (``@register``). A user's own dataset is declared in
params.yaml by its options alone: a ``kind:`` key (``table``, ``image_folder``) picks the loader
registered with ``@register_kind``, and the dataset takes the name it was declared under, so no
Python registration is needed.

``load_dataset(name, options, inspect=...)`` validates ``options`` (a mapping, an options model
or None for the defaults) against the dataset's pydantic model and calls its loader (a kind's
loader hands ``inspect`` the dataset's preview before its split; a built-in dataset's preview is
inspected once it has loaded). It then checks the values the loader produced
(``checks.check_values``: finite features, integer ids in range), so every loader is covered,
and records the source's version (``source_version``: the version the dataset's module declares,
``version.py``) as ``meta["data_version"]``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from dpfair.data.checks import check_values
from dpfair.data.dataset import DatasetPreview, GroupedDataset, Inspect
from dpfair.data.options import DatasetOptions
from dpfair.data.version import builtin_version
from dpfair.errors import ConfigError, did_you_mean, format_validation_error

Loader = Callable[[Any], GroupedDataset]
#: ``loader(name, options, inspect)`` of a kind: calls ``inspect`` (when given) before the split.
KindLoader = Callable[[str, Any, Inspect | None], GroupedDataset]

# Modules that define the built-in datasets and the kinds; imported on first use of the registry.
_BUILTIN_MODULES = ("adult", "dutch", "mnist", "celeba", "digits", "synthetic")
_KIND_MODULES = ("table_file", "image_folder")


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    options: type[DatasetOptions]
    loader: Loader
    summary: str
    needs_files: bool
    version: Callable[[Any], str] | None = None


@dataclass(frozen=True)
class KindSpec:
    """A kind of user dataset: ``loader(name, options, inspect)`` and ``version(options)`` (an
    md5)."""

    kind: str
    options: type[DatasetOptions]
    loader: KindLoader
    version: Callable[[Any], str]
    summary: str


_REGISTRY: dict[str, DatasetSpec] = {}
_KINDS: dict[str, KindSpec] = {}


def register(
    name: str, options: type[DatasetOptions], summary: str, *, needs_files: bool,
    version: Callable[[Any], str] | None = None,
) -> Callable[[Loader], Loader]:
    """Decorator registering ``loader(options) -> GroupedDataset`` under ``name``;
    ``version(options)`` is its source's md5 (default ``version.builtin_version``)."""

    def deco(loader: Loader) -> Loader:
        _REGISTRY[name] = DatasetSpec(name, options, loader, summary, needs_files, version)
        return loader

    return deco


def register_kind(
    kind: str, options: type[DatasetOptions], summary: str, *, version: Callable[[Any], str]
) -> Callable[[KindLoader], KindLoader]:
    """Decorator registering ``loader(name, options, inspect)`` for datasets declared
    ``kind: <kind>``; the loader calls ``inspect(preview)`` (when not None) before its split."""

    def deco(loader: KindLoader) -> KindLoader:
        _KINDS[kind] = KindSpec(kind, options, loader, version, summary)
        return loader

    return deco


def _ensure_builtin() -> None:
    for mod in (*_BUILTIN_MODULES, *_KIND_MODULES):
        importlib.import_module(f"dpfair.data.{mod}")


def kinds() -> dict[str, KindSpec]:
    """The kinds a params.yaml dataset may declare (``kind: table`` ...)."""
    _ensure_builtin()
    return dict(_KINDS)


def _kind_name(options: Mapping[str, Any] | BaseModel | None) -> str | None:
    if isinstance(options, Mapping):
        kind = options.get("kind")
    else:
        kind = getattr(options, "kind", None)
    return None if kind is None else str(kind)


def kind_spec(options: Mapping[str, Any] | BaseModel | None) -> KindSpec | None:
    """The kind ``options`` declare (``kind: ...``), None for a built-in's options.

    A ConfigError names the known kinds when the declared one is not among them.
    """
    kind = _kind_name(options)
    if kind is None:
        return None
    all_kinds = kinds()
    if kind not in all_kinds:
        raise ConfigError(
            f"unknown dataset kind {kind!r}{did_you_mean(kind, list(all_kinds))} "
            f"(known kinds: {', '.join(all_kinds)})"
        )
    return all_kinds[kind]


def _builtin_rank(spec: DatasetSpec) -> int:
    module = spec.loader.__module__
    name = module.removeprefix("dpfair.data.")
    if name != module and name in _BUILTIN_MODULES:
        return _BUILTIN_MODULES.index(name)
    return len(_BUILTIN_MODULES)


def specs() -> dict[str, DatasetSpec]:
    """All registered datasets: the built-in ones in ``_BUILTIN_MODULES`` order (whichever
    module happened to be imported first), then the others in registration order."""
    _ensure_builtin()
    return dict(sorted(_REGISTRY.items(), key=lambda item: _builtin_rank(item[1])))


def available_datasets() -> list[str]:
    """Names accepted by ``load_dataset``."""
    return list(specs())


def get_spec(name: str) -> DatasetSpec:
    """The spec of ``name``; an unknown name is a ConfigError with a did-you-mean hint."""
    all_specs = specs()
    if name not in all_specs:
        raise ConfigError(
            f"unknown dataset {name!r}{did_you_mean(name, list(all_specs))} "
            f"(available: {', '.join(all_specs)})"
        )
    return all_specs[name]


def options_model(name: str) -> type[DatasetOptions]:
    return get_spec(name).options


def parse_options(
    name: str, options: Mapping[str, Any] | BaseModel | None = None
) -> DatasetOptions:
    """Validate ``options`` for dataset ``name`` (ConfigError naming ``datasets.<name>.<key>``).

    Options with a ``kind`` are validated by that kind's model whatever the name.
    """
    kind = kind_spec(options)
    model = kind.options if kind is not None else options_model(name)
    if options is None:
        return model()
    if isinstance(options, model):
        return options
    if isinstance(options, BaseModel):
        options = options.model_dump()
    try:
        return model.model_validate(dict(options))
    except ValidationError as exc:
        raise ConfigError(
            format_validation_error(exc, model, prefix=("datasets", name))
        ) from None


def source_version(name: str, options: Mapping[str, Any] | BaseModel | None = None) -> str:
    """md5 hex of the source of dataset ``name`` with ``options`` (``version.py`` says which).

    Cheap: reads the source file(s) once, never preprocesses or splits. A ConfigError for an
    unknown dataset or bad options, a DataError naming the file when a source is unreadable.
    """
    opts = parse_options(name, options)
    kind = kind_spec(opts)
    if kind is not None:
        return kind.version(opts)
    spec = get_spec(name)
    return spec.version(opts) if spec.version is not None else builtin_version(name, opts)


def load_dataset(
    name: str, options: Mapping[str, Any] | BaseModel | None = None, *,
    inspect: Inspect | None = None,
) -> GroupedDataset:
    """Load dataset ``name`` with ``options`` (defaults when None) as a GroupedDataset.

    ``options`` with a ``kind`` (``table``, ``image_folder``) load the user's own dataset under
    ``name``. ``inspect(preview)`` runs before the rows are split where the loader can (a kind),
    else on the loaded dataset; what it raises propagates. A DataError if the loader's output
    holds a NaN or inf feature or an id out of range.
    """
    opts = parse_options(name, options)
    kind = kind_spec(opts)
    if kind is not None:
        ds = kind.loader(name, opts, inspect)
    else:
        ds = get_spec(name).loader(opts)
        if inspect is not None:
            inspect(DatasetPreview.of(ds))
    ds.meta["data_version"] = source_version(name, opts)
    sources = ds.meta.get("sources") or {}
    read_from = f" (read from {', '.join(sorted(sources))})" if sources else ""
    return check_values(
        ds, f"dataset {name!r}{read_from}",
        f"check datasets.{name} in the parameters file and the source files; every feature "
        "must be a finite number and every label and group id an integer in range",
    )
