"""Where a project's durable state lives, whatever folder a command runs in.

``dvc exp run --temp`` and ``dvc exp run --queue`` run a stage in a copy of the repository
under ``<repo>/.dvc/tmp/exps/`` that DVC deletes afterwards. State that must outlive a run
(the privacy ledger, MLflow's SQLite store and artifacts, Optuna's default storage) is
therefore resolved against :func:`project_root`: the repository the copy was made from, not
the copy. Outputs that DVC itself collects (``outputs/``, ``evaluation/``) stay in the copy.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["durable_path", "durable_sqlite_uri", "project_root"]

_DVC_WORKSPACES = (".dvc", "tmp", "exps")


def project_root(start: str | Path | None = None) -> Path:
    """The project that owns ``start`` (default: the working directory): ``start`` itself, or,
    inside a DVC temporary or queued experiment workspace, the repository it was copied from."""
    path = Path(start if start is not None else os.getcwd()).resolve()
    parts = path.parts
    for i in range(len(parts) - len(_DVC_WORKSPACES) + 1):
        if parts[i:i + len(_DVC_WORKSPACES)] == _DVC_WORKSPACES:
            return Path(*parts[:i])
    return path


def durable_path(path: str | Path, root: str | Path | None = None) -> Path:
    """``path`` made absolute against :func:`project_root` of ``root`` when it is relative."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else project_root(root) / path


def durable_sqlite_uri(uri: str, root: str | Path | None = None) -> str:
    """A ``sqlite:///relative.db`` URI made absolute against :func:`project_root`; any other
    URI (an absolute SQLite file, a server, ``file:``) unchanged."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or uri.startswith(prefix + "/") or uri == prefix + ":memory:":
        return uri
    return prefix + str(durable_path(uri[len(prefix):], root))
