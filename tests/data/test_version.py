"""The data version: md5 of the source without preparing it, equal to meta["data_version"]."""

from __future__ import annotations

import hashlib

import pytest

from dpfair.data import load_dataset, source_version
from dpfair.data.sources import sources_of
from dpfair.data.version import manifest_version
from dpfair.errors import ConfigError


def test_builtin_version_is_the_manifest_of_its_canonical_md5s() -> None:
    files = sources_of("adult")
    assert len(files) == 2
    expected = hashlib.md5(
        "".join(f"{f.filename} {f.md5}\n" for f in sorted(files, key=lambda f: f.filename))
        .encode()
    ).hexdigest()
    assert source_version("adult") == expected == manifest_version(
        (f.filename, f.md5) for f in files
    )


def test_loaded_dataset_carries_its_source_version() -> None:
    ds = load_dataset("synthetic", {"n": 200})
    assert ds.meta["data_version"] == source_version("synthetic", {"n": 200})
    assert source_version("synthetic", {"n": 200}) != source_version("synthetic", {"n": 300})
    assert ds.preprocessor is None


def test_unknown_dataset_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown dataset 'adutl'.*did you mean 'adult'"):
        source_version("adutl")
