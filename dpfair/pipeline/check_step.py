"""The checks of params.yaml that need the loaded dataset, run right after loading and before
anything is planned, tuned or trained (:func:`dpfair.pipeline.release_step.plan_release` calls
:func:`check_against_data` first).

Everything that needs no data is checked when params.yaml loads (:mod:`dpfair.config.params`). What
needs the training set's size n or its group names is checked here, for every method and every
value of its search space at once, so no search opens a study while another method's settings
are still wrong:

* ``experiment.pair`` names groups of the dataset (did-you-mean);
* every method's model builds on the data's input shape and passes the model check (no layer
  that mixes samples, e.g. BatchNorm): :func:`check_trainable`;

  these two need only the dataset's preview (:class:`~dpfair.data.dataset.DatasetPreview`:
  names and input shape), so :func:`check_run` has an own table or image folder checked by
  :func:`check_preview` before its rows are split (the split imports scikit-learn);
* a feature transform fitted on the training rows (exact statistics in every released model)
  only with ``budget.allow_fitted_preprocessing`` (:func:`check_preprocessing`);
* every batch size, given or searched, is at most n
  (:func:`~dpfair.training.run_plan.check_batch_size`);
* every δ (``experiment.train.delta``, ``budget.delta``) is below 1/n unless its opt-out says
  otherwise, and noisy test metrics' δ below 1/n_test
  (:func:`~dpfair.training.run_plan.check_delta`; ``tuning.delta``: by
  :func:`dpfair.tuning.prepare`, before any study opens);
* ``budget.epsilon`` and ``tuning.budget_epsilon`` allow at least one training run of every
  method with a proven guarantee (the cheapest configuration of its space, if tuned);
* a local ``tracking.artifact_root`` has room for every model the run logs
  (:func:`check_model_space`).

:func:`check_run` is the one validation pass of ``dpfair run`` before any work: it loads the
declared dataset (its declaration, columns, groups) and runs these checks, before the Prefect
server starts or the tracking and orchestration libraries are imported, so a wrong setting is
one clear error within seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpfair.errors import BudgetExceededError, ConfigError, did_you_mean
from dpfair.training import TrainConfig
from dpfair.tuning.job import grid_points, make_config

if TYPE_CHECKING:
    from dpfair.config.params import Params
    from dpfair.data import GroupedDataset
    from dpfair.data.dataset import DatasetPreview

__all__ = ["check_against_data", "check_budget_delta", "check_model_space",
           "check_preprocessing", "check_preview", "check_run", "check_trainable"]

#: What an MLflow model adds to its weights (MLmodel, environment files, input example).
MODEL_OVERHEAD_BYTES = 1 << 20

REFERENCE = "nonprivate"


def check_against_data(params: Params, dataset: GroupedDataset,
                       checked: DatasetPreview | None = None) -> None:
    """Refuse (``ConfigError``, ``PrivacyError``, ``BudgetExceededError``, each naming the key,
    the value and the fix) what the module docstring lists. Nothing has run when it raises.
    ``checked``: a preview :func:`check_preview` passed already (not checked twice when the
    loaded dataset shows the same)."""
    from dpfair.data.dataset import DatasetPreview

    exp = params.experiment
    n_train = len(dataset.train)
    if (preview := DatasetPreview.of(dataset)) != checked:  # before the accounting
        check_preview(params, preview)
    check_preprocessing(params, dataset)
    labels = _labels(params)
    check_model_space(params, dataset, len(labels) * len(exp.seeds))
    from dpfair.training.run_plan import check_batch_size, check_delta

    check_budget_delta(params, dataset)
    for label in labels:
        base = exp.train_config(label, exp.seeds[0])
        space = params.tuning.spaces.get(label, {})
        check_batch_size(base.batch_size, n_train, key="experiment.train.batch_size")
        if base.test_metrics.release == "noisy":
            check_delta(base.test_delta, len(dataset.test), allowed=base.allow_large_delta,
                        key="experiment.train.test_metrics.delta (else .delta)",
                        opt_out="experiment.train.allow_large_delta")
        for value in space.get("batch_size", []):
            check_batch_size(int(value), n_train, key=f"tuning.spaces.{label}.batch_size")
        if base.method.privacy_guarantee != "proven":
            continue
        check_delta(base.delta, n_train, allowed=base.allow_large_delta,
                    key="experiment.train.delta", opt_out="experiment.train.allow_large_delta")
        configs = [make_config(base.method, base, point, seed=0, reproducible=False)
                   for point in grid_points(space)]
        _check_one_run(params, label, configs, n_train, dataset.n_groups)


def check_budget_delta(params: Params, dataset: GroupedDataset) -> None:
    """``budget.delta``, the δ of every reported ε, is below 1/n_train unless
    ``budget.allow_large_delta`` (:func:`~dpfair.training.run_plan.check_delta`): for ``dpfair
    run``, ``train`` and ``tune`` alike."""
    from dpfair.training.run_plan import check_delta

    if params.budget.delta is not None:
        check_delta(params.budget.delta, len(dataset.train),
                    allowed=params.budget.allow_large_delta, key="budget.delta",
                    opt_out="budget.allow_large_delta")


def check_model_space(params: Params, dataset: GroupedDataset, n_models: int) -> None:
    """A local artifact root has room for ``n_models`` models of ``experiment.model`` on
    ``dataset`` (weights plus :data:`MODEL_OVERHEAD_BYTES` each), or an ``UnreachableError``
    before anything trains. A remote artifact store is not checked."""
    from dpfair.models import build_model
    from dpfair.pipeline.preflight import check_free_space, local_path

    folder = local_path(params.tracking.artifact_root)
    model_cfg = params.experiment.model
    if folder is None or model_cfg is None:
        return
    net = build_model(model_cfg, dataset.input_shape, dataset.n_classes)
    size = sum(t.numel() * t.element_size() for t in [*net.parameters(), *net.buffers()])
    check_free_space(folder, n_models * (size + MODEL_OVERHEAD_BYTES), "artifact folder",
                     f"free space there or set tracking.artifact_root elsewhere ({n_models} "
                     "models of experiment.model are logged); nothing was trained")


def check_run(params: Params) -> GroupedDataset:
    """Load ``experiment.dataset`` as declared, with :func:`check_preview` before its split
    where the loader can, and run :func:`check_against_data`; returns the dataset. Every error
    is a ``DpfairError`` naming the setting and the fix."""
    from dpfair.data import load_dataset

    name = params.experiment.dataset
    checked: list[DatasetPreview] = []

    def inspect(preview: DatasetPreview) -> None:
        check_preview(params, preview)
        checked.append(preview)

    dataset = load_dataset(name, params.dataset(name), inspect=inspect)
    check_against_data(params, dataset, checked[-1] if checked else None)
    return dataset


def check_preview(params: Params, preview: DatasetPreview) -> None:
    """What needs only the dataset's names and input shape: ``experiment.pair`` names two of
    its groups, and every method's model passes :func:`check_trainable`."""
    _check_pair(params.experiment.named_pair, preview)
    for label in _labels(params):
        check_trainable(params.experiment.train_config(label, params.experiment.seeds[0]),
                        preview)


