"""MLflow (adapter layer): runs and their logging (:mod:`dpfair.tracking.runs`), a run's
names and inputs, the model as a pyfunc, and the Model Registry's aliases."""

import sys

if "mlflow" in sys.modules:  # imported before dpfair turned its telemetry off (dpfair.NO_TELEMETRY)
    from mlflow.telemetry.client import set_telemetry_client

    set_telemetry_client()  # MLflow decides at import; this decides again, with the variable set
