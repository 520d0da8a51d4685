"""This user's cache of dpfair, shared by every project: downloaded datasets
(:mod:`dpfair.data.sources`) and the empty databases new stores start from (MLflow's:
:mod:`dpfair.tracking.empty_store`; Prefect's: ``flows.server``)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["cache_dir", "copy_sqlite", "made_once"]


def cache_dir() -> Path:
    """``DPFAIR_CACHE``, else ``$XDG_CACHE_HOME/dpfair`` or ``~/.cache/dpfair``."""
    env = os.environ.get("DPFAIR_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "dpfair"


def made_once(name: str, make: Callable[[Path], None]) -> Path:
    """The cache's file ``name``, made by ``make(scratch)`` where it is missing: one process
    makes it (the others wait on its lock file), in a scratch folder beside it, and moves it
    into place in one rename, so that a maker killed half-way leaves no file."""
    path = cache_dir() / name
    if not path.is_file():
        from filelock import FileLock  # only where something is made (a dataset needs none)

        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{path}.lock"):
            if not path.is_file():
                with tempfile.TemporaryDirectory(dir=path.parent, prefix=".making-") as scratch:
                    made = Path(scratch) / path.name
                    make(made)
                    os.replace(made, path)
    return path


def copy_sqlite(source: str | Path, target: str | Path) -> None:
    """Copy the SQLite database ``source`` into ``target`` through SQLite's online backup
    (SQLite's own locks taken; a write-ahead log folded in)."""
    with contextlib.closing(sqlite3.connect(source)) as read, \
            contextlib.closing(sqlite3.connect(target)) as write:
        read.backup(write)
