"""Dataset options for the released codes: ``group_ratios`` (fair-dp), ``numeric_scaling`` (Xu)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpfair.data import DataError, load_dataset
from dpfair.data.splits import ratio_index
from dpfair.errors import ConfigError


def _groups(ds) -> np.ndarray:
    return torch.cat([s.g for s in ds.splits().values()]).numpy()


def test_ratio_index_keeps_the_limiting_group_and_exact_proportions():
    g = np.array([0] * 100 + [1] * 60)
    idx = ratio_index(g, [1.0, 0.25], seed=3, names=["a", "b"])
    assert np.bincount(g[idx]).tolist() == [100, 25]
    assert np.all(np.diff(idx) > 0)  # sorted, no repeats
    # the second group limits here: 60 / 1 < 100 / 0.5, so all 60 b and 30 a are kept
    idx = ratio_index(g, [0.5, 1.0], seed=3, names=["a", "b"])
    assert np.bincount(g[idx]).tolist() == [30, 60]
    assert set(np.flatnonzero(g == 1)) <= set(idx)


def test_ratio_index_is_seeded():
    g = np.array([0] * 50 + [1] * 50)
    first = ratio_index(g, [1.0, 0.5], seed=0, names=["a", "b"])
    assert np.array_equal(first, ratio_index(g, [1.0, 0.5], seed=0, names=["a", "b"]))
    assert not np.array_equal(first, ratio_index(g, [1.0, 0.5], seed=1, names=["a", "b"]))


def test_ratio_index_refuses_a_wrong_length_or_an_empty_group():
    g = np.array([0, 0, 1])
    with pytest.raises(DataError, match="3 entries but the dataset has 2 groups"):
        ratio_index(g, [1.0, 1.0, 1.0], seed=0, names=["a", "b"])
    with pytest.raises(DataError, match=r"groups \['b'\] have no rows"):
        ratio_index(np.array([0, 0]), [1.0, 1.0], seed=0, names=["a", "b"])
    with pytest.raises(DataError, match="keep no row of group 'b'"):
        ratio_index(np.array([0] * 10 + [1] * 10), [1.0, 0.01], seed=0, names=["a", "b"])


@pytest.mark.parametrize("bad, match", [
    ({"group_ratios": [1.0, 0.0]}, "greater than 0"),
    ({"group_ratios": [1.0]}, "at least 2"),
    ({"group_ratios": [1.0, "0.5"]}, "valid number"),
])
def test_bad_group_ratios_are_config_errors(bad, match):
    with pytest.raises(ConfigError, match=match):
        load_dataset("dutch", bad)


def test_adult_group_ratios_needs_balance_groups_off():
    with pytest.raises(ConfigError, match="set balance_groups: false to use group_ratios"):
        load_dataset("adult", {"group_ratios": [1.0, 1.0]})


def test_dutch_released_code_ratio(mirror):
    """fair-dp's Dutch script: every man (30,147), a third as many women, before the split."""
    ds = load_dataset("dutch", {"group_ratios": [1.0, 0.333], "validation_fraction": 0.0})
    counts = np.bincount(_groups(ds)).tolist()
    assert counts == [30_147, int(0.333 * 30_147)]
    assert len(ds.test) == int(0.2 * sum(counts))
    test_share = float(ds.test.g.float().mean())  # the test set has the subsample's proportions
    assert abs(test_share - 0.333 / 1.333) < 0.02
    again = load_dataset("dutch", {"group_ratios": [1.0, 0.333], "validation_fraction": 0.0})
    assert torch.equal(ds.train.x, again.train.x)


def test_adult_released_code_ratio(mirror):
    """fair-dp's Adult script (group_ratios 1,1): every woman (14,695) and as many men."""
    ds = load_dataset("adult", {"balance_groups": False, "group_ratios": [1.0, 1.0]})
    assert np.bincount(_groups(ds)).tolist() == [14_695, 14_695]
    assert "group_ratios" in ds.meta["options"]
    default = load_dataset("adult", {"balance_groups": False})
    assert "group_ratios" not in default.meta["options"]  # defaults leave meta (and md5s) alone


def test_adult_minmax_scaling(mirror):
    """Xu's scaling: numeric features in [0, 1]; the other columns are unchanged."""
    ds = load_dataset("adult", {"balance_groups": False, "numeric_scaling": "minmax"})
    z = load_dataset("adult", {"balance_groups": False})
    x = torch.cat([s.x for s in ds.splits().values()])
    assert float(x[:, :5].min()) == 0.0 and float(x[:, :5].max()) == 1.0
    assert torch.equal(ds.train.x[:, 5:], z.train.x[:, 5:])
    assert not torch.equal(ds.train.x[:, :5], z.train.x[:, :5])
    assert "min-max" in ds.meta["normalisation"] and "numeric_scaling" not in z.meta["options"]
    with pytest.raises(ConfigError, match="minmax"):
        load_dataset("adult", {"numeric_scaling": "max"})
