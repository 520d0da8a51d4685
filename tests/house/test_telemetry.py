"""dpfair turns off the usage telemetry of MLflow, DVC and Prefect's server (dpfair.NO_TELEMETRY):
checked with each library's own switch, in a fresh Python whose environment says nothing
(MLflow also stays quiet under pytest or a CI, so those markers are removed too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpfair import NO_TELEMETRY

#: what MLflow takes for a CI or a test run (mlflow.telemetry.utils), where it sends nothing
QUIET_ANYWAY = ("PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "DVC_TEST")


def _fresh(script: str, **env: str) -> dict:
    """What ``script`` prints as JSON, run in a Python with none of dpfair's variables set."""
    clean = {k: v for k, v in os.environ.items() if k not in NO_TELEMETRY
             and k not in QUIET_ANYWAY}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**clean, **env}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_variables_are_the_ones_the_libraries_read() -> None:
    from mlflow.environment_variables import MLFLOW_DISABLE_TELEMETRY

    assert NO_TELEMETRY[MLFLOW_DISABLE_TELEMETRY.name] == "true"
    assert "DVC_NO_ANALYTICS" in NO_TELEMETRY
    assert "PREFECT_SERVER_ANALYTICS_ENABLED" in NO_TELEMETRY
    # Prefect's client: its SDK events and first-run notice (issue 43) read DO_NOT_TRACK
    from prefect._internal.analytics import enabled

    assert NO_TELEMETRY["DO_NOT_TRACK"] == "1" and "DO_NOT_TRACK" in Path(
        enabled.__file__).read_text()


@pytest.mark.parametrize("order", ["dpfair first", "mlflow first"])
def test_mlflow_sends_nothing_whichever_is_imported_first(order: str) -> None:
    imports = ("import dpfair.tracking, mlflow" if order == "dpfair first"
               else "import mlflow, dpfair.tracking")
    out = _fresh(f"""{imports}
import json, threading
from mlflow.telemetry.client import get_telemetry_client
print(json.dumps({{"client": repr(get_telemetry_client()),
                  "threads": [t.name for t in threading.enumerate()]}}))""")
    assert out["client"] == "None", out
    assert not [t for t in out["threads"] if "Telemetry" in t], out


def test_prefect_server_and_dvc_send_nothing(tmp_path) -> None:
    out = _fresh(f"""import dpfair, json, os
os.chdir({str(tmp_path)!r})
from dvc.analytics import is_enabled
from prefect.settings import get_current_settings
print(json.dumps({{"dvc": is_enabled(),
                  "prefect": get_current_settings().server.analytics_enabled}}))""")
    assert out == {"dvc": False, "prefect": False}


def test_a_variable_the_user_set_is_kept() -> None:
    out = _fresh("import dpfair, json, os; print(json.dumps(os.environ['DVC_NO_ANALYTICS']))",
                 DVC_NO_ANALYTICS="")
    assert out == ""


def test_prefect_client_sends_nothing() -> None:
    out = _fresh("""import dpfair, json
from prefect._internal.analytics.enabled import is_telemetry_enabled
print(json.dumps({"client": is_telemetry_enabled()}))""")
    assert out == {"client": False}


def test_the_printed_mlflow_ui_command_carries_the_switch(tmp_path) -> None:
    from dpfair.settings import TrackingConfig
    from dpfair.tracking.runs import TELEMETRY_OFF, ui_command

    command = ui_command(TrackingConfig(uri=f"sqlite:///{tmp_path / 'm.db'}"))
    assert TELEMETRY_OFF == f"MLFLOW_DISABLE_TELEMETRY={NO_TELEMETRY['MLFLOW_DISABLE_TELEMETRY']}"
    switch, program = command.split(" \\\n")
    assert switch == TELEMETRY_OFF and " ui --backend-store-uri " in program
    # the two lines are one shell command whose process gets the switch
    shown = subprocess.run(["bash", "-c", f"{switch} \\\n    env"], capture_output=True,
                           text=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert TELEMETRY_OFF in shown.stdout.splitlines()
