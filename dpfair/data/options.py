"""Base pydantic models of dataset options (one subclass per dataset, next to its loader).

Every options model is strict (``"0.1"`` is not a number, ``1`` is not a boolean), refuses
``.inf`` and ``.nan`` for every number (none of them means anything infinite: ``class_sep: .inf``
would give NaN features) and forbids unknown keys, so a typo in params.yaml is an error, never a
silently ignored setting.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat


class DatasetOptions(BaseModel):
    """Options shared by every dataset: the split seed and the validation fraction.

    The validation split is carved from the training split. ``validation_fraction: 0`` gives
    the papers' training sets exactly (e.g. Dutch n_train = 48,336) and an empty validation split.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    seed: int = Field(0, ge=0, description="seed of every random choice (splits, sampling)")
    validation_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="fraction of the training split held out for validation"
    )


class HoldoutOptions(DatasetOptions):
    """Options of datasets without an official test split: a seeded random test split."""

    test_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="fraction of rows for test")


class GroupRatioOptions(HoldoutOptions):
    """A holdout dataset whose groups can be subsampled to given relative sizes.

    ``group_ratios`` (one positive number per group, in group order) keeps the largest subsample
    whose group sizes are proportional to it, e.g. ``[1, 0.333]`` keeps every man and a third
    as many women as men (Esipova et al.'s released code, fair-dp ``group_ratios``). As in that
    code it subsamples **before** the train/test split, with the split seed, so the test set
    has the same proportions. Counts are exact (``floor``); fair-dp keeps each row with a
    probability, so its counts vary around these. Unset (default): every row is kept.
    """

    group_ratios: list[PositiveFloat] | None = Field(
        None, min_length=2,
        description="relative group sizes to subsample to before the split (default: all rows)",
    )
