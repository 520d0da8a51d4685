"""Every error dpfair raises on purpose, and the one wording of its messages (the bottom layer).

``DpfairError`` is the root the CLI catches. A message names the key or file, the value, what
to do, and whether anything ran. This module imports nothing of dpfair and only pydantic's
error type, so every layer can raise these without pulling anything else in.

* :func:`did_you_mean` is the one did-you-mean hint (config keys, dataset names, method names,
  search-space keys).
* :func:`format_validation_error` turns a pydantic ``ValidationError`` into ``key.path: message``
  lines; a model may set the class variable ``config_key_noun`` (e.g. ``"dataset"``) to name its
  keys in the "unknown ..." message.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError


class DpfairError(Exception):
    """Root of every error dpfair raises on purpose (the CLI prints these without a traceback)."""


class ConfigError(DpfairError, ValueError):
    """A bad parameters file or value; the message names the key path and what is wrong."""


class DataError(DpfairError, RuntimeError):
    """A dataset could not be produced (missing, corrupt or malformed input)."""


class SourceMissingError(DataError):
    """A source file is in none of the places looked at (mirror, cache) and was not downloaded."""


class ChecksumError(DataError):
    """A source file exists but its md5 differs from the canonical one."""


class DownloadError(SourceMissingError):
    """A source file is absent locally and its canonical URL could not be fetched."""


class PrivacyError(DpfairError, ValueError):
    """A privacy computation that cannot be done as asked (unsupported event, bad σ or δ)."""


class TuningError(DpfairError, ValueError):
    """A tuning job that cannot run as configured (raised before any training)."""


class UnreachableError(DpfairError, OSError):
    """A service or folder a command needs cannot be reached or written (checked before any
    work: :mod:`dpfair.pipeline.preflight`)."""


class DistributedError(DpfairError, RuntimeError):
    """A process of a run trained across several processes failed or was killed; the others
    were stopped (:mod:`dpfair.training.distributed`)."""


class BudgetExceededError(TuningError, PrivacyError):
    """A planned release exceeds its budget, known before any run: a run's total over
    ``budget.epsilon`` (or a release ``budget.*`` does not allow), a search's ε, or a retrain
    composed with what a data source's people already spent (``budget.lifetime_epsilon``)."""


class Terminated(SystemExit):
    """SIGTERM turned into an exception (:func:`dpfair.processes.sigterm_raises`): the process
    was told to stop. Any other ``SystemExit`` inside a command is user code calling
    ``sys.exit`` (:func:`user_exit`), an error."""


def user_exit(exc: SystemExit, what: str) -> ConfigError:
    """The error for ``sys.exit`` called by user code ``what`` (a model factory, a forward
    pass): it would end dpfair silently (``sys.exit(0)``: exit code 0, nothing written)."""
    return ConfigError(f"{what} called sys.exit({exc.code!r}): your code may not end the "
                       "process; raise an exception instead")


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices``, or ``""`` when none is close."""
    names = [str(c) for c in choices]
    same_letters = [c for c in names if c.casefold() == str(word).casefold()]
    close = same_letters or difflib.get_close_matches(str(word), names, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


_ABSENT = object()


def bools_as_numbers(raw: Any, value: Any, path: str = "") -> list[str]:
    """Key paths where ``raw`` (as given) holds a boolean that validation made a number
    (``value``: the validated model, mapping or list): pydantic reads ``true`` as 1, so
    ``epochs: true`` would train one epoch. The one check of booleans where numbers are meant,
    for params.yaml, the tuning settings and every search-space value."""
    if isinstance(raw, bool):
        return [path] if isinstance(value, int | float) and not isinstance(value, bool) else []
    if isinstance(raw, Mapping):
        found = []
        for key, item in raw.items():
            if isinstance(value, BaseModel):
                sub = getattr(value, str(key), _ABSENT)
            elif isinstance(value, Mapping):
                sub = value.get(key, _ABSENT)
            else:
                sub = _ABSENT
            if sub is not _ABSENT:
                found += bools_as_numbers(item, sub, f"{path}.{key}" if path else str(key))
        return found
    if isinstance(raw, list) and isinstance(value, list | tuple) and len(raw) == len(value):
        return [p for i, (r, v) in enumerate(zip(raw, value, strict=True))
                for p in bools_as_numbers(r, v, f"{path}[{i}]")]
    return []


# ----------------------------------------------------------------- pydantic error messages


def _strip_optional(ann: Any) -> list[Any]:
    if get_origin(ann) is Annotated:
        return _strip_optional(get_args(ann)[0])
    if get_origin(ann) in (Union, types.UnionType):
        return [m for a in get_args(ann) if a is not type(None) for m in _strip_optional(a)]
    return [ann]


def _as_model(ann: Any) -> type[BaseModel] | None:
    for a in _strip_optional(ann):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _tagged_member(ann: Any, part: str | int) -> type[BaseModel] | None:
    """The member of a discriminated union (``Annotated[A | B, Field(discriminator=...)]``)
    whose tag is ``part``: pydantic puts the tag into an error's location."""
    if get_origin(ann) is not Annotated:
        return None
    field = next((m for m in get_args(ann)[1:] if getattr(m, "discriminator", None)), None)
    if field is None or not isinstance(field.discriminator, str):
        return None
    for member in _strip_optional(ann):
        tag = getattr(member, "model_fields", {}).get(field.discriminator)
        if tag is not None and get_origin(tag.annotation) is Literal and part in get_args(
                tag.annotation):
            return member
    return None


