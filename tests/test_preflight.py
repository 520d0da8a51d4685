"""preflight.py: the places a command writes to are checked in seconds, before any work."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from typer.testing import CliRunner

from dpfair.cli import app
from dpfair.errors import UnreachableError
from dpfair.preflight import check_tracking, check_writable
from dpfair.settings import TrackingConfig


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *args: object) -> None:
        pass


def test_writable_folder_or_creatable_one_passes_and_a_file_in_the_way_fails(tmp_path):
    check_writable(tmp_path, "artifact folder", "fix it")
    check_writable(tmp_path / "new" / "deeper", "artifact folder", "fix it")
    (tmp_path / "afile").write_text("")
    with pytest.raises(UnreachableError, match=r"afile is a file, not a folder; fix it"):
        check_writable(tmp_path / "afile" / "sub", "artifact folder", "fix it")


def test_unreachable_server_fails_fast_with_the_uri_and_the_fix(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"http://127.0.0.1:{_closed_port()}"
    cfg = TrackingConfig(uri=uri, artifact_root=str(tmp_path / "art"))
    with pytest.raises(UnreachableError, match="could not be reached within 2 s") as err:
        check_tracking(cfg, timeout=2)
    assert uri in str(err.value) and "set tracking.uri" in str(err.value)


def test_a_server_that_answers_passes(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    server = HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        check_tracking(TrackingConfig(uri=f"http://127.0.0.1:{server.server_port}",
                                      artifact_root=str(tmp_path)))
    finally:
        server.shutdown()


def test_local_stores_and_artifact_root_are_checked(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "afile").write_text("")
    check_tracking(TrackingConfig(uri=f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}",
                                  artifact_root=str(tmp_path / "art")))
    with pytest.raises(UnreachableError, match="tracking database folder"):
        check_tracking(TrackingConfig(uri=f"sqlite:///{tmp_path / 'afile' / 'mlflow.db'}"))
    with pytest.raises(UnreachableError, match="artifact folder .*set tracking.artifact_root"):
        check_tracking(TrackingConfig(uri=f"sqlite:///{tmp_path / 'm.db'}",
                                      artifact_root=str(tmp_path / "afile" / "art")))


def test_results_with_an_unreachable_server_is_one_message(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    params = tmp_path / "p.yaml"
    params.write_text(f"tracking:\n  uri: http://127.0.0.1:{_closed_port()}\n")
    out = CliRunner().invoke(app, ["results", "--params", str(params)])
    assert out.exit_code == 4, out.output
    assert "unreachable: tracking server http://127.0.0.1:" in out.output
    assert "Traceback" not in out.output
