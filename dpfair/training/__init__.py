"""Training: a run's configuration, its plan, the Poisson-sampled loop and evaluation.

``make_plan`` fixes what a run does before anything runs (q, steps, σ, the privacy event and
its ε); ``train`` runs it. The modules, bottom to top: ``config``, ``evaluation``, ``plan``,
``result``, ``progress`` (rich, loaded only when a bar is shown), ``optim`` (SGD and Adam,
no ``torch._dynamo``), ``loop``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpfair.lazy import lazy_getattr
from dpfair.training.config import REPLAYABLE_NOISE, MetricsReleaseConfig, TrainConfig

if TYPE_CHECKING:
    from dpfair.training.evaluation import (
        Predictions,
        evaluate,
        flat_metrics,
        metrics_from_predictions,
        predict,
    )
    from dpfair.training.loop import poisson_batch, resolve_device, train
    from dpfair.training.result import Callback, TrainResult
    from dpfair.training.run_plan import (
        EXACT_TEST_METRICS,
        MetricsRelease,
        RunPlan,
        make_plan,
        metrics_release,
    )

# The loop, plan and evaluation (dp_accounting, scipy) load on first use: the configuration
# check reads only TrainConfig and must stay light.
__getattr__ = lazy_getattr(__name__, {
    **dict.fromkeys(["Predictions", "evaluate", "flat_metrics", "metrics_from_predictions",
                     "predict"], "evaluation"),
    **dict.fromkeys(["poisson_batch", "resolve_device", "train"], "loop"),
    **dict.fromkeys(["EXACT_TEST_METRICS", "MetricsRelease", "RunPlan", "make_plan",
                     "metrics_release"], "run_plan"),
    **dict.fromkeys(["Callback", "TrainResult"], "result"),
})

__all__ = [
    "EXACT_TEST_METRICS",
    "REPLAYABLE_NOISE",
    "Callback",
    "MetricsRelease",
    "MetricsReleaseConfig",
    "Predictions",
    "RunPlan",
    "TrainConfig",
    "TrainResult",
    "evaluate",
    "flat_metrics",
    "make_plan",
    "metrics_release",
    "metrics_from_predictions",
    "poisson_batch",
    "predict",
    "resolve_device",
    "train",
]
