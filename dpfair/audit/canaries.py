"""Input-space canaries and the training set they are inserted into (Steinke et al. 2023,
Sec. 2: each canary included independently with probability 1/2).

Kinds, each drawn from and labelled with one protected group ``k`` (``g = k``):

* ``mislabel``: ``m`` training examples of group ``k`` with their label changed to the next
  class (``(y + 1) mod C``). All ``m`` originals leave the training set, and the mislabelled
  copy of each goes in with probability 1/2, so an excluded canary is absent in every form.
* ``ood``: out-of-distribution inputs, i.i.d. ``N(0, scale^2)`` in every input coordinate
  (far from standardised features at ``scale`` 3), with a uniformly random label.

The inclusion coins are secret (:func:`coin_generator`): drawn from OS entropy that is kept
nowhere, like the training noise, unless the run is ``reproducible``.
The audit itself holds them in memory to score its guesses.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from dpfair.data.dataset import GroupedDataset, Split
from dpfair.errors import DataError

InputKind = Literal["mislabel", "ood"]


@dataclass(frozen=True)
class Canaries:
    """The canaries (``split``: inputs, canary labels, groups), which of them are included,
    and for ``mislabel`` the training indices they were made from (``sources``)."""

    split: Split
    included: np.ndarray
    sources: np.ndarray

    def __len__(self) -> int:
        return len(self.split)


def coin_generator(seed: int | None) -> np.random.Generator:
    """The canaries' randomness: from ``seed`` when reproducible (``None``: OS entropy)."""
    return np.random.default_rng(secrets.randbits(128) if seed is None else seed)


def _mislabelled(dataset: GroupedDataset, groups: Sequence[int], m: int,
                 rng: np.random.Generator) -> tuple[Split, np.ndarray]:
    train, sources = dataset.train, []
    g = train.g.numpy()
    for k in groups:
        members = np.flatnonzero(g == k)
        if len(members) < m:
            raise DataError(
                f"group {dataset.group_names[k]!r} has {len(members)} training examples, fewer "
                f"than the {m} canaries asked for; lower audit.canaries (--canaries) to at most "
                f"{len(members)}"
            )
        sources.append(rng.choice(members, size=m, replace=False))
    index = np.concatenate(sources)
    picked = train.subset(index)
    flipped = (picked.y + 1) % dataset.n_classes
    return Split(picked.x.clone(), flipped, picked.g.clone()), index


def _out_of_distribution(dataset: GroupedDataset, groups: Sequence[int], m: int, scale: float,
                         rng: np.random.Generator) -> Split:
    n = m * len(groups)
    x = rng.normal(0.0, scale, size=(n, *dataset.input_shape)).astype(np.float32)
    y = rng.integers(0, dataset.n_classes, size=n)
    g = np.repeat(np.asarray(groups, dtype=np.int64), m)
    return Split(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(g))


def make_canaries(
    dataset: GroupedDataset,
    kind: InputKind,
    groups: Sequence[int],
    m: int,
    rng: np.random.Generator,
    *,
    ood_scale: float = 3.0,
) -> Canaries:
    """``m`` canaries of ``kind`` per group of ``groups`` (group ids), with secret coins from
    ``rng`` (module docstring)."""
    if kind == "mislabel":
        if dataset.n_classes < 2:
            raise DataError(f"{dataset.name!r} has one class: a mislabelled canary needs two")
        split, sources = _mislabelled(dataset, groups, m, rng)
    elif kind == "ood":
        split, sources = _out_of_distribution(dataset, groups, m, ood_scale, rng), np.empty(0)
    else:
        raise ValueError(f"unknown input-space canary kind {kind!r} (mislabel, ood)")
    included = rng.random(len(split)) < 0.5
    return Canaries(split, included, sources.astype(np.int64))


def with_canaries(dataset: GroupedDataset, canaries: Canaries) -> GroupedDataset:
    """``dataset`` whose training split lost every canary's source example and gained the
    included canaries, appended (Poisson sampling ignores the order)."""
    train = dataset.train
    keep = np.ones(len(train), dtype=bool)
    keep[canaries.sources] = False
    rest = train.subset(np.flatnonzero(keep))
    add = canaries.split.subset(np.flatnonzero(canaries.included))
    merged = Split(torch.cat([rest.x, add.x]), torch.cat([rest.y, add.y]),
                   torch.cat([rest.g, add.g]))
    return dataclasses.replace(dataset, train=merged)
