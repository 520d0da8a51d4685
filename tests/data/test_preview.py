"""`load_dataset(..., inspect=)`: a loader shows the dataset's preview (group and class names,
input shape) before its rows are split, so `dpfair run` refuses a wrong pair or model first."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dpfair.data import load_dataset
from dpfair.data.dataset import DatasetPreview
from dpfair.errors import DataError

from .own_tables import loans_frame, table_options
from .test_image_folder import _options, _write_images


class Stop(Exception):
    """Raised by an inspect callback: what it raises must reach the caller unchanged."""


def _recorder() -> tuple[list[DatasetPreview], Callable[[DatasetPreview], None]]:
    seen: list[DatasetPreview] = []
    return seen, seen.append


def test_a_table_is_previewed_with_the_names_and_shape_it_loads_with(tmp_path: Path) -> None:
    path = tmp_path / "loans.csv"
    loans_frame().to_csv(path, index=False)
    seen, inspect = _recorder()
    ds = load_dataset("loans", table_options(path), inspect=inspect)
    assert len(seen) == 1
    (preview,) = seen
    assert preview == DatasetPreview.of(ds)  # every level is in the training split here
    assert preview.group_names == ds.group_names and preview.n_classes == 2


def test_a_fitted_width_counts_every_row_so_it_is_never_below_the_training_split(
        tmp_path: Path) -> None:
    frame = loans_frame()
    frame.loc[frame.index[:2], "Beruf"] = "Selten"  # two rows: at most one can train
    path = tmp_path / "loans.csv"
    frame.to_csv(path, index=False)
    seen, inspect = _recorder()
    ds = load_dataset("loans", table_options(path, test_fraction=0.5), inspect=inspect)
    assert seen[0].input_shape[0] >= ds.input_shape[0]


def test_the_preview_comes_before_the_split_and_its_error_propagates(tmp_path: Path) -> None:
    """A group too small to train is found only after the split: an inspect that raises
    first proves it ran before."""
    frame = loans_frame()
    path = tmp_path / "loans.csv"
    frame.to_csv(path, index=False)
    tiny = table_options(path, min_group_train_rows=100)
    with pytest.raises(DataError, match="fewer than 100 training rows"):
        load_dataset("loans", tiny)

    def refuse(preview: DatasetPreview) -> None:
        raise Stop(preview.group_names)

    with pytest.raises(Stop):
        load_dataset("loans", tiny, inspect=refuse)


def test_an_image_folder_is_previewed_before_its_images_are_read(tmp_path: Path) -> None:
    root = tmp_path / "bilder"
    _write_images(root)
    seen, inspect = _recorder()
    ds = load_dataset("bilder", _options(root, grayscale=True), inspect=inspect)
    assert seen == [DatasetPreview.of(ds)] and ds.input_shape == (1, 8, 8)
    (root / "gruppe_a" / "hell" / "0.png").write_bytes(b"not an image")
    with pytest.raises(DataError, match="cannot read image"):
        load_dataset("bilder", _options(root))
    with pytest.raises(Stop):  # before the pixels: the broken file is never opened
        load_dataset("bilder", _options(root), inspect=lambda p: (_ for _ in ()).throw(Stop()))


def test_a_builtin_dataset_is_previewed_once_loaded() -> None:
    seen, inspect = _recorder()
    ds = load_dataset("synthetic", {"n": 400}, inspect=inspect)
    assert seen == [DatasetPreview.of(ds)]
