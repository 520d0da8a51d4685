"""A folder dpfair may replace: new, empty, or written by dpfair before (a marker lists what).

``dpfair run --copy-results DIR`` replaces DIR's content with the results of a run. It must
never delete what dpfair did not create, so DIR is checked before the run starts
(:func:`check_replaceable`): it may be missing, empty, or hold exactly the entries that the
marker file :data:`MARKER` (written by :func:`replace_with_copy`) lists. Anything else (``.``,
the project's root, a folder with one unrelated file) is refused with a message naming the
entries that are not dpfair's.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from dpfair.errors import ConfigError

#: The file naming what dpfair wrote into a results folder (JSON: a list of entry names).
MARKER = ".dpfair-owned.json"


def _owned_entries(target: Path) -> list[str]:
    """The entries of ``target`` that dpfair wrote (all of them), or a ConfigError."""
    if not target.exists():
        return []
    if not target.is_dir():
        raise ConfigError(f"--copy-results {target}: is a file, not a folder; give a new "
                          "folder (nothing ran)")
    entries = sorted(os.listdir(target))
    if not entries:
        return []
    listed: list[str] = []
    if MARKER in entries:
        try:
            listed = [str(e) for e in json.loads((target / MARKER).read_text())]
        except (ValueError, TypeError, OSError):
            listed = []
    foreign = [e for e in entries if e != MARKER and e not in listed]
    if foreign or MARKER not in entries:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5
                                          else "")
        raise ConfigError(
            f"--copy-results {target}: the folder holds entries dpfair did not write there "
            f"({shown}), which replacing it would delete. Give a new or empty folder (e.g. "
            "outputs/pipeline); nothing ran")
    return [e for e in entries if e != MARKER]


def check_replaceable(target: str | Path | None) -> None:
    """Refuse (ConfigError) a ``target`` that holds anything dpfair did not write there (None:
    no target, nothing to check)."""
    if target is not None:
        _owned_entries(Path(target))


def replace_with_copy(source: str | Path, target: str | Path) -> None:
    """Make ``target`` a copy of folder ``source`` plus the :data:`MARKER`, deleting only what
    dpfair wrote there before (checked again here; :func:`check_replaceable`)."""
    source, target = Path(source), Path(target)
    owned = _owned_entries(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex}")
    try:
        shutil.copytree(source, tmp)
        (tmp / MARKER).write_text(json.dumps(sorted(os.listdir(tmp))) + "\n")
        if target.exists():
            for name in owned:
                path = target / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
            (target / MARKER).unlink(missing_ok=True)
            target.rmdir()  # empty now; fails (nothing lost) if something appeared meanwhile
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_not_an_input(output: Path, option: str, inputs: dict[str, Path]) -> None:
    """``ConfigError`` when the file ``output`` (given as ``option``) is one of ``inputs``
    (by option), by path or as the same file through a link: writing it would destroy the
    user's input. The one check of outputs that equal an input."""
    for name, given in inputs.items():
        same = output.absolute().resolve() == given.absolute().resolve()
        if not same and output.exists() and given.exists():
            same = os.path.samefile(output, given)
        if same:
            raise ConfigError(f"{option} {output} is the {name} file {given}: it would be "
                              f"overwritten; give {option} another path (nothing ran)")
