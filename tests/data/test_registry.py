"""Registry, options models and the synthetic dataset."""

from __future__ import annotations

import pytest
import torch

from dpfair.data import available_datasets, load_dataset, options_model, specs
from dpfair.data.options import DatasetOptions
from dpfair.errors import ConfigError

ALL = ["adult", "dutch", "mnist", "fashion_mnist", "celeba", "digits", "synthetic"]


def test_available_datasets():
    assert available_datasets() == ALL
    assert {n for n, s in specs().items() if not s.needs_files} == {"digits", "synthetic"}


@pytest.mark.parametrize("name", ALL)
def test_options_models_are_strict(name):
    model = options_model(name)
    assert issubclass(model, DatasetOptions)
    assert model.model_config["extra"] == "forbid"
    fields = model.model_fields
    assert "seed" in fields and "validation_fraction" in fields
    if name in ("adult", "dutch", "digits", "synthetic"):  # no official test split
        assert "test_fraction" in fields


def test_unknown_dataset_did_you_mean():
    with pytest.raises(ConfigError, match="unknown dataset 'adutl'; did you mean 'adult'"):
        load_dataset("adutl")


def test_bad_options_name_the_key():
    with pytest.raises(ConfigError) as err:
        load_dataset("synthetic", {"n_featurs": 3})
    assert "datasets.synthetic.n_featurs: unknown key 'n_featurs'; did you mean 'n_features'" in (
        str(err.value)
    )
    with pytest.raises(ConfigError, match=r"datasets\.synthetic\.n: Input should be greater"):
        load_dataset("synthetic", {"n": -5})


def test_synthetic_is_fast_deterministic_and_configurable():
    opts = {"n": 500, "n_features": 4, "n_classes": 3, "minority_fraction": 0.2, "seed": 7}
    ds = load_dataset("synthetic", opts)
    assert ds.input_shape == (4,) and ds.n_classes == 3 and ds.n_groups == 2
    splits = ds.splits().values()
    assert sum(len(s) for s in splits) == 500
    assert len(ds.test) == 100 and len(ds.val) == 40
    assert sum(int(s.g.sum()) for s in splits) == 100  # exact minority count
    again = load_dataset("synthetic", opts)
    assert torch.equal(again.train.x, ds.train.x) and torch.equal(again.val.g, ds.val.g)
    other = load_dataset("synthetic", {**opts, "seed": 8})
    assert not torch.equal(other.train.x, ds.train.x)
    for s in splits:
        assert s.x.dtype == torch.float32 and s.y.dtype == torch.int64 and s.g.dtype == torch.int64


def test_loaded_tensors_do_not_alias_the_caches():
    ds = load_dataset("digits")
    ds.train.x.zero_()
    ds.test.y.fill_(3)
    again = load_dataset("digits")
    assert float(again.train.x.max()) == 1.0
    assert len(set(again.test.y.tolist())) == 10
