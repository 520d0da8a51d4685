"""Checks of the places a command writes to, made before any data loads or anything trains.

A tracking server that does not answer, or an artifact folder that cannot be written, used to
surface after the trainings had spent their privacy budget (MLflow retries an unreachable
server for minutes). :func:`check_tracking` and :func:`check_writable` fail in seconds with the
place and the fix. Only the standard library (and psycopg2 for a PostgreSQL server's login):
no mlflow import, so the check is fast.
"""

from __future__ import annotations

import base64
import math
import os
import shutil
import socket
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse, urlsplit

from dpfair.errors import ConfigError, UnreachableError
from dpfair.settings import TrackingConfig
from dpfair.urls import (
    TRACKING_SCHEMES,
    check_scheme,
    credentials,
    mask_text,
    mask_url,
    scheme_of,
)

#: The port of a database server whose URL names none.
DEFAULT_PORTS = {"postgresql": 5432}


def check_writable(path: str | os.PathLike[str], what: str, fix: str) -> None:
    """``path`` is a folder that exists and is writable, or can be created (its nearest
    existing ancestor is a writable folder). Nothing is created here."""
    p = Path(path).absolute()
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UnreachableError(f"{what} {p}: {probe} is a file, not a folder; {fix}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UnreachableError(f"{what} {p}: {probe} is not writable; {fix}")


def check_free_space(path: str | os.PathLike[str], needed: int, what: str, fix: str) -> None:
    """The file system of ``path`` (or of its nearest existing ancestor) has ``needed`` bytes
    free: a model that cannot be written after its training would lose what it spent."""
    p = Path(path).absolute()
    probe = p
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed:
        raise UnreachableError(f"{what} {p}: {_mib(needed)} needed, {_mib(free)} free; {fix}")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def local_path(uri: str) -> str | None:
    """The local folder of a ``file://`` URI or a plain path; None for any other URI."""
    return _local_path(uri)


def _local_path(uri: str) -> str | None:
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return parsed.path
    if "://" not in uri:
        return uri
    return None


def check_tracking(cfg: TrackingConfig, timeout: float = 5.0) -> None:
    """The tracking store answers within ``timeout`` seconds (an HTTP server's ``/health``) or
    its local file/folder can be written; a local artifact root can be written too. A server
    URL's ``user:password@`` is sent as basic auth; messages show the URL masked."""
    uri = cfg.resolved_uri()
    try:  # MLFLOW_TRACKING_URI is not validated with params.yaml
        check_scheme(uri, TRACKING_SCHEMES, "tracking URI (tracking.uri or MLFLOW_TRACKING_URI)")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    scheme = urlparse(uri).scheme
    fix = "start the server, or set tracking.uri (or MLFLOW_TRACKING_URI) to one that answers"
    if scheme in ("http", "https"):
        bare, auth = credentials(uri)
        request = urllib.request.Request(f"{bare.rstrip('/')}/health")
        if auth is not None:
            token = base64.b64encode(":".join(auth).encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout):
                pass
        except urllib.error.HTTPError:
            pass  # the server answered (an old server may have no /health)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UnreachableError(f"tracking server {mask_url(uri)} could not be reached within "
                                   f"{timeout:g} s ({reason}); {fix}") from None
    elif scheme_of(uri) in DEFAULT_PORTS:
        check_server(uri, "tracking server", fix, timeout)
    elif scheme.startswith("sqlite"):
        db = uri.split(":///", 1)[-1]
        if db and db != ":memory:":
            check_writable(Path(db).absolute().parent, "tracking database folder",
                           "create it, or set tracking.uri to a writable sqlite:///FILE")
    else:
        local = _local_path(uri)
        if local is not None:
            check_writable(local, "tracking folder", "choose a writable tracking.uri")
    artifacts = _local_path(cfg.artifact_root)
    if artifacts is not None:
        check_writable(artifacts, "artifact folder",
                       "set tracking.artifact_root to a writable folder")


def check_server(url: str, what: str, fix: str, timeout: float = 5.0) -> None:
    """The database server of ``url`` accepts a connection within ``timeout`` seconds, or an
    ``UnreachableError`` naming it (password masked) and ``fix``: its client library would
    retry for minutes. A URL without a host (a local socket) is left to the client."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or DEFAULT_PORTS.get(scheme_of(url))
    except ValueError as exc:
        raise UnreachableError(f"{what} {mask_url(url)}: {exc}; {fix}") from None
    if not host or port is None:
        return
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
        _handshake(url, timeout)
    except OSError as exc:
        raise UnreachableError(f"{what} {mask_url(url)} could not be reached within "
                               f"{timeout:g} s ({mask_text(str(exc)).strip()}); {fix}") from None


def _handshake(url: str, timeout: float) -> None:
    """A PostgreSQL login with psycopg2 (the default driver) bounded by ``timeout``: a port
    that accepts connections may still not be a database that answers. Its errors as
    ``OSError``; another driver is left to its client."""
    scheme, _, rest = url.partition("://")
    if scheme_of(url) != "postgresql" or scheme not in ("postgresql", "postgresql+psycopg2"):
        return
    import psycopg2

    try:
        psycopg2.connect(f"postgresql://{rest}", connect_timeout=max(1, math.ceil(timeout))
                         ).close()
    except psycopg2.Error as exc:
        raise OSError(str(exc)) from None


def check_storage_server(url: str | None, timeout: float = 5.0) -> None:
    """An Optuna storage on a database server answers (:func:`check_server`); a local file
    or none (a study in memory) passes."""
    if url is not None and scheme_of(url) in DEFAULT_PORTS:
        check_server(url, "Optuna storage", "start the database, or give --storage (or "
                     "tuning.storage) one that answers", timeout)