def _step(ann: Any, part: str | int) -> Any:
    """The annotation one step down ``part`` of a pydantic location, or None."""
    for a in _strip_optional(ann):
        model = _as_model(a)
        if model is not None:
            field = model.model_fields.get(str(part))
            if field is not None:
                return field.annotation
            continue
        origin = get_origin(a)
        args = get_args(a)
        if origin in (dict, Mapping) and len(args) == 2:
            return args[1]
        if origin in (list, tuple, Sequence) and args:
            return args[0]
    return None


def _walk(model: type[BaseModel], loc: Sequence[str | int]) -> tuple[Any, tuple[str | int, ...]]:
    """The annotation at ``loc`` and the location as the user wrote it (without the tags
    pydantic inserts for discriminated unions); the annotation is None when unknown."""
    ann: Any = model
    shown: list[str | int] = []
    for part in loc:
        member = _tagged_member(ann, part) if ann is not None else None
        if member is not None:
            ann = member
            continue
        shown.append(part)
        ann = _step(ann, part) if ann is not None else None
    return ann, tuple(shown)


def _annotation_at(model: type[BaseModel], loc: Sequence[str | int]) -> Any:
    return _walk(model, loc)[0]


def _describe(error: Mapping[str, Any], model: type[BaseModel]) -> str:
    kind = error["type"]
    loc = tuple(error["loc"])
    given = error.get("input")
    if kind == "extra_forbidden":
        parent = _as_model(_annotation_at(model, loc[:-1]))
        allowed = list(parent.model_fields) if parent else []
        noun = getattr(parent, "config_key_noun", "key")
        return (
            f"unknown {noun} {loc[-1]!r}{did_you_mean(str(loc[-1]), allowed)}"
            + (f" (allowed: {', '.join(allowed)})" if allowed else "")
        )
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected a mapping of keys to values, got {given!r}"
    if kind == "missing":
        return "required key is missing"
    message = str(error["msg"])
    if kind == "value_error":
        return message.removeprefix("Value error, ")
    if kind == "literal_error" and isinstance(given, str):
        ann = _annotation_at(model, loc)
        options = [str(a) for a in get_args(ann)] if get_origin(ann) is Literal else []
        return f"{message} (got {given!r}){did_you_mean(given, options)}"
    return f"{message} (got {given!r})"


def format_validation_error(
    exc: ValidationError, model: type[BaseModel], prefix: Sequence[str | int] = ()
) -> str:
    """One ``key.path: message`` line per error of ``exc`` raised by validating ``model``.

    ``prefix`` is prepended to every key path (e.g. ``("datasets", "adult")`` when ``model``
    is the options model of one dataset).
    """
    lines = []
    for error in exc.errors(include_url=False):
        path = ".".join(str(p) for p in (*prefix, *_walk(model, error["loc"])[1])) or "<top level>"
        lines.append(f"{path}: {_describe(error, model)}")
    return "\n".join(lines)
