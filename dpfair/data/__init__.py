"""Datasets: registry, sources, loaders, preprocessing, prepared arrays.

Public API::

    load_dataset(name, options=None) -> GroupedDataset
    available_datasets() -> list[str]
    prepare(name, options=None, out_dir="data/prepared", *, exact_counts=False) -> dict
        # the summary: public facts only unless exact_counts (then marked not private)
    load_prepared(path) -> GroupedDataset
    data_version(name, lock_path="dvc.lock") -> str | None   # the prepared arrays' DVC md5
    source_version(name, options=None) -> str   # md5 of the source, without preparing it
"""

from dpfair.data.dataset import GroupedDataset, Split
from dpfair.data.prepared import data_version, load_prepared, prepare, summarize
from dpfair.data.registry import (
    available_datasets,
    get_spec,
    load_dataset,
    options_model,
    parse_options,
    source_version,
    specs,
)
from dpfair.errors import ChecksumError, DataError, DownloadError, SourceMissingError

__all__ = [
    "ChecksumError",
    "DataError",
    "DownloadError",
    "GroupedDataset",
    "SourceMissingError",
    "Split",
    "available_datasets",
    "data_version",
    "get_spec",
    "load_dataset",
    "load_prepared",
    "options_model",
    "parse_options",
    "prepare",
    "source_version",
    "specs",
    "summarize",
]
