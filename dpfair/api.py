"""``fit``: train your own ``nn.Module`` privately from Python, on the CLI's training path.

::

    import dpfair
    result = dpfair.fit(net, (x, y, groups), method="dpsgd", target_epsilon=3.0, epochs=10,
                        batch_size=64, lr=0.5, C=1.0)
    result.epsilon, result.test_metrics, result.load_model()

``fit`` only assembles a :class:`~dpfair.training.TrainConfig` and a
:class:`~dpfair.data.GroupedDataset` and calls :func:`dpfair.training.train` with the module:
the same validation, plan (σ calibrated to ``target_epsilon`` by
:func:`~dpfair.training.make_plan`), model check
(:func:`~dpfair.engine.model_check.check_model`), privacy gate (``budget``, the lifetime
ledger: :mod:`dpfair.ledger.gate`), secret randomness and accounting as ``dpfair train``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError
from torch import nn

from dpfair.config.sections import BudgetSection
from dpfair.data.checks import check_values
from dpfair.data.dataset import GroupedDataset
from dpfair.data.options import HoldoutOptions
from dpfair.data.splits import train_val_test
from dpfair.engine.model_check import check_model
from dpfair.errors import ConfigError, DataError, did_you_mean, format_validation_error
from dpfair.ledger import PrivacyGate
from dpfair.ledger.gate import check_preprocessing
from dpfair.methods import registered_methods
from dpfair.models import check_output_shape
from dpfair.release.plan import method_release, release_plan
from dpfair.training import TrainConfig, TrainResult, make_plan, train

#: Epochs when neither ``epochs`` nor ``steps`` is given.
DEFAULT_EPOCHS = 10


@dataclass
class FitResult(TrainResult):
    """A :class:`~dpfair.training.TrainResult` with the names of the classes and groups that
    its per-class and per-group metrics (``test_metrics["group_accuracy"]``, ...) index."""

    class_names: list[str] = field(default_factory=list)
    group_names: list[str] = field(default_factory=list)
    #: a DataFrame's fitted feature transform (``.transform(raw_rows)`` before the model), else
    #: None; it holds exact statistics of the training rows unless declared data-independent
    preprocessor: Any = None


def fit(
    model: nn.Module,
    data: Any,
    *,
    method: str = "dpsgd",
    target_epsilon: float | None = None,
    sigma: float | None = None,
    delta: float | None = None,
    epochs: int | None = None,
    steps: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    seed: int = 0,
    target: str | None = None,
    protected: str | Sequence[str] | None = None,
    features: Sequence[str] | None = None,
    test_fraction: float | None = None,
    validation_fraction: float | None = None,
    split_seed: int | None = None,
    data_options: Mapping[str, Any] | None = None,
    budget: BudgetSection | Mapping[str, Any] | None = None,
    root: str | Path | None = None,
    source: str = "dpfair.api.fit",
    **options: Any,
) -> FitResult:
    """Train a copy of ``model`` on ``data`` with ``method``; ``model`` itself is left as is.

    Args:
        model: any ``nn.Module`` mapping a batch ``(B, *input_shape)`` to ``(B, n_classes)``
            logits; refused (``PrivacyError``) if a layer mixes samples (BatchNorm: use
            GroupNorm or LayerNorm) or keeps state across them.
        data: a :class:`~dpfair.data.GroupedDataset`; or ``(x, y)`` / ``(x, y, groups)``
            tensors or arrays (labels and groups of any kind, named by their values; one group
            if none), split at random; or a pandas DataFrame with column names ``target``,
            ``protected`` (one or a list) and ``features`` (default: all others), prepared by
            :func:`dpfair.data.tabular_frame.dataset_from_frame` (stratified splits, one-hot
            encoding and standardisation) with ``data_options`` (``missing``,
            ``positive_label``, ...).
        test_fraction, validation_fraction, split_seed: the splits of arrays or a DataFrame
            (``test_fraction`` of the rows for test, ``validation_fraction`` of the rest for
            validation); None: the defaults of :class:`dpfair.data.options.HoldoutOptions`.
        method: a method name (``dpfair.methods.registered_methods()``).
        target_epsilon, sigma: a private method needs exactly one; σ is then the smallest
            reaching ``target_epsilon`` at ``delta``.
        delta, epochs, steps, batch_size, lr: as in ``TrainConfig`` (its defaults when None;
            ``epochs`` is :data:`DEFAULT_EPOCHS` when neither it nor ``steps`` is given).
        seed: the initialisation seed (unused here: the module comes initialised) and, with
            ``reproducible=True``, the batches and noise.
        budget: the privacy budget, as params.yaml's ``budget`` section (a mapping or a
            ``BudgetSection``; None: its defaults, which refuse a method without a proven
            guarantee). The run passes the privacy gate like every dpfair command: checked
            against ``budget``, then charged in the privacy ledger ``budget.ledger`` (by
            default ``.dpfair/ledger.sqlite`` under ``root``, the working directory's project:
            the one file ``fit`` writes) on the people in ``data``, whatever ``source`` names
            them, and refused over ``budget.lifetime_epsilon`` before anything trains.
        **options: any other ``TrainConfig`` field (``momentum``, ``optimizer``, ``device``,
            ``engine``, ``progress``, ...); every other name is a hyperparameter of the method
            (e.g. ``C``, the clip bound of ``dpsgd``).

    Returns:
        A :class:`FitResult` (a ``TrainResult``): ``epsilon`` (at ``delta``), ``sigma``,
        ``test_metrics`` (per group and class, in the order of ``group_names`` and
        ``class_names``) and ``load_model()``, the trained module.

    Raises ``ConfigError`` for a bad option (naming it), ``DataError`` for bad data and
    ``PrivacyError`` for a model that cannot be trained privately.
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    config = _config(
        method, options, target_epsilon=target_epsilon, sigma=sigma, delta=delta,
        epochs=epochs if epochs is not None or steps is not None else DEFAULT_EPOCHS,
        steps=steps, batch_size=batch_size, lr=lr, seed=seed,
    )
    dataset = _dataset(
        data, target=target, protected=protected, features=features,
        test_fraction=test_fraction, validation_fraction=validation_fraction,
        split_seed=split_seed, data_options=data_options,
    )
    check_output_shape(model, dataset.input_shape, dataset.n_classes)
    check_model(model, dataset.input_shape, private=config.method.is_private)
    section = _budget(budget)
    check_preprocessing(section, dataset)
    delta = section.delta or config.delta
    plan = make_plan(config, len(dataset.train), dataset.n_groups, len(dataset.test))
    release = method_release(method, config.method.privacy_guarantee, [seed], [plan.event], None,
                             config.reproducible, delta, [plan.test])
    gate = PrivacyGate(section, root)
    data = gate.identify(source, dataset, command="dpfair.api.fit")
    with gate.admit(release_plan([release], delta), data, command="dpfair.api.fit",
                    method=method) as spend:
        spend.may_release()
        result = train(config, dataset, model=model)
    return FitResult(
        **{f.name: getattr(result, f.name) for f in fields(result)},
        class_names=list(dataset.class_names), group_names=list(dataset.group_names),
        preprocessor=dataset.preprocessor,
    )


