"""The data version of a dataset's source: an md5 computed without preparing the dataset.

``registry.source_version(name, options)`` is what a scheduler compares to decide whether
anything changed, and what every loaded dataset carries as ``meta["data_version"]``
(``registry.load_dataset`` sets it from that function, so the two never disagree). Each
dataset's loader module declares its version (``@register(..., version=...)``,
``@register_kind(..., version=...)``) from the pieces here, which import no loader:

* a file dataset (``kind: table``): the md5 of the file's bytes, the hash ``dvc add`` records
  for it in its ``.dvc`` file;
* a folder or several files (``kind: image_folder``, built-ins with several raw files): the md5
  of a manifest, one ``<relative path> <md5>`` line per file in sorted order;
* a built-in dataset: its raw files' canonical md5s (``sources.py``; ``fetch`` refuses any
  other content, so no file is read), sklearn's bundled digits file, CelebA's two label files
  (they list every image); ``synthetic`` is generated from its options, so its version is their md5.

Options do not enter the version of a dataset read from files: the same source prepared with
other options is the same people (what a privacy ledger per source needs).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel

from dpfair.data.sources import md5sum, sources_of
from dpfair.errors import DataError


def manifest_version(entries: Iterable[tuple[str, str]]) -> str:
    """md5 of ``"<name> <md5>\\n"`` lines sorted by name."""
    h = hashlib.md5()
    for name, md5 in sorted(entries):
        h.update(f"{name} {md5}\n".encode())
    return h.hexdigest()


def file_version(path: str | Path) -> str:
    """md5 of one file's bytes (DataError naming the file when it cannot be read)."""
    path = Path(path)
    try:
        return md5sum(path)
    except OSError as exc:
        raise DataError(f"cannot read {path} to compute its data version: {exc}") from None


def tree_version(root: str | Path, files: Iterable[Path], extra: Iterable[Path] = ()) -> str:
    """Manifest version of ``files`` (paths under ``root``) plus ``extra`` files by name."""
    root = Path(root)
    entries = [(p.relative_to(root).as_posix(), file_version(p)) for p in files]
    entries += [(f"<{p.name}>", file_version(p)) for p in extra]
    return manifest_version(entries)


def builtin_version(name: str, options: BaseModel) -> str:
    """The version of a built-in dataset that declares no ``version`` of its own: its raw files'
    canonical md5s (``sources.py``), or, without raw files, the md5 of its options."""
    files = sources_of(name)
    if files:
        return manifest_version((f.filename, f.md5) for f in files)
    canonical = json.dumps({"dataset": name, "options": options.model_dump(mode="json")},
                           sort_keys=True)
    return hashlib.md5(canonical.encode()).hexdigest()
