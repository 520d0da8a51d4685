"""Shared helpers of the tracking tests (also used by tests/flows and benchmarks/fail_fast.py):
a model trained and logged, a run left RUNNING by a killed process, a model loaded elsewhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dpfair.tracking.runs import TrackingConfig


def train_and_log(tmp_path: Path, dataset, model: dict, name: str) -> tuple:
    """One quick dpsgd training of ``model`` on ``dataset``, logged as an MLflow Model in a
    store under ``tmp_path``: ``(tracking, run_id, model_uri)``."""
    from dpfair.tracking.model_export import log_model
    from dpfair.tracking.runs import TrackingConfig, experiment_id, run
    from dpfair.training import TrainConfig, train

    config = TrainConfig(method={"name": "dpsgd", "C": 1.0}, model=model, epochs=1,
                         batch_size=50, lr=0.5, sigma=1.0, progress=False, device="cpu")
    tracking = TrackingConfig(uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                              artifact_root=str(tmp_path / "art"))
    exp = experiment_id(tracking, name)
    with run(tracking, exp, "train") as run_id:
        uri = log_model(tracking, exp, run_id, train(config, dataset), dataset, {})
    return tracking, run_id, uri


_OPEN_AND_SLEEP = """
import sys, time
from dpfair.tracking.runs import TrackingConfig, run
cfg = TrackingConfig(uri=sys.argv[1], artifact_root=sys.argv[2])
with run(cfg, sys.argv[3], "pipeline:synthetic", tags={"dpfair.stage": "pipeline"}) as run_id:
    print(run_id, flush=True)
    time.sleep(600)
"""


def killed_run(cfg: TrackingConfig, exp: str) -> str:
    """The id of a run opened by a subprocess that was then killed with SIGKILL."""
    proc = subprocess.Popen([sys.executable, "-c", _OPEN_AND_SLEEP, cfg.uri, cfg.artifact_root,
                             exp], stdout=subprocess.PIPE, text=True)
    try:
        run_id = proc.stdout.readline().strip()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert run_id
    return run_id


def predict_elsewhere(location: str, rows: Path, cwd: Path, module: str) -> dict:
    """Load the model at ``location`` in a fresh interpreter in ``cwd`` without PYTHONPATH
    (neither the project nor this checkout on its path) and predict ``rows``: the predictions
    and the files that dpfair and ``module`` were imported from."""
    from dpfair.tracking.model_export import PREDICTION

    cwd.mkdir(exist_ok=True)
    script = textwrap.dedent(f"""
        import json, sys
        import mlflow, pandas as pd
        assert "dpfair" not in sys.modules
        model = mlflow.pyfunc.load_model({location!r})
        out = model.predict(pd.read_csv({str(rows)!r}))
        import dpfair, {module}
        print(json.dumps({{"predictions": out["{PREDICTION}"].tolist(),
                           "dpfair": dpfair.__file__, "module": {module}.__file__}}))
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
