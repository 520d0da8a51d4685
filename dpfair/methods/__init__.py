"""DP training methods behind one interface; see ``base.Method``.

Each method is one module of this package with its config, its rule and its registration
(:mod:`dpfair.methods.registry`); ``MethodConfig`` is the discriminated union of every
registered config, found by importing every module here. The names below are the built-in
methods', importable from here for convenience.
"""

from dpfair.methods.adaptive import Adaptive, AdaptiveConfig
from dpfair.methods.adaptive_presets import (
    AdaclipConfig,
    BoundedAdaptiveConfig,
    DpsgdGlobalAdaptConfig,
)
from dpfair.methods.bam import Bam, BamConfig
from dpfair.methods.base import Method, PrivacyGuarantee, StepRule
from dpfair.methods.dp_sat import DpSat, DpSatConfig
from dpfair.methods.dpsgd import Dpsgd, DpsgdConfig
from dpfair.methods.dpsgd_f import DpsgdF, DpsgdFConfig
from dpfair.methods.dpsgd_global import DpsgdGlobal, DpsgdGlobalConfig
from dpfair.methods.fairlens import FairLens, FairLensConfig
from dpfair.methods.naive_reweight import NaiveReweight, NaiveReweightConfig
from dpfair.methods.nonprivate import NonPrivate, NonPrivateConfig
from dpfair.methods.registry import (
    COUNT_SIGMA_FACTOR,
    BuildContext,
    MethodSpec,
    build_method,
    method_config_union,
    register_method,
    registered_methods,
)

#: ``Annotated[Union[<every registered config>], Field(discriminator="name")]``.
MethodConfig = method_config_union()

__all__ = [
    "COUNT_SIGMA_FACTOR",
    "AdaclipConfig",
    "Adaptive",
    "AdaptiveConfig",
    "Bam",
    "BamConfig",
    "BoundedAdaptiveConfig",
    "BuildContext",
    "DpSat",
    "DpSatConfig",
    "Dpsgd",
    "DpsgdConfig",
    "DpsgdF",
    "DpsgdFConfig",
    "DpsgdGlobal",
    "DpsgdGlobalAdaptConfig",
    "DpsgdGlobalConfig",
    "FairLens",
    "FairLensConfig",
    "Method",
    "MethodConfig",
    "MethodSpec",
    "NaiveReweight",
    "NaiveReweightConfig",
    "NonPrivate",
    "NonPrivateConfig",
    "PrivacyGuarantee",
    "StepRule",
    "build_method",
    "method_config_union",
    "register_method",
    "registered_methods",
]
