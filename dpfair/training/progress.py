"""The training progress bar: rich, on stderr, loaded only when it is shown.

The library layers import no rich (STYLE.md section 4); :func:`progress_bar` imports it only
when progress is on and stderr is a terminal, else the bar does nothing.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Protocol


class ProgressBar(Protocol):
    """One bar over a run's steps (a context manager)."""

    def __enter__(self) -> ProgressBar: ...

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    def advance(self) -> None:
        """One step done."""

    def status(self, text: str) -> None:
        """Shown after the bar (e.g. the last test accuracy)."""


class _Silent:
    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def advance(self) -> None:
        return None

    def status(self, text: str) -> None:
        return None


class _RichBar:
    def __init__(self, description: str, total: int) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            console=Console(stderr=True),
        )
        self.task = self.progress.add_task(description, total=total, status="")

    def __enter__(self) -> _RichBar:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.progress.__exit__(*exc_info)

    def advance(self) -> None:
        self.progress.advance(self.task)

    def status(self, text: str) -> None:
        self.progress.update(self.task, status=text)


def progress_bar(enabled: bool, description: str, total: int) -> ProgressBar:
    """A rich bar of ``total`` steps when ``enabled`` and stderr is a terminal, else silent."""
    if enabled and sys.stderr.isatty():
        return _RichBar(description, total)
    return _Silent()
