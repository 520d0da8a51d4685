"""The training progress bar: rich, on stderr, loaded only when it is shown.

``progress`` (TrainConfig, params.yaml ``experiment.train.progress``) is ``"auto"`` by default:
a bar when stderr is an interactive terminal and ``CI`` is not set, none in logs, pipes and
CI. ``true`` always shows one (a non-terminal gets its final state), ``false`` never.
Trainings running at once in threads (the pipeline's trainings) share one rich display, one
line each. The library layers import no rich (ARCHITECTURE.md): :func:`progress_bar`
imports it only when a bar is shown, else the bar does nothing.
"""

from __future__ import annotations

import os
import sys
import threading
from types import TracebackType
from typing import Any, Literal, Protocol

ProgressMode = Literal["auto"] | bool


def shows_progress(mode: ProgressMode) -> bool:
    """Whether a bar is shown: ``auto`` when stderr is a terminal and ``CI`` is unset."""
    if mode == "auto":
        return sys.stderr.isatty() and not os.environ.get("CI")
    return bool(mode)


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


class _Display:
    """One rich display for the bars of this process: started with the first bar, stopped
    when the last one ends (bars of concurrent trainings are lines of one display)."""

    lock = threading.Lock()
    progress: Any = None
    users = 0

    @classmethod
    def add(cls, description: str, total: int) -> tuple[Any, Any]:
        with cls.lock:
            if cls.progress is None:
                cls.progress = cls._new()
                cls.progress.start()
            cls.users += 1
            return cls.progress, cls.progress.add_task(description, total=total, status="")

    @classmethod
    def remove(cls) -> None:
        with cls.lock:
            cls.users -= 1
            if cls.users == 0:
                cls.progress.stop()
                cls.progress = None

    @staticmethod
    def _new() -> Any:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        return Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            console=Console(stderr=True),
        )


class _RichBar:
    def __init__(self, description: str, total: int) -> None:
        self.description, self.total = description, total

    def __enter__(self) -> _RichBar:
        self.progress, self.task = _Display.add(self.description, self.total)
        return self

    def __exit__(self, *exc_info: object) -> None:
        _Display.remove()

    def advance(self) -> None:
        self.progress.advance(self.task)

    def status(self, text: str) -> None:
        self.progress.update(self.task, status=text)


def progress_bar(mode: ProgressMode, description: str, total: int) -> ProgressBar:
    """A rich bar of ``total`` steps when :func:`shows_progress` of ``mode``, else silent."""
    if shows_progress(mode):
        return _RichBar(description, total)
    return _Silent()
