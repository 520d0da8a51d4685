"""dpfair: differentially private training that removes DP's disparate impact on groups.

``dpfair.fit`` (:func:`dpfair.api.fit`) trains your own ``nn.Module``; it is loaded on first
use, so ``import dpfair`` loads no torch.

Importing dpfair turns off the usage telemetry of the libraries it drives (:data:`NO_TELEMETRY`),
for this process and the processes it starts (DVC, the Prefect and MLflow servers): everything
that leaves the process must be covered by the ε dpfair reports, and telemetry reports which
calls ran and how long they took. A variable already set is left as it is, so setting one
yourself (e.g. ``MLFLOW_DISABLE_TELEMETRY=false``) turns that library's telemetry back on.
"""

import os

from dpfair.lazy import lazy_getattr

__version__ = "0.1.0"
__all__ = ["NO_TELEMETRY", "fit"]

#: The variable each library reads to send no usage data (MLflow 3, DVC, Prefect's server, and
#: Prefect's client, which reads the cross-tool ``DO_NOT_TRACK``; its first import in a terminal
#: also prints a telemetry notice).
NO_TELEMETRY = {"MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
for _name, _value in NO_TELEMETRY.items():
    os.environ.setdefault(_name, _value)

__getattr__ = lazy_getattr(__name__, {"fit": "api"})
