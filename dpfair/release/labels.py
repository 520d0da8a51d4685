"""The labels a release writes into the results table and MLflow (a leaf: imports nothing),
so the commands that only read results (``dpfair results``, ``dpfair evaluate``) name its
columns without loading the accountants (:mod:`dpfair.release.plan` uses them)."""

from __future__ import annotations

HEURISTIC = "heuristic — no DP guarantee"
NONPRIVATE_REFERENCE = "non-private reference: no DP guarantee"
EPSILON_RUN = "ε one training run"
EPSILON_METHOD = "ε released for this method (search + all seeds)"
EPSILON_TEST = "ε test split (noisy test metrics)"
EPSILON_ACCOUNTANT = "accountant of the ε figures"
TEST_METRICS_NOTE = (
    "Test metrics come from held-out test data that ε does not cover: they are released "
    "without noise, and a practitioner's test split is private data too."
)
PRIVATE_LEDGER_STATUS = (
    "private working state: not for release; releasing it voids the ε of the search"
)
#: How the non-private reference's noise is labelled: it has none.
NO_NOISE = "none: the non-private reference trains without clipping or noise"
#: How a run with secret randomness (the default) is labelled; see REPLAYABLE_NOISE.
SECRET_NOISE = "secret: batches and noise drawn from OS entropy that is never stored"
