"""Fixtures of the data tests: the real mirror, isolated source locations, loaded datasets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dpfair.data import load_dataset
from dpfair.data.sources import mirror_dir


@pytest.fixture(scope="session")
def mirror() -> Path:
    """The real data mirror (../shared/datasets). Required in CI; skipped elsewhere if absent."""
    path = mirror_dir()
    if path is None or not path.is_dir():
        if os.environ.get("CI"):
            pytest.fail("data mirror ../shared/datasets (or DPFAIR_DATA_MIRROR) is missing in CI")
        pytest.skip(
            "needs the data mirror (the adult, dutch, mnist and fashion_mnist raw files): set "
            "DPFAIR_DATA_MIRROR to a folder with the layout of ../shared/datasets (md5 in its "
            "SOURCES.md)"
        )
    return path


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """An empty mirror and an empty cache under tmp_path; downloads allowed (tests patch URLs)."""
    paths = {"mirror": tmp_path / "mirror", "cache": tmp_path / "cache"}
    for p in paths.values():
        p.mkdir()
    monkeypatch.setenv("DPFAIR_DATA_MIRROR", str(paths["mirror"]))
    monkeypatch.setenv("DPFAIR_CACHE", str(paths["cache"]))
    monkeypatch.delenv("DPFAIR_OFFLINE", raising=False)
    return paths


@pytest.fixture(scope="session")
def adult_full(mirror):
    """Adult, all 45,222 rows, no validation split."""
    return load_dataset("adult", {"balance_groups": False, "validation_fraction": 0.0})


@pytest.fixture(scope="session")
def mnist_default(mirror):
    return load_dataset("mnist")
