"""Prepared datasets on disk (the DVC ``prepare`` stage's outputs) and their data version.

``prepare(name, options, out_dir)`` writes ``<out_dir>/<name>/arrays.npz`` (x/y/g of each split,
class and group names, meta) and ``<out_dir>/<name>/summary.json`` (public facts only, see
``summarize``; the DVC stage records it as a metric). Both are written into a temporary directory
beside the target which then replaces the target by rename: on any error nothing (not even a
partial file) is left.

The npz is byte-for-byte deterministic (stored uncompressed, fixed zip timestamps), so the same
data gives the same md5 on every machine -- the data version DVC records in ``dvc.lock`` and
``data_version`` reads back. Images whose loader declares ``meta["pixel_scale"]`` (x = pixel /
scale) are stored as their uint8 pixels when that is exact, and divided again on loading, which
gives bit-identical float32 tensors at a quarter of the size.

A dataset with a fitted feature transform (``GroupedDataset.preprocessor``, tables read from a
file) keeps it inside ``arrays.npz`` as JSON (:meth:`TablePreprocessor.to_json`): nothing in a
prepared folder is a pickle, so loading one runs no code, and the transform is covered by the
md5 DVC records for the arrays. ``load_prepared(path, md5=...)`` checks that md5 before it
reads anything (a planted or edited file is refused).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import uuid
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel

from dpfair.data.checks import check_values
from dpfair.data.dataset import GroupedDataset, Split
from dpfair.data.preprocess import TablePreprocessor
from dpfair.data.registry import load_dataset
from dpfair.errors import DataError

ARRAYS = "arrays.npz"
SUMMARY = "summary.json"
PREPROCESSOR = "preprocessor"  # the key of the transform's JSON inside arrays.npz
_OLD_PICKLE = "preprocessor.pkl"  # written by dpfair before the JSON transform: never read
SPLITS = ("train", "val", "test")
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


PUBLIC_SUMMARY = "public facts only: shape, names, split sizes; no per-class or per-group counts"
EXACT_COUNTS = "exact counts: not private (opt-in)"


def summarize(ds: GroupedDataset, *, exact_counts: bool = False) -> dict[str, Any]:
    """What may be published about ``ds`` (JSON-ready): by default public facts only.

    Public: the dataset name, input shape, number of features (flattened input size),
    ``n_classes``, ``n_groups``, class and group names, and the row count of each split (so the
    split fractions). The training-set size n is treated as public, as DP-SGD accounting does:
    the sample rate q = B/n enters the accountant and is reported (Abadi et al. 2016, Sec. 3.1).

    Private: the per-class and per-group counts of every split. On the training split they are
    the statistics DPSGD-F releases only with Gaussian noise (Xu et al. 2021, Alg. 2, lines
    5-11: noisy per-group counts); a practitioner's validation and test splits are private data
    too. They are added (``per_class`` / ``per_group``: split -> name -> rows) only when
    ``exact_counts`` is True, and the record then says ``"privacy": EXACT_COUNTS``; otherwise
    it says ``PUBLIC_SUMMARY``.
    """
    splits = ds.splits()
    summary: dict[str, Any] = {
        "dataset": ds.name,
        "input_shape": list(ds.input_shape),
        "n_features": math.prod(ds.input_shape),
        "n_classes": ds.n_classes,
        "n_groups": ds.n_groups,
        "rows": {**{k: len(s) for k, s in splits.items()},
                 "total": sum(len(s) for s in splits.values())},
        "class_names": list(ds.class_names),
        "group_names": list(ds.group_names),
        "privacy": EXACT_COUNTS if exact_counts else PUBLIC_SUMMARY,
    }
    if exact_counts:
        arrays = {k: s.arrays() for k, s in splits.items()}
        summary["per_class"] = {k: _counts(y, ds.class_names) for k, (_, y, _) in arrays.items()}
        summary["per_group"] = {k: _counts(g, ds.group_names) for k, (_, _, g) in arrays.items()}
    return summary


def _counts(ids: np.ndarray, names: list[str]) -> dict[str, int]:
    c = np.bincount(ids, minlength=len(names)).tolist()
    return {name: int(n) for name, n in zip(names, c, strict=True)}


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """``np.savez`` with fixed zip timestamps: same arrays, same bytes (no zlib involved)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for key, arr in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(arr), allow_pickle=False)


def _pixels(x: np.ndarray, scale: float) -> np.ndarray | None:
    """uint8 pixels p with ``p / scale == x`` exactly (in float32), or None."""
    q = np.rint(x * np.float32(scale))
    if q.size and (q.min() < 0 or q.max() > 255):
        return None
    pixels = q.astype(np.uint8)
    return pixels if np.array_equal(_unscale(pixels, scale), x) else None


def _unscale(pixels: np.ndarray, scale: float) -> np.ndarray:
    # the same float32 operation as the loaders' make_split(..., divisor=scale)
    return np.divide(pixels.astype(np.float32), np.float32(scale), dtype=np.float32)