def _budget(budget: BudgetSection | Mapping[str, Any] | None) -> BudgetSection:
    if isinstance(budget, BudgetSection):
        return budget
    try:
        return BudgetSection.model_validate(dict(budget or {}))
    except ValidationError as exc:
        raise ConfigError("fit: budget: " + format_validation_error(exc, BudgetSection)
                          .replace("\n", "\n  ")) from None


def _config(method: str, options: dict[str, Any], **given: Any) -> TrainConfig:
    """The TrainConfig of ``given`` (Nones dropped: TrainConfig's defaults) and ``options``
    (TrainConfig fields, the rest the method's); a ``ConfigError`` names every bad key."""
    train_keys = set(TrainConfig.model_fields) - {"method", "model"}
    method_options = {k: v for k, v in options.items() if k not in train_keys}
    spec = registered_methods().get(method)
    method_keys = set(spec.model_fields) - {"name"} if spec is not None else set()
    unknown = sorted(method_options.keys() - method_keys) if spec is not None else []
    if unknown:
        key, known = unknown[0], sorted(train_keys | method_keys)
        raise ConfigError(
            f"fit: unknown option {key!r}{did_you_mean(key, known)} (training: "
            f"{', '.join(sorted(train_keys))}; method {method!r}: "
            f"{', '.join(sorted(method_keys)) or 'none'})"
        )
    settings = {k: v for k, v in given.items() if v is not None}
    settings.update({k: v for k, v in options.items() if k in train_keys})
    data = {"method": {"name": method, **method_options}, **settings}
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            "fit: " + format_validation_error(exc, TrainConfig).replace("\n", "\n  ")
        ) from None


