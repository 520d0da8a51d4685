"""MLflow (adapter layer): runs and their logging (:mod:`dpfair.tracking.runs`), a run's
names and inputs, the model as a pyfunc, and the Model Registry's aliases."""

import sys

# MLflow decides on its telemetry when it is imported: imported before dpfair set the variable
# (dpfair.NO_TELEMETRY), it decides again
if "mlflow" in sys.modules:
    from mlflow.telemetry.client import set_telemetry_client

    set_telemetry_client()