def _arrays(ds: GroupedDataset) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    scale = ds.meta.get("pixel_scale")
    for key, split in ds.splits().items():
        x, y, g = split.arrays()
        pixels = _pixels(x, scale) if scale else None
        if pixels is not None:
            out[f"pixels_{key}"] = pixels
            out[f"scale_{key}"] = np.array(float(scale))
        else:
            out[f"x_{key}"] = x
        out[f"y_{key}"] = y
        out[f"g_{key}"] = g
    out["class_names"] = np.array(ds.class_names, dtype=str)
    out["group_names"] = np.array(ds.group_names, dtype=str)
    out["name"] = np.array(ds.name)
    out["meta"] = np.array(json.dumps(ds.meta, sort_keys=True))
    if ds.preprocessor is not None:
        if not isinstance(ds.preprocessor, TablePreprocessor):
            raise DataError(f"dataset {ds.name!r}: its preprocessor is a "
                            f"{type(ds.preprocessor).__name__}; prepared data keeps only "
                            "dpfair's TablePreprocessor (saved as JSON, never as a pickle)")
        out[PREPROCESSOR] = np.array(ds.preprocessor.to_json())
    return out


def write_prepared(
    ds: GroupedDataset, out_dir: str | Path, *, exact_counts: bool = False
) -> dict[str, Any]:
    """Write ``ds`` to ``<out_dir>/<ds.name>/`` atomically; return its summary (``summarize``)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / ds.name
    summary = summarize(ds, exact_counts=exact_counts)
    tmp = out_dir / f".{ds.name}.tmp-{uuid.uuid4().hex}"
    tmp.mkdir()  # mode from the umask, unlike mkdtemp's 0700
    try:
        write_npz(tmp / ARRAYS, _arrays(ds))
        (tmp / SUMMARY).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        _replace_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary


def _replace_dir(new: Path, target: Path) -> None:
    """Put directory ``new`` at ``target`` by rename; an old ``target`` is removed after."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    try:
        os.replace(new, target)
    except OSError:
        if old is not None:
            os.replace(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def prepare(
    name: str,
    options: Mapping[str, Any] | BaseModel | None = None,
    out_dir: str | Path = "data/prepared",
    *,
    exact_counts: bool = False,
) -> dict[str, Any]:
    """Load dataset ``name`` with ``options`` and write it under ``<out_dir>/<name>/``.

    Returns the summary written to ``summary.json``: public facts only unless ``exact_counts``
    (then also the exact per-class / per-group counts, marked not private; see ``summarize``).
    """
    return write_prepared(load_dataset(name, options), out_dir, exact_counts=exact_counts)


def file_md5(path: Path) -> str:
    """md5 of a file's bytes (the hash DVC records for an output)."""
    digest = hashlib.md5()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_prepared(path: str | Path, md5: str | None = None) -> GroupedDataset:
    """Read a dataset written by ``prepare`` (its directory or its ``arrays.npz``).

    With ``md5`` (the version DVC recorded, :func:`data_version`) the file's bytes must have
    that md5, checked before anything is read. A DataError names the file if it differs, is
    missing, corrupt, or holds a NaN or inf feature or an id out of range
    (``checks.check_values``). Nothing is unpickled (arrays and JSON only).
    """
    path = Path(path)
    if path.is_dir():
        path = path / ARRAYS
    if not path.is_file():
        raise DataError(f"no prepared dataset at {path} (run `dpfair data prepare NAME`)")
    if md5 is not None and (found := file_md5(path)) != md5:
        raise DataError(f"prepared dataset {path} has md5 {found}, not the {md5} recorded for "
                        "it (dvc.lock): it changed after it was prepared. Prepare it again "
                        "(`dvc repro prepare@NAME` or `dpfair data prepare NAME`)")
    try:
        with np.load(path, allow_pickle=False) as z:
            if PREPROCESSOR not in z.files and (path.parent / _OLD_PICKLE).exists():
                raise DataError(f"{path.parent} holds {_OLD_PICKLE}, a transform an older "
                                "dpfair saved as a pickle, which dpfair no longer loads (it "
                                "could run code): prepare the dataset again")
            splits = {}
            for key in SPLITS:
                if f"pixels_{key}" in z.files:
                    x = _unscale(z[f"pixels_{key}"], float(z[f"scale_{key}"].item()))
                else:
                    x = z[f"x_{key}"]
                splits[key] = Split(x, z[f"y_{key}"], z[f"g_{key}"])
            ds = GroupedDataset(
                name=str(z["name"].item()), **splits,
                class_names=[str(s) for s in z["class_names"]],
                group_names=[str(s) for s in z["group_names"]],
                meta=json.loads(str(z["meta"].item())),
                preprocessor=(TablePreprocessor.from_json(str(z[PREPROCESSOR].item()), str(path))
                              if PREPROCESSOR in z.files else None),
            )
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as exc:
        raise DataError(f"corrupt prepared dataset {path}: {exc}") from exc
    return check_values(
        ds, f"prepared dataset {path}",
        f"prepare it again from its source (`dpfair data prepare {ds.name}`); do not edit "
        "the arrays by hand",
    )


def data_version(name: str, lock_path: str | Path = "dvc.lock") -> str | None:
    """The md5 DVC recorded for ``prepare@<name>``'s arrays in ``dvc.lock``, or None."""
    lock_path = Path(lock_path)
    if not lock_path.is_file():
        return None
    lock = yaml.safe_load(lock_path.read_text()) or {}
    stage = (lock.get("stages") or {}).get(f"prepare@{name}")
    if not stage:
        return None
    outs = stage.get("outs") or []
    for out in outs:
        if str(out.get("path", "")).endswith(ARRAYS):
            return out.get("md5")
    return outs[0].get("md5") if outs else None
