"""This user's cache of dpfair, shared by every project: downloaded datasets
(:mod:`dpfair.data.sources`) and the empty stores new databases start from
(:mod:`dpfair.tracking.empty_store`)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """``DPFAIR_CACHE``, else ``$XDG_CACHE_HOME/dpfair`` or ``~/.cache/dpfair``."""
    env = os.environ.get("DPFAIR_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "dpfair"
