"""The models: their settings (:mod:`dpfair.models.config`) and their builders
(:mod:`dpfair.models.build`, the architectures of the papers and the user's own by import path).

The settings load without torch, so a params file is checked before torch is imported; the
builders need torch and load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpfair.lazy import lazy_getattr
from dpfair.models.config import (
    EsipovaCNNConfig,
    ImportModelConfig,
    LogisticRegressionConfig,
    MLPConfig,
    ModelConfig,
    ZhaoCNNConfig,
    parse_model_config,
    resolve_target,
)

if TYPE_CHECKING:
    from dpfair.models.build import build_model, check_output_shape, n_params

__getattr__ = lazy_getattr(__name__, dict.fromkeys(
    ["build_model", "check_output_shape", "n_params"], "build"))

__all__ = [
    "EsipovaCNNConfig",
    "ImportModelConfig",
    "LogisticRegressionConfig",
    "MLPConfig",
    "ModelConfig",
    "ZhaoCNNConfig",
    "build_model",
    "check_output_shape",
    "n_params",
    "parse_model_config",
    "resolve_target",
]
