"""The model settings of params.yaml (``experiment.model``), one pydantic config per
architecture; :mod:`dpfair.models.build` builds them.

This module does not import torch: a configuration is validated, and its mistakes reported,
before torch loads. An ``import`` model's target is resolved here (its module is imported, as
the user wrote it).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, TypeAdapter, field_validator

from dpfair.errors import ConfigError, Terminated, did_you_mean, user_exit

Activation = Literal["tanh", "relu"]
#: What the factory of an ``import`` model is given from the data when its signature names it.
FROM_DATA = ("input_shape", "n_classes")
_IDENTIFIERS = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_TARGET = re.compile(rf"({_IDENTIFIERS}):({_IDENTIFIERS})")


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LogisticRegressionConfig(_Config):
    """One linear layer to ``n_classes`` logits (softmax regression; see the module docstring)."""

    name: Literal["logistic_regression"] = "logistic_regression"


class MLPConfig(_Config):
    """Fully connected network; defaults are Esipova's Adult model (2 x 256, tanh)."""

    name: Literal["mlp"] = "mlp"
    hidden: list[PositiveInt] = Field(default_factory=lambda: [256, 256], min_length=1)
    activation: Activation = "tanh"


class EsipovaCNNConfig(_Config):
    """Esipova et al.'s CNN: valid 3x3 convolutions (32, 16 channels), tanh, linear head."""

    name: Literal["esipova_cnn"] = "esipova_cnn"
    channels: list[PositiveInt] = Field(default_factory=lambda: [32, 16], min_length=1)
    kernel_size: PositiveInt = 3
    activation: Activation = "tanh"


class ZhaoCNNConfig(_Config):
    """Zhao et al.'s two-layer CNN: conv-ReLU-maxpool(3, 2) twice, then FC 500-500."""

    name: Literal["zhao_cnn"] = "zhao_cnn"
    channels: list[PositiveInt] = Field(default_factory=lambda: [64, 64], min_length=1)
    kernel_size: PositiveInt = 3
    padding: int = Field(default=0, ge=0)
    pool_kernel: PositiveInt = 3
    pool_stride: PositiveInt = 2
    hidden: list[PositiveInt] = Field(default_factory=lambda: [500, 500])
    activation: Activation = "relu"


class ImportModelConfig(_Config):
    """Your own ``nn.Module`` by import path: ``target: "package.module:factory"``.

    ``factory`` is a class or a function (``module:Outer.create`` reaches nested attributes),
    called as ``factory(**kwargs)``; it is also given ``input_shape`` (a tuple without the
    batch dimension, e.g. ``(20,)`` or ``(1, 8, 8)``) and ``n_classes`` (an int) as keywords
    when its signature names a parameter so called. It must return a module mapping a batch
    ``(B, *input_shape)`` to logits ``(B, n_classes)`` (checked on a dummy batch). The module is
    imported as Python would from the current directory (which is added to the end of
    ``sys.path`` if absent), an installed package or ``PYTHONPATH``; the target is resolved
    when the configuration is validated, so a typo fails before anything runs.
    """

    name: Literal["import"] = "import"
    target: str = Field(description='"package.module:factory" (a class or a function)')
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments")

    @field_validator("target")
    @classmethod
    def _resolvable(cls, target: str) -> str:
        resolve_target(target)
        return target

    @field_validator("kwargs")
    @classmethod
    def _not_from_data(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        given = sorted(set(kwargs) & set(FROM_DATA))
        if given:
            raise ConfigError(
                f"kwargs: {', '.join(given)} come(s) from the dataset; remove them from kwargs "
                "(the factory receives them when its signature names them)"
            )
        return kwargs


ModelConfig = Annotated[
    LogisticRegressionConfig | MLPConfig | EsipovaCNNConfig | ZhaoCNNConfig | ImportModelConfig,
    Field(discriminator="name"),
]
MODEL_CONFIG: TypeAdapter[ModelConfig] = TypeAdapter(ModelConfig)


def parse_model_config(data: dict) -> ModelConfig:
    """Validate a mapping such as ``{"name": "mlp", "hidden": [64]}`` into a model config."""
    return MODEL_CONFIG.validate_python(data)


def resolve_target(target: str) -> Callable[..., Any]:
    """The class or function ``"package.module:name"`` names; ``ConfigError`` naming the
    problem (no colon, module not importable, name missing, not callable) and the fix."""
    match = _TARGET.fullmatch(target.strip())
    if match is None:
        head, _, tail = target.rpartition(".")
        hint = f"; did you mean {head + ':' + tail!r}?" if ":" not in target and head else ""
        raise ConfigError(
            f"target {target!r} is not 'package.module:factory' (the module's import path, a "
            f"colon, then the class or function in it, e.g. 'mymodels:make_net'){hint}"
        )
    module_name, attr_path = match.groups()
    value: Any = _import(module_name)
    where = module_name
    for part in attr_path.split("."):
        if not hasattr(value, part):
            public = [n for n in dir(value) if not n.startswith("_")]
            raise ConfigError(
                f"target {target!r}: {where!r} has no attribute {part!r}"
                f"{did_you_mean(part, public)} (public names: {', '.join(public[:20]) or 'none'})"
            )
        value = getattr(value, part)
        where += f"{':' if where == module_name else '.'}{part}"
    if not callable(value):
        raise ConfigError(
            f"target {target!r} is not callable (type {type(value).__name__}): name a class or "
            "a function that returns an nn.Module"
        )
    return value


def _import(module_name: str) -> Any:
    """Import ``module_name`` with the current directory on ``sys.path`` (appended if absent)."""
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is None or not (module_name + ".").startswith(err.name + "."):
            raise ConfigError(f"importing module {module_name!r} failed: {err}") from err
        shown = [p or "." for p in sys.path[:8]] + (["..."] if len(sys.path) > 8 else [])
        raise ConfigError(
            f"cannot import module {module_name!r} (no module named {err.name!r}): put "
            f"{module_name.replace('.', '/')}.py in the current directory ({cwd}), install its "
            f"package, or add its folder to PYTHONPATH (sys.path: {', '.join(shown)})"
        ) from err
    except Exception as err:  # the user's module raised while being imported
        raise ConfigError(
            f"importing module {module_name!r} failed: {type(err).__name__}: {err}"
        ) from err


@contextmanager
def users_code(what: str, failed: str) -> Iterator[None]:
    """Around a call of the user's code ``what``: a stop request (``Terminated``) passes, and
    ``sys.exit`` or any other exception becomes a ConfigError (``failed``, then the error)."""
    try:
        yield
    except Terminated:
        raise
    except SystemExit as err:
        raise user_exit(err, what) from None
    except Exception as err:
        raise ConfigError(f"{failed} {type(err).__name__}: {err}") from err


