"""Errors of the data layer: each names the file and every place that was looked at.

The base :class:`~dpfair.errors.DataError` is defined in :mod:`dpfair.errors` (the CLI catches
its root); it is imported here so the loaders can raise it next to its data-specific kinds.
"""

from __future__ import annotations

from dpfair.errors import DataError


class SourceMissingError(DataError):
    """A source file is in none of the places looked at (mirror, cache) and was not downloaded."""


class ChecksumError(DataError):
    """A source file exists but its md5 differs from the canonical one."""


class DownloadError(SourceMissingError):
    """A source file is absent locally and its canonical URL could not be fetched."""
