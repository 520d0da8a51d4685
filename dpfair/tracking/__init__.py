"""MLflow (adapter layer): runs and their logging (:mod:`dpfair.tracking.runs`), a run's
names and inputs, the model as a pyfunc, and the Model Registry's aliases."""