def _dataset(data: Any, *, data_options: Mapping[str, Any] | None, **kw: Any) -> GroupedDataset:
    if isinstance(data, GroupedDataset):
        return data
    splits = {
        key: value
        for key, value in (("test_fraction", kw["test_fraction"]),
                           ("validation_fraction", kw["validation_fraction"]),
                           ("seed", kw["split_seed"]))
        if value is not None
    }
    if _is_frame(data):
        from dpfair.data.tabular_frame import dataset_from_frame  # pandas, only for frames

        if kw["target"] is None or kw["protected"] is None:
            raise ConfigError("fit: a DataFrame needs target= and protected= column names")
        return dataset_from_frame(
            data, target=kw["target"], protected=kw["protected"], features=kw["features"],
            **{**splits, **dict(data_options or {})},
        )
    if isinstance(data, (tuple, list)) and len(data) in (2, 3):
        try:
            options = HoldoutOptions.model_validate(splits)
        except ValidationError as exc:
            raise ConfigError("fit: " + format_validation_error(exc, HoldoutOptions)) from None
        return _from_arrays(*data, options=options)
    raise ConfigError(
        f"fit: data must be a GroupedDataset, a tuple (x, y) or (x, y, groups) of tensors or "
        f"arrays, or a pandas DataFrame with target= and protected= column names; got "
        f"{type(data).__name__}"
    )


def _is_frame(data: Any) -> bool:
    return type(data).__module__.startswith("pandas") and hasattr(data, "columns")


def _numpy(a: Any) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def _from_arrays(x: Any, y: Any, groups: Any = None, *, options: HoldoutOptions) -> GroupedDataset:
    """A seeded random train/validation/test split of in-memory arrays
    (:func:`dpfair.data.splits.train_val_test`), checked like every dataset."""
    x, y = _numpy(x), _numpy(y)
    g = np.zeros(len(y), dtype=np.int64) if groups is None else _numpy(groups)
    if x.ndim < 2 or y.ndim != 1 or g.ndim != 1 or not len(x) == len(y) == len(g):
        raise DataError(
            f"fit: x must be (n, ...) and y, groups (n,) with one n; got x {x.shape}, "
            f"y {y.shape}, groups {g.shape}"
        )
    classes, y_ids = np.unique(y, return_inverse=True)
    group_values, g_ids = np.unique(g, return_inverse=True)
    if len(classes) < 2:
        raise DataError(f"fit: y has one class ({classes[0]!r}); a classifier needs two or more")
    train_split, val, test = train_val_test(
        x, y_ids, g_ids, seed=options.seed, test_fraction=options.test_fraction,
        validation_fraction=options.validation_fraction,
    )
    dataset = GroupedDataset(
        name="arrays", train=train_split, val=val, test=test,
        class_names=[str(c) for c in classes],
        group_names=[str(v) for v in group_values] if groups is not None else ["all"],
    )
    return check_values(dataset, "fit(data=...)", "remove or impute those rows")
