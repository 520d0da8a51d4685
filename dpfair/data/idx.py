"""Reader of the IDX format of MNIST and Fashion-MNIST (gzip-compressed), numpy only.

Header: two zero bytes, a type byte (0x08 = unsigned byte), the number of dimensions, then one
big-endian int32 per dimension, then the data.
"""

from __future__ import annotations

import gzip
from functools import lru_cache
from pathlib import Path

import numpy as np

from dpfair.errors import DataError


@lru_cache(maxsize=8)
def read_idx(path: str | Path, md5: str = "") -> np.ndarray:
    """The array stored in an IDX(.gz) file, read-only uint8; cached per (path, md5)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read IDX file {path}: {exc}") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{path} is not an unsigned-byte IDX file (bad magic {raw[:4]!r})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    expected = int(np.prod(shape)) + header
    if len(raw) != expected:
        raise DataError(f"{path}: {len(raw)} bytes, expected {expected} for shape {shape}")
    arr = np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)
    arr.flags.writeable = False
    return arr
