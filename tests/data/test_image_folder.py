"""A generated folder of small PNGs (Pillow) as a kind: image_folder dataset, trained on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dpfair.config.params import parse_params
from dpfair.data import load_dataset, load_prepared, prepare, source_version
from dpfair.errors import ConfigError, DataError
from dpfair.training import TrainConfig, train

CLASSES = ("dunkel", "hell")


def _write_images(root: Path, per_cell: int = 30, size: int = 10, seed: int = 0) -> list[str]:
    """root/<group>/<class>/<i>.png: dark or bright noisy squares (the class is learnable)."""
    rng = np.random.default_rng(seed)
    files = []
    for group in ("gruppe_a", "gruppe_b"):
        for k, cls in enumerate(CLASSES):
            folder = root / group / cls
            folder.mkdir(parents=True)
            for i in range(per_cell):
                base = 60 + 130 * k + (20 if group == "gruppe_b" else 0)
                pixels = np.clip(rng.normal(base, 25, (size, size, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
                files.append(f"{group}/{cls}/{i}.png")
    return files


def _options(root: Path, **overrides) -> dict:
    return {"kind": "image_folder", "path": str(root), "group_level": 0, "image_size": 8,
            "min_group_train_rows": 5, **overrides}


def test_image_folder_with_groups_from_a_folder_level_trains_a_cnn(tmp_path: Path):
    root = tmp_path / "bilder"
    _write_images(root)
    declared = _options(root, mean=[0.5] * 3, std=[0.25] * 3)  # x = (pixel / 255 - .5) / .25
    params = parse_params({"datasets": {"bilder": declared}, "experiment": {"dataset": "bilder"}})
    ds = load_dataset("bilder", params.dataset("bilder"))
    assert ds.class_names == list(CLASSES) and ds.group_names == ["gruppe_a", "gruppe_b"]
    assert ds.input_shape == (3, 8, 8)
    assert len(ds.train) + len(ds.val) + len(ds.test) == 120
    assert float(ds.train.x.min()) >= -2.0 and float(ds.train.x.max()) <= 2.0
    assert float(ds.train.x.min()) < -1.0 and float(ds.train.x.max()) > 1.0
    assert ds.meta["data_version"] == source_version("bilder", params.dataset("bilder"))
    config = TrainConfig(method={"name": "nonprivate"}, sigma=0.0, epochs=2, batch_size=8,
                         lr=0.1, model={"name": "esipova_cnn", "channels": [8, 8]})
    result = train(config, ds)
    assert result.input_shape == (3, 8, 8)
    assert result.test_metrics["accuracy"] > 0.8  # chance is 0.5; brightness separates them


def test_groups_from_csv_grayscale_and_version(tmp_path: Path):
    root = tmp_path / "bilder"
    files = _write_images(root, per_cell=12)
    groups_csv = tmp_path / "gruppen.csv"
    groups_csv.write_text("datei,wer\n" + "".join(
        f"{f},{'x' if i % 3 else 'y'}\n" for i, f in enumerate(files)))
    options = _options(root, group_level=None, groups_csv=str(groups_csv), file_column="datei",
                       group_column="wer", grayscale=True)
    ds = load_dataset("bilder", options)
    assert ds.group_names == ["x", "y"] and ds.input_shape == (1, 8, 8)
    assert float(ds.train.x.min()) >= 0.0 and float(ds.train.x.max()) <= 1.0  # pixel / 255
    prepare("bilder", options, tmp_path / "prepared")
    back = load_prepared(tmp_path / "prepared" / "bilder")
    assert bool((back.train.x == ds.train.x).all()) and back.preprocessor is None
    version = source_version("bilder", options)
    Image.fromarray(np.zeros((10, 10, 3), np.uint8)).save(root / files[0])
    assert source_version("bilder", options) != version  # one image changed
    groups_csv.write_text("datei,wer\n" + "".join(f"{f},x\n" for f in files[1:]))
    with pytest.raises(DataError, match=rf"image {files[0]} has no group in .*gruppen.csv"):
        load_dataset("bilder", options)


def test_image_folder_errors(tmp_path: Path):
    with pytest.raises(DataError, match="image folder not found"):
        load_dataset("b", _options(tmp_path / "fehlt"))
    root = tmp_path / "bilder"
    _write_images(root, per_cell=6)
    (root / "gruppe_a" / "hell" / "kaputt.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"cannot read image .*kaputt\.png"):
        load_dataset("b", _options(root, min_group_train_rows=1))
    (root / "gruppe_a" / "hell" / "kaputt.png").unlink()
    with pytest.raises(DataError, match=r"groups 'gruppe_a', 'gruppe_b' of .*bilder .*have "
                                        r"fewer than 50 training rows"):
        load_dataset("b", _options(root, min_group_train_rows=50))
    with pytest.raises(ConfigError, match="exactly one of groups_csv and group_level"):
        load_dataset("b", _options(root, group_level=None))
