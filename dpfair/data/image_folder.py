"""``kind: image_folder``: a folder of class sub-folders of PNG/JPEG images (Pillow).

::

    datasets:
      scans:
        kind: image_folder
        path: data/scans          # data/scans/<class>/<image>.png, or .../<group>/<class>/...
        groups_csv: data/scans_groups.csv   # columns file,group (file: path under `path`)
        # or group_level: 0       # the group is the first folder level under `path`
        image_size: 32            # resized to 32 x 32 (bilinear)
        grayscale: false
        mean: [0.5, 0.5, 0.5]     # x = (pixel / 255 - mean) / std per channel; null: pixel / 255
        std: [0.25, 0.25, 0.25]

The class of an image is the folder at ``class_level`` of its path under ``path`` (default -1:
the folder holding it). Splits are those of tables (seeded, stratified by group and label) with
the same checks. Its data version is the md5 of the manifest of every image (and the groups CSV).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from dpfair.data.dataset import DatasetPreview, GroupedDataset, Inspect
from dpfair.data.options import HoldoutOptions
from dpfair.data.registry import register_kind
from dpfair.data.splits import make_split, split_index
from dpfair.data.tabular_frame import Where, check_splits
from dpfair.data.version import tree_version
from dpfair.errors import DataError, SourceMissingError

SUFFIXES = (".png", ".jpg", ".jpeg")


class ImageFolderOptions(HoldoutOptions):
    """Options of a ``kind: image_folder`` dataset (exactly one of groups_csv, group_level)."""

    kind: Literal["image_folder"] = Field(description="a folder of class sub-folders of images")
    path: str = Field(min_length=1, description="the folder (relative to the working directory)")
    class_level: int = Field(-1, description="folder level of the class (-1: the parent)")
    groups_csv: str | None = Field(None, description="CSV mapping each image to its group")
    file_column: str = Field("file", description="groups_csv: the image's path under `path`")
    group_column: str = Field("group", description="groups_csv: the group")
    group_level: int | None = Field(None, description="folder level of the group")
    image_size: int = Field(32, ge=4, le=1024, description="side of the resized square")
    grayscale: bool = Field(False, description="one channel instead of RGB")
    mean: list[float] | None = Field(None, description="per-channel mean subtracted (0..1)")
    std: list[float] | None = Field(None, description="per-channel std divided by (> 0)")
    min_group_train_rows: int = Field(10, ge=1, description="fewest training images per group")

    @model_validator(mode="after")
    def _consistent(self) -> ImageFolderOptions:
        if (self.groups_csv is None) == (self.group_level is None):
            raise ValueError("give exactly one of groups_csv and group_level")
        channels = 1 if self.grayscale else 3
        if (self.mean is None) != (self.std is None):
            raise ValueError("give both mean and std, or neither")
        for key in ("mean", "std"):
            values = getattr(self, key)
            if values is not None and len(values) != channels:
                raise ValueError(f"{key}: give {channels} value(s), one per channel")
        if self.std is not None and min(self.std) <= 0:
            raise ValueError("std: every value must be > 0")
        return self


def image_files(opts: ImageFolderOptions) -> tuple[Path, list[Path]]:
    """The folder and its images in sorted order (SourceMissingError / DataError if none)."""
    root = Path(opts.path).expanduser()
    if not root.is_dir():
        where = root if root.is_absolute() else f"{root} (relative to {Path.cwd()})"
        raise SourceMissingError(f"image folder not found: {where}. Fix: set the dataset's "
                                 "path to a folder of class sub-folders")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
    if not files:
        raise DataError(f"no PNG or JPEG image under {root}; expected {root}/<class>/<image>.png")
    return root, files


def _level(root: Path, file: Path, level: int, what: str) -> str:
    folders = file.relative_to(root).parts[:-1]
    try:
        return folders[level]
    except IndexError:
        raise DataError(
            f"image {file} has no folder at level {level} under {root} (its folders: "
            f"{list(folders)}) for its {what}. Fix: put every image in "
            f"{root}/<class>/ (or <group>/<class>/), or set {what}_level"
        ) from None


def _csv_groups(opts: ImageFolderOptions, root: Path, files: list[Path]) -> list[str]:
    import pandas as pd

    from dpfair.data.preprocess import to_categories

    path = Path(str(opts.groups_csv)).expanduser()
    if not path.is_file():
        raise SourceMissingError(f"groups CSV not found: {path}. Fix: set groups_csv to a CSV "
                                 f"with columns {opts.file_column},{opts.group_column}")
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {path} as CSV: {exc}") from None
    for col in (opts.file_column, opts.group_column):
        if col not in table.columns:
            raise DataError(f"column {col!r} is not in {path} (columns: "
                            f"{', '.join(map(str, table.columns))}); set file_column and "
                            "group_column to its columns")
    group = dict(zip(table[opts.file_column].astype(str),
                     to_categories(table[opts.group_column]), strict=True))
    out = []
    for f in files:
        rel = f.relative_to(root).as_posix()
        value = group.get(rel, group.get(f.name))
        if value is None or value != value:  # absent or NaN
            raise DataError(f"image {rel} has no group in {path} (column {opts.group_column!r})."
                            f" Fix: add a row '{rel},<group>' to the CSV")
        out.append(value)
    return out


def _pixels(files: list[Path], opts: ImageFolderOptions) -> np.ndarray:
    from PIL import Image

    size, mode = opts.image_size, "L" if opts.grayscale else "RGB"
    out = np.empty((len(files), 1 if opts.grayscale else 3, size, size), dtype=np.uint8)
    for i, file in enumerate(files):
        try:
            with Image.open(file) as img:
                arr = np.asarray(img.convert(mode).resize((size, size),
                                                          Image.Resampling.BILINEAR))
        except OSError as exc:
            raise DataError(f"cannot read image {file}: {exc}. Fix: replace or remove the "
                            "file (PNG or JPEG)") from None
        out[i] = arr[None] if opts.grayscale else arr.transpose(2, 0, 1)
    return out


def folder_version(opts: ImageFolderOptions) -> str:
    root, files = image_files(opts)
    extra = [Path(opts.groups_csv).expanduser()] if opts.groups_csv else []
    return tree_version(root, files, [p for p in extra if p.is_file()])


def _codes(values: list[str]) -> tuple[np.ndarray, list[str]]:
    names = sorted(set(values))
    code = {v: i for i, v in enumerate(names)}
    return np.array([code[v] for v in values], dtype=np.int64), names


@register_kind("image_folder", ImageFolderOptions, "your folder of class sub-folders of images",
               version=folder_version)
def load_image_folder(name: str, opts: ImageFolderOptions, inspect: Inspect | None = None
                      ) -> GroupedDataset:
    root, files = image_files(opts)
    y, class_names = _codes([_level(root, f, opts.class_level, "class") for f in files])
    if len(class_names) < 2:
        raise DataError(f"{root} has a single class folder ({class_names[0]!r}): a classifier "
                        "needs at least two. Fix: add a sub-folder per class")
    if opts.groups_csv is not None:
        g, group_names = _codes(_csv_groups(opts, root, files))
        groups_from = f"groups from {opts.groups_csv}"
    else:
        g, group_names = _codes([_level(root, f, int(opts.group_level), "group") for f in files])
        groups_from = f"groups from folder level {opts.group_level}"
    where = Where(str(root), f"datasets.{name}.")
    if inspect is not None:
        side = opts.image_size
        inspect(DatasetPreview(name, group_names, class_names,
                               (1 if opts.grayscale else 3, side, side)))
    index = dict(zip(("train", "val", "test"), split_index(y, g, opts), strict=True))
    check_splits(y, g, index, class_names, group_names, min_rows=opts.min_group_train_rows,
                 groups_from=groups_from, target="the class folders", where=where)
    pixels = _pixels(files, opts)
    meta = {"options": opts.model_dump(mode="json"), "source": str(root),
            "image_transform": {"size": opts.image_size, "grayscale": opts.grayscale,
                                "mean": opts.mean, "std": opts.std}}
    if opts.mean is None:
        splits = {k: make_split(pixels[i], y[i], g[i], divisor=255.0) for k, i in index.items()}
        meta["pixel_scale"] = 255
    else:
        mean = np.array(opts.mean, np.float32)[:, None, None]
        std = np.array(opts.std, np.float32)[:, None, None]
        x = (pixels.astype(np.float32) / np.float32(255) - mean) / std
        splits = {k: make_split(x[i], y[i], g[i]) for k, i in index.items()}
    return GroupedDataset(name=name, **splits, class_names=class_names,
                          group_names=group_names, meta=meta)
