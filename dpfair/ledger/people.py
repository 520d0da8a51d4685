"""Who is in the data: keyed fingerprints of a data version's rows and person ids.

The ledger charges the *people* in the data, not a dataset's name. For every data version it
stores one fingerprint per row and, where the dataset declares an ``id_column``, one per
person id: ``HMAC-SHA256(project secret, row)`` truncated to 128 bits. Without the secret (kept
in the ledger, never logged or published: :meth:`dpfair.ledger.store.Store.secret`) a
fingerprint cannot be recomputed, so the ledger is no membership oracle for a reader of the
fingerprints alone.

Rows are canonical so that the same people read from another file format or under another
name give the same fingerprints: a ``kind: table`` dataset fingerprints its raw rows (columns
sorted by name, numbers written as 17-digit floats so that ``1``, ``1.0`` and an int64 agree,
missing values as empty), whatever the preprocessing options; every other dataset fingerprints
its loaded examples (features, label and group of every split). A row that changes between
versions (an address, an updated balance) gets a new fingerprint: that is why versions of one
source compose unless declared disjoint, and why an ``id_column`` is the stronger key.

:func:`version_id` is the one published identifier of a data version (MLflow tag, dataset
input, registry tag): an HMAC of the source's md5 with the project secret, so it names a
version without letting anyone test a guessed file against it.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from dpfair.data import GroupedDataset

__all__ = ["Fingerprints", "dataset_fingerprints", "examples_md5", "frame_fingerprints",
           "version_id"]

#: kind -> fingerprints (hex): ``row`` always, ``id`` where an id column is declared
Fingerprints = dict[str, list[str]]
_BYTES = 16  # 128-bit fingerprints


def _mac(secret: bytes, payload: bytes) -> str:
    return hmac.new(secret, payload, hashlib.sha256).digest()[:_BYTES].hex()


def version_id(secret: bytes, source_version: str) -> str:
    """The published id of the data version whose source md5 is ``source_version``."""
    return _mac(secret, b"dpfair-version\x1f" + source_version.encode())


def _canonical_column(values: pd.Series) -> pd.Series:
    import pandas as pd

    if pd.api.types.is_bool_dtype(values) or not pd.api.types.is_numeric_dtype(values):
        text = values.astype("string").fillna("")
        return values.name + "=" + text.astype(str)
    numbers = values.astype("float64")
    return values.name + "=" + numbers.map(lambda v: "" if v != v else format(v, ".17g"))


def frame_fingerprints(secret: bytes, frame: pd.DataFrame, id_column: str | None = None
                       ) -> Fingerprints:
    """Fingerprints of a table's raw rows (every column, module docstring) and of its
    ``id_column``'s values."""
    frame = frame.rename(columns=str)
    columns = [_canonical_column(frame[c]) for c in sorted(frame.columns)]
    rows = functools.reduce(lambda a, b: a + "\x1f" + b, columns)
    found: Fingerprints = {"row": [_mac(secret, b"row\x1f" + r.encode()) for r in rows]}
    if id_column is not None:
        ids = frame[id_column].astype("string").fillna("")
        found["id"] = [_mac(secret, b"id\x1f" + str(v).encode()) for v in ids]
    return found


def _example_rows(dataset: GroupedDataset) -> Iterator[bytes]:
    """Each example's bytes (features, label, group), split by split, one at a time."""
    for split in (dataset.train, dataset.val, dataset.test):
        if split is None or len(split) == 0:
            continue
        x = split.x.reshape(len(split), -1)
        y, g = split.y.numpy().astype(np.int64), split.g.numpy().astype(np.int64)
        for i in range(len(split)):
            row = np.ascontiguousarray(x[i].numpy(), dtype=np.float32)
            yield row.tobytes() + y[i].tobytes() + g[i].tobytes()


def examples_md5(dataset: GroupedDataset) -> str:
    """md5 of a dataset's loaded examples: the source version of data that came with none
    (arrays or a frame given to :func:`dpfair.api.fit`)."""
    digest = hashlib.md5()
    for row in _example_rows(dataset):
        digest.update(row)
    return digest.hexdigest()


def dataset_fingerprints(secret: bytes, dataset: GroupedDataset, options: Any = None
                         ) -> Fingerprints:
    """Fingerprints of the people in ``dataset``: its raw table's rows when ``options`` is a
    ``kind: table`` declaration, else its loaded examples (module docstring)."""
    from dpfair.data.table_file import TableFileOptions, read_table

    if isinstance(options, TableFileOptions):
        frame, _ = read_table(options)
        return frame_fingerprints(secret, frame, options.id_column)
    return {"row": [_mac(secret, b"example\x1f" + r) for r in _example_rows(dataset)]}
