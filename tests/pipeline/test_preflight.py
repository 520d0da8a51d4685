"""preflight.py: the places a command writes to are checked in seconds, before any work."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from typer.testing import CliRunner

from dpfair.cli.commands import app
from dpfair.errors import UnreachableError
from dpfair.pipeline.preflight import check_tracking, check_writable
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


class _BasicAuth(BaseHTTPRequestHandler):
    """A tracking server behind basic auth (user ``ann``, password ``p@ss:w0rd``): /health and
    MLflow's experiments search answer only with the right Authorization header."""

    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        import base64

        got = self.headers.get("Authorization", "")
        type(self).seen.append(self.path)
        if got != "Basic " + base64.b64encode(b"ann:p@ss:w0rd").decode():
            self.send_response(401)
            self.end_headers()
            return
        body = b"OK" if self.path == "/health" else b'{"experiments": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


def test_basic_auth_tracking_urls_work_and_their_password_is_never_shown(monkeypatch,
                                                                         tmp_path):
    """``http://user:password@host`` passes the preflight (it was refused, with the password
    in the message), MLflow's client sends the same credentials, and every place that shows
    the URL masks the password."""
    from mlflow import MlflowClient

    from dpfair.tracking.runs import run_url, ui_command

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    server = HTTPServer(("127.0.0.1", 0), _BasicAuth)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://ann:p%40ss%3Aw0rd@127.0.0.1:{server.server_port}"
    try:
        cfg = TrackingConfig(uri=uri, artifact_root=str(tmp_path))
        check_tracking(cfg)
        assert MlflowClient(uri).search_experiments() == []
        assert _BasicAuth.seen[0] == "/health" and len(_BasicAuth.seen) >= 2
        with pytest.raises(UnreachableError) as err:  # a wrong port: the message is masked
            check_tracking(TrackingConfig(uri=uri.replace(str(server.server_port),
                                                          str(_closed_port())),
                                          artifact_root=str(tmp_path)), timeout=2)
    finally:
        server.shutdown()
    shown = [str(err.value), run_url(cfg, "1", "r"), ui_command(cfg)]
    assert all("p%40ss" not in s and "w0rd" not in s for s in shown), shown
    assert "http://ann:***@127.0.0.1" in str(err.value)


def test_storage_and_params_never_show_a_password():
    from dpfair.tracking.runs import flatten
    from dpfair.urls import mask_text, mask_url

    assert mask_url("postgresql://bob:pw@db/optuna") == "postgresql://bob:***@db/optuna"
    assert mask_url("sqlite:///optuna.db") == "sqlite:///optuna.db"
    assert flatten({"tuning": {"storage": "postgresql://bob:pw@db/x"}}) == {
        "tuning.storage": "postgresql://bob:***@db/x"}
    assert mask_text("a: mysql://u:pw@h/d\nb: 1\n") == "a: mysql://u:***@h/d\nb: 1\n"


@pytest.mark.parametrize("host", ["127.0.0.1:{closed}", "10.255.255.1:5432"])
def test_an_unreachable_database_server_is_refused_with_its_password_masked(monkeypatch,
                                                                            tmp_path, host):
    """A postgresql:// tracking store or Optuna storage that does not answer is refused
    within the timeout (a refused port at once, a silent host after it), not retried for
    minutes by its client library."""
    from dpfair.pipeline.preflight import check_storage_server

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    url = f"postgresql://bob:hunter2@{host.format(closed=_closed_port())}/db"
    cfg = TrackingConfig(uri=url, artifact_root=str(tmp_path / "art"))
    with pytest.raises(UnreachableError, match="tracking server postgresql://bob:\\*\\*\\*@"
                                               ) as err:
        check_tracking(cfg, timeout=1)
    assert "hunter2" not in str(err.value) and "could not be reached within 1 s" in str(err.value)
    with pytest.raises(UnreachableError, match="Optuna storage postgresql://bob:\\*\\*\\*@"
                                               ) as err:
        check_storage_server(url, timeout=1)
    assert "hunter2" not in str(err.value) and "--storage" in str(err.value)


def test_a_database_server_that_answers_passes(postgres_url, tmp_path):
    from dpfair.pipeline.preflight import check_storage_server

    check_storage_server(postgres_url, timeout=5)
    check_tracking(TrackingConfig(uri=postgres_url, artifact_root=str(tmp_path)), timeout=5)
