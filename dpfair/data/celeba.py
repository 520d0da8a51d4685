"""CelebA in its official layout (Esipova et al. 2023, App. B.1): target Male, group Eyeglasses.

Layout under ``root``::

    img_align_celeba/000001.jpg ...     (or img_align_celeba/img_align_celeba/, as unzipped)
    list_attr_celeba.txt                 count line, 40 attribute names, then "<file> -1 1 ..."
    list_eval_partition.txt              "<file> <0 train | 1 validation | 2 test>"

Images are resized to ``image_size`` x ``image_size`` (64 as in the paper, bilinear, no crop,
like the paper's ``Resize((64, 64))``), RGB, float32 in [0, 1]: x has shape (n, 3, 64, 64).
Label 1 = Male; group 1 = with eyeglasses ("W"), 0 = without ("W/O"). Official split; the
official validation partition is the validation split unless ``validation_fraction`` is set,
which then carves it from the official train partition instead.

CelebA is not in the mirror (1.4 GB) and has no canonical per-image md5, so ``root`` defaults to
``<mirror>/celeba`` then ``<cache>/celeba`` and files are not md5-checked. All 202,599 images as
float32 take ~10 GB: use ``max_rows_per_split`` (seeded subsample) on small machines. For the
same reason CelebA has no DVC prepare stage.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import Field

from dpfair.data.dataset import GroupedDataset
from dpfair.data.options import DatasetOptions
from dpfair.data.registry import register
from dpfair.data.sources import cache_dir, mirror_dir
from dpfair.data.splits import holdout, make_split, rng
from dpfair.data.version import tree_version
from dpfair.errors import DataError, SourceMissingError

ATTR_FILE = "list_attr_celeba.txt"
PARTITION_FILE = "list_eval_partition.txt"
IMAGE_DIR = "img_align_celeba"
CLASS_NAMES = ["female", "male"]
GROUP_NAMES = ["without eyeglasses", "with eyeglasses"]


class CelebAOptions(DatasetOptions):
    """Options of ``celeba``."""

    root: str | None = Field(None, description="CelebA root (default <mirror>/celeba)")
    image_size: int = Field(64, ge=8, description="side of the resized square images")
    validation_fraction: float | None = Field(  # type: ignore[assignment]
        None, ge=0.0, lt=1.0,
        description="None: official validation partition; else a fraction of official train",
    )
    max_rows_per_split: int | None = Field(
        None, ge=1, description="seeded subsample of each split (memory: full set ~10 GB)"
    )


def _candidate_roots(opts: CelebAOptions) -> list[Path]:
    if opts.root is not None:
        return [Path(opts.root).expanduser()]
    mirror = mirror_dir()
    roots = [mirror / "celeba"] if mirror is not None else []
    return roots + [cache_dir() / "celeba"]


def find_root(opts: CelebAOptions) -> tuple[Path, Path]:
    """(root, image directory) of the first candidate root holding the official layout."""
    looked = []
    for root in _candidate_roots(opts):
        images = root / IMAGE_DIR
        if (images / IMAGE_DIR).is_dir():
            images = images / IMAGE_DIR
        missing = [p for p in (root / ATTR_FILE, root / PARTITION_FILE, images) if not p.exists()]
        if not missing:
            return root, images
        looked.append(f"{root} (missing {', '.join(str(p) for p in missing)})")
    raise SourceMissingError(
        "cannot find CelebA in its official layout (img_align_celeba/, list_attr_celeba.txt, "
        "list_eval_partition.txt); looked in:\n  " + "\n  ".join(looked)
        + "\nSet datasets.celeba.root to the directory holding them."
    )


def read_attributes(path: Path, names: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """``{attribute: {file: 0/1}}`` for the requested attributes (file values are -1/1)."""
    lines = path.read_text().splitlines()
    header = lines[1].split()
    try:
        cols = [header.index(n) for n in names]
    except ValueError:
        raise DataError(f"{path}: attributes {names} not all in header {header}") from None
    out: dict[str, dict[str, int]] = {n: {} for n in names}
    for line in lines[2:]:
        parts = line.split()
        if not parts:
            continue
        if len(parts) != len(header) + 1:
            raise DataError(f"{path}: malformed line {line!r}")
        for n, c in zip(names, cols, strict=True):
            out[n][parts[0]] = 1 if parts[c + 1] == "1" else 0
    return out


def read_partition(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or parts[1] not in {"0", "1", "2"}:
            raise DataError(f"{path}: malformed line {line!r} (expected '<file> 0|1|2')")
        out[parts[0]] = int(parts[1])
    return out


def _load_images(images: Path, files: list[str], size: int) -> np.ndarray:
    from PIL import Image

    out = np.empty((len(files), 3, size, size), dtype=np.uint8)
    for i, name in enumerate(files):
        try:
            with Image.open(images / name) as img:
                arr = np.asarray(img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR))
        except OSError as exc:
            raise DataError(f"celeba: cannot read image {images / name}: {exc}") from exc
        out[i] = arr.transpose(2, 0, 1)
    return out


def celeba_version(opts: CelebAOptions) -> str:
    """Manifest version of the two label files (they list every image)."""
    root, _ = find_root(opts)
    return tree_version(root, [root / ATTR_FILE, root / PARTITION_FILE])


@register("celeba", CelebAOptions, "CelebA 64x64, target Male, group Eyeglasses (official split)",
          needs_files=True, version=celeba_version)
def load_celeba(opts: CelebAOptions) -> GroupedDataset:
    root, images = find_root(opts)
    attrs = read_attributes(root / ATTR_FILE, ("Male", "Eyeglasses"))
    partition = read_partition(root / PARTITION_FILE)
    parts: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for name, p in sorted(partition.items()):
        if name not in attrs["Male"]:
            raise DataError(f"celeba: {name} is in {PARTITION_FILE} but not in {ATTR_FILE}")
        parts[("train", "val", "test")[p]].append(name)
    if opts.validation_fraction is not None:
        train = np.array(parts["train"])
        keep, val = holdout(len(train), opts.validation_fraction, opts.seed, stream=2)
        parts["train"], parts["val"] = sorted(train[keep]), sorted(train[val])
    if opts.max_rows_per_split is not None:
        for i, key in enumerate(parts):
            if len(parts[key]) > opts.max_rows_per_split:
                pick = rng(opts.seed, stream=10 + i).choice(
                    len(parts[key]), size=opts.max_rows_per_split, replace=False
                )
                parts[key] = [parts[key][j] for j in sorted(pick)]
    splits = {}
    for key, files in parts.items():
        y = np.array([attrs["Male"][f] for f in files], dtype=np.int64)
        g = np.array([attrs["Eyeglasses"][f] for f in files], dtype=np.int64)
        x = _load_images(images, files, opts.image_size)
        splits[key] = make_split(x, y, g, divisor=255.0)
    return GroupedDataset(
        name="celeba", **splits,
        class_names=list(CLASS_NAMES), group_names=list(GROUP_NAMES),
        meta={"options": opts.model_dump(mode="json"), "pixel_scale": 255, "root": str(root)},
    )