def check_trainable(config: TrainConfig, dataset: GroupedDataset | DatasetPreview) -> None:
    """The model of ``config`` builds on the dataset's input shape, gives one logit per class
    and keeps no state across samples (BatchNorm: :func:`~dpfair.engine.model_check.
    check_model`): checked before the privacy gate reserves anything, so a refused model costs
    no privacy and no search. (Building loads torch, so the checks that need no model come
    first and a wrong setting among them is reported without it.)"""
    if config.model is None:  # a module given to train(), checked where it is given
        return
    from dpfair.engine.model_check import check_model
    from dpfair.models import build_model, check_output_shape

    model = build_model(config.model, dataset.input_shape, dataset.n_classes)
    check_output_shape(model, dataset.input_shape, dataset.n_classes)
    check_model(model, dataset.input_shape, private=config.method.is_private)


def check_preprocessing(params: Params, dataset: GroupedDataset) -> None:
    """The gate's rule for a fitted feature transform
    (:func:`dpfair.ledger.gate.check_preprocessing`) with ``params.budget``."""
    from dpfair.ledger.gate import check_preprocessing as rule

    rule(params.budget, dataset)


def _labels(params: Params) -> list[str]:
    """The runs' labels: the non-private reference (when asked for), then every method."""
    exp = params.experiment
    return [*([REFERENCE] if exp.nonprivate_reference else []), *exp.methods]


def _check_pair(pair: list[str] | None, dataset: DatasetPreview) -> None:
    names = [str(g) for g in dataset.group_names]
    for group in pair or []:
        if group not in names:
            raise ConfigError(
                f"experiment.pair: {group!r} is not a group of dataset {dataset.name!r}"
                f"{did_you_mean(group, names)} (its groups: {', '.join(names)}); name two of "
                "them, or leave pair out (every group is shown either way). Nothing was "
                "trained."
            )


def _check_one_run(params: Params, label: str, configs: list[TrainConfig], n_train: int,
                   n_groups: int) -> None:
    """Each budget must allow the cheapest run of ``label`` (one of ``configs``)."""
    from dpfair import accounting
    from dpfair.training import make_plan

    exp, budget = params.experiment, params.budget
    events = [make_plan(c, n_train, n_groups).event for c in configs]
    tuned = label in params.tuning.spaces
    delta = budget.delta or exp.train.delta
    cheapest = min(accounting.epsilon(e, delta) for e in events)
    fix = ("raise experiment.train.sigma (or target a smaller ε), train fewer epochs or a "
           "smaller batch" + (", or search a cheaper space" if tuned else ""))
    calibrated = budget.calibrate_noise  # the noise will be scaled to meet budget.epsilon
    if budget.epsilon is not None and not calibrated and not cheapest <= budget.epsilon:
        raise BudgetExceededError(  # a budget refusal (exit code 3), as any other
            f"budget.epsilon: {budget.epsilon:g} is too small for even one training run of "
            f"{label!r} (ε {cheapest:.4g} at δ {delta:g} for n_train = {n_train}): raise "
            f"budget.epsilon or {fix}. Nothing was trained."
        )
    if not tuned:
        return
    cfg = params.tuning.config(label, label)
    if cfg.budget_epsilon is None:
        return
    tuning_delta = cfg.delta or exp.train.delta
    cheapest = min(accounting.epsilon(e, tuning_delta) for e in events)
    if not cheapest <= cfg.budget_epsilon:
        raise BudgetExceededError(
            f"tuning.budget_epsilon: {cfg.budget_epsilon:g} is too small for even one training "
            f"run of the search of {label!r} (ε {cheapest:.4g} at δ {tuning_delta:g} for "
            f"n_train = {n_train}): raise tuning.budget_epsilon or {fix}. Nothing was run."
        )
