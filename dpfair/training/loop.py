"""The Poisson-sampled training loop and device selection.

One step: every training example joins the batch independently with probability
``q = batch_size / n_train`` (so the realised batch size is random and may be 0); the private
step (:class:`dpfair.engine.step.PrivateStep`) sets every parameter's ``.grad`` to the
method's noised, weighted sum divided by the *expected* batch size, and the optimizer steps.
The optimizer only post-processes the private gradient, so SGD, momentum, weight decay and
Adam all keep the guarantee. An epoch is ``ceil(n_train / batch_size)`` steps, the count
:func:`dpfair.accounting.accountant.steps_for_epochs` accounts for (and Opacus runs). q, the
steps, σ and the run's privacy event are fixed first, by :func:`dpfair.training.make_plan`.

Randomness: the seed is split (numpy
``SeedSequence``) into a model-initialisation seed, used with ``torch.manual_seed`` inside
``torch.random.fork_rng`` so the caller's global RNG is left alone, and a run seed. One
``torch.Generator`` on the training device draws every batch and every noise sample (gradient
and count noise). By default it is reseeded before every step from OS entropy
that is kept nowhere (its whole state, :mod:`dpfair.training.entropy`: a seed would carry only
32 secret bits on the CPU), so nothing a run logs or returns replays its noise.
With ``TrainConfig.reproducible`` it is seeded once with the run seed and the noise is
replayable (:data:`~dpfair.training.config.REPLAYABLE_NOISE`). The initialisation is the
seed's in both modes. Noisy test metrics (``TrainConfig.test_metrics``) draw their noise from
a numpy generator seeded the same way: OS entropy by default, a third seed of the split when
reproducible.

Stopping: once the process was told to stop (a SIGTERM inside
:func:`dpfair.processes.sigterm_raises`) the loop raises ``Terminated`` before its next step,
so a command exits within a step of the signal, with the run FAILED (what it trained so far
counts: its release was reserved).

Several processes (``TrainConfig.nproc > 1``, :mod:`dpfair.training.distributed`): each samples
its shard of the training set with rate ``q`` (still a Poisson batch over the whole dataset),
the step sums the processes' parts with the noise drawn once by process 0, and only process 0
evaluates and returns the result. In reproducible mode process ``r > 0`` seeds its generator
from the run seed and ``r``.

Test evaluation: the epochs of ``plan.eval_epochs``. Exact (default): the metrics of
:func:`~dpfair.training.evaluation.metrics_from_predictions` and the last predictions are
kept. Noisy: only :func:`dpfair.fairness.noisy.noisy_group_metrics` leaves the evaluation; no
exact test value, no test prediction is kept in the history or the result. The last
evaluation adds (``test_metrics.fairness``) the selection and error rates per group and their
disparities (:mod:`dpfair.fairness.rates`): exact, Fairlearn's; noisy, from the noisy counts.

Determinism: only a reproducible run repeats, and then bit for bit only for the same seed, the
same device and the same number of torch threads (``torch.get_num_threads()``; the pipeline
sets it from ``pipeline.max_workers``): the order of floating-point sums in matrix products
and reductions depends on how the work is split over threads, and so may the last bits of
every step. A default run differs from the next by design (secret noise and batches).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from dpfair import accounting
from dpfair.accounting import per_group as group_accounting
from dpfair.accounting.accountant import Spend
from dpfair.data.dataset import GroupedDataset
from dpfair.engine.collective import ALONE
from dpfair.engine.model_check import check_model
from dpfair.engine.step import PrivateStep
from dpfair.errors import ConfigError, Terminated
from dpfair.fairness.noisy import noisy_group_metrics
from dpfair.fairness.rates import exact_rates
from dpfair.methods import Method, build_method
from dpfair.models import build_model, check_output_shape
from dpfair.processes import stop_requested
from dpfair.training.config import TrainConfig
from dpfair.training.distributed import ProcessGroup, launch
from dpfair.training.entropy import reseed_secretly
from dpfair.training.evaluation import Predictions, metrics_from_predictions, predict
from dpfair.training.optim import Adam, Optimizer, Sgd
from dpfair.training.progress import progress_bar
from dpfair.training.result import Callback, TrainResult
from dpfair.training.run_plan import RunPlan, make_plan


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when available, else CPU; asking for absent CUDA is an error."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    return torch.device(name)


def poisson_batch(n: int, sample_rate: float, generator: torch.Generator) -> torch.Tensor:
    """Indices of a Poisson sample: each of ``n`` examples kept with probability ``sample_rate``
    (possibly none)."""
    keep = torch.rand(n, generator=generator, device=generator.device) < sample_rate
    return keep.nonzero().flatten()


def _rank_seed(run_seed: int, group: ProcessGroup | None) -> int:
    """The reproducible generator's seed of process ``rank > 0`` of a run over several."""
    assert group is not None
    return int(np.random.SeedSequence([run_seed, group.rank]).generate_state(1, np.uint64)[0])


def _seeds(seed: int) -> tuple[int, int, int]:
    """Independent seeds for model initialisation, the reproducible training generator and the
    reproducible test-metric noise."""
    init, run, test = np.random.SeedSequence(seed).generate_state(3, dtype=np.uint64)
    return int(init), int(run), int(test)


def _init_model(
    config: TrainConfig, dataset: GroupedDataset, seed: int, given: nn.Module | None
) -> nn.Module:
    """``config.model`` built and initialised from ``seed``, or a copy of the ``given`` module
    (its own initialisation); checked by :func:`~dpfair.engine.model_check.check_model`."""
    if (given is None) == (config.model is None):
        raise ConfigError("give exactly one model: config.model or train(..., model=module)")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = copy.deepcopy(given) if given is not None else build_model(
            config.model, dataset.input_shape, dataset.n_classes
        )
    if given is not None:
        check_output_shape(model, dataset.input_shape, dataset.n_classes)
    check_model(model, dataset.input_shape, private=config.method.is_private)
    return model


def _optimizer(config: TrainConfig, model: nn.Module) -> Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "adam":
        return Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    return Sgd(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)


def _nanmean(values: list[float]) -> float:
    """Mean of the finite values (an empty Poisson batch has a NaN loss); NaN if none."""
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _group_epsilons(plan: RunPlan, method: Method,
                    trajectory: list[dict[str, Any]]) -> tuple[list[Spend], list[Spend]] | None:
    """Per-group ε of DPSGD-F and its accountant from its per-step bounds ``C_k``, each
    group's steps accounted on their own (:mod:`dpfair.accounting.per_group`): the
    data-dependent reading of this run, and beside it the bound fixed before training from
    the method's clip range; None for other methods. Steps missing from the trajectory count
    at the top bound (the run's own ε)."""
    if not trajectory or "C_k" not in trajectory[0] or not math.isfinite(plan.epsilon):
        return None
    bounds = [entry["C_k"] for entry in trajectory]
    run = accounting.spend(plan.event, plan.delta)
    if accounting.group_size(plan.event)[1] > 1:  # a person of several rows: the run's ε
        return [run] * len(bounds[0]), [run] * len(bounds[0])
    bounds += [[1.0] * len(bounds[0])] * max(0, plan.steps - len(bounds))
    found = group_accounting.group_epsilons(plan.sigma, method.count_sigma, plan.sample_rate,
                                            bounds, plan.delta)
    clip_range = method.clip_range()
    fixed = found if clip_range is None else group_accounting.fixed_group_epsilons(
        plan.sigma, method.count_sigma, plan.sample_rate, plan.steps,
        [clip_range] * len(bounds[0]), plan.delta)
    # both bound the group: keep the tighter
    return ([g if g.epsilon <= run.epsilon else run for g in found],
            [g if g.epsilon <= run.epsilon else run for g in fixed])


def train(
    config: TrainConfig,
    dataset: GroupedDataset,
    callbacks: Sequence[Callback] = (),
    *,
    model: nn.Module | None = None,
) -> TrainResult:
    """Train ``config.model`` on ``dataset.train`` with ``config.method``; evaluate on test
    every ``eval_every`` epochs and after the last step; call ``callbacks`` along the way.
    ``model``: a module to train instead (a copy; leave ``config.model`` unset), for
    :func:`dpfair.api.fit`.

    ``config.nproc > 1``: ``nproc`` processes train the model together
    (:mod:`dpfair.training.distributed`; the model, the dataset and a given module travel to
    them by pickling, so a module's class must be importable); the callbacks run here, in this
    one process, after the last step, with each evaluated epoch's entry in order."""
    if config.nproc == 1:
        result = _train(config, dataset, callbacks, model, None)
        assert result is not None
        return result
    _check_splits(dataset)
    result = launch(_train_part, (config, dataset, model), nproc=config.nproc,
                    device=config.device)
    for entry in result.history:
        for cb in callbacks:
            cb.on_epoch_end(entry["epoch"], entry)
    for cb in callbacks:
        cb.on_train_end(result)
    return result


def _check_splits(dataset: GroupedDataset) -> None:
    if len(dataset.train) == 0 or len(dataset.test) == 0:
        raise ValueError(f"dataset {dataset.name!r} has an empty training or test split")


def _train_part(config: TrainConfig, dataset: GroupedDataset, model: nn.Module | None, *,
                group: ProcessGroup) -> TrainResult | None:
    """One process's part of a run over several processes (:func:`train`)."""
    return _train(config, dataset, (), model, group)


def _train(
    config: TrainConfig,
    dataset: GroupedDataset,
    callbacks: Sequence[Callback],
    model: nn.Module | None,
    group: ProcessGroup | None,
) -> TrainResult | None:
    """The loop of :func:`train`, alone (``group`` None) or as one of several processes: then
    this process samples its shard, and only process 0 evaluates and returns the result."""
    started = time.perf_counter()
    _check_splits(dataset)
    plan = make_plan(config, len(dataset.train), dataset.n_groups, len(dataset.test))
    device = resolve_device(config.device) if group is None else group.device
    first = group is None or group.rank == 0
    init_seed, run_seed, test_seed = _seeds(config.seed)
    method = build_method(
        config.method, n_groups=dataset.n_groups, sigma=plan.sigma,
        expected_batch_size=float(config.batch_size),
    )
    model = _init_model(config, dataset, init_seed, model).to(device)
    optimizer = _optimizer(config, model)
    step = PrivateStep(
        model, method, sigma=plan.sigma, expected_batch_size=float(config.batch_size),
        engine=config.engine, max_physical_batch=config.max_physical_batch,
        autocast=config.autocast, max_engine_memory=config.max_engine_memory,
        collective=ALONE if group is None else group,
    )
    generator = torch.Generator(device=device)
    if config.reproducible:
        generator.manual_seed(run_seed if first else _rank_seed(run_seed, group))
    data = dataset.train
    shard = range(plan.n_train) if group is None else group.shard(plan.n_train)
    x, y, g = (t[shard.start:shard.stop].to(device) for t in (data.x, data.y, data.g))
    step.plan_memory(x[:1], y[:1])  # a cap below one sample's step is refused before training
    # OS entropy (kept nowhere) unless reproducible, like the batches and gradient noise
    log = _Log(plan, np.random.default_rng(test_seed if config.reproducible else None))
    model.train()
    shown = config.progress if first else False
    with progress_bar(shown, f"{method.name} on {dataset.name}", plan.steps) as bar:
        for t in range(1, plan.steps + 1):
            if stop_requested():  # told to stop (SIGTERM): no step after it, the run fails
                raise Terminated(143)
            if not config.reproducible:
                reseed_secretly(generator)
            idx = poisson_batch(len(shard), plan.sample_rate, generator)
            optimizer.zero_grad(set_to_none=True)
            info = step(x[idx], y[idx], g[idx], generator)
            optimizer.step()
            log.step(t, info.state, info.nonprivate_batch_loss)
            bar.advance()
            if t % plan.steps_per_epoch and t != plan.steps:
                continue
            epoch = math.ceil(t / plan.steps_per_epoch)
            log.epoch(epoch, t, config.nonprivate_stats)
            if first and epoch in plan.eval_epochs:
                entry = log.evaluate(model, dataset, epoch, t, config.eval_batch_size)
                bar.status(f"epoch {epoch}: test acc {entry['test']['accuracy']:.3f}")
                for cb in callbacks:
                    cb.on_epoch_end(epoch, entry)
    if not first:
        return None
    result = _result(config, dataset, plan, method, model, log, started)
    for cb in callbacks:
        cb.on_train_end(result)
    return result


@dataclass
class _Log:
    """What the loop records: history, clip trajectory, non-private stats, last test outputs
    (exact release only; ``test_rng`` draws the noise of a noisy one)."""

    plan: RunPlan
    test_rng: np.random.Generator
    history: list[dict[str, Any]] = field(default_factory=list)
    clip_trajectory: list[dict[str, Any]] = field(default_factory=list)
    nonprivate_stats: list[dict[str, Any]] = field(default_factory=list)
    epoch_losses: list[float] = field(default_factory=list)
    test_predictions: Predictions | None = None

    def step(self, t: int, state: dict[str, Any], batch_loss: float) -> None:
        if state:
            self.clip_trajectory.append({"step": t, **state})
        self.epoch_losses.append(batch_loss)

    def epoch(self, epoch: int, t: int, keep_nonprivate: bool) -> None:
        if keep_nonprivate:
            loss = _nanmean(self.epoch_losses)
            self.nonprivate_stats.append({"epoch": epoch, "step": t, "train_loss": loss})
        self.epoch_losses = []

    def evaluate(
        self, model: nn.Module, dataset: GroupedDataset, epoch: int, t: int, batch_size: int
    ) -> dict[str, Any]:
        found = predict(model, dataset.test, batch_size)
        release = self.plan.test
        fairness = release.fairness and epoch == self.plan.eval_epochs.n_epochs  # the last
        if release.noisy:
            assert release.noise_multiplier is not None and release.loss_clip is not None
            test = noisy_group_metrics(
                found.y_true, found.y_pred, found.groups, found.loss, dataset.n_groups,
                noise_multiplier=release.noise_multiplier, loss_clip=release.loss_clip,
                rng=self.test_rng, fairness_classes=dataset.n_classes if fairness else None,
                prob=found.prob)
        else:
            self.test_predictions = found
            test = metrics_from_predictions(found, dataset.n_classes, dataset.n_groups)
            if fairness:
                test.update(exact_rates(found.y_true, found.y_pred, found.groups,
                                        dataset.n_groups, dataset.n_classes, found.prob))
        self.history.append({"epoch": epoch, "step": t, "test": test})
        return self.history[-1]


def _result(
    config: TrainConfig,
    dataset: GroupedDataset,
    plan: RunPlan,
    method: Method,
    model: nn.Module,
    log: _Log,
    started: float,
) -> TrainResult:
    """Assemble the result after the last step (whose epoch is always evaluated)."""
    val_pred = predict(model, dataset.val, config.eval_batch_size)
    val_metrics = None
    if len(dataset.val):
        val_metrics = metrics_from_predictions(val_pred, dataset.n_classes, dataset.n_groups)
    groups = _group_epsilons(plan, method, log.clip_trajectory)
    readings, fixed = groups if groups is not None else (None, None)
    return TrainResult(
        config=config,
        model_state={k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        own_model=copy.deepcopy(model).cpu() if config.model is None else None,
        input_shape=dataset.input_shape,
        n_classes=dataset.n_classes,
        n_groups=dataset.n_groups,
        history=log.history,
        test_metrics=log.history[-1]["test"],
        val_metrics=val_metrics,
        test_predictions=log.test_predictions,
        val_predictions=val_pred,
        method=method.name,
        privacy_guarantee=plan.privacy_guarantee,
        sigma=plan.sigma,
        count_sigma=method.count_sigma,
        sample_rate=plan.sample_rate,
        n_train=plan.n_train,
        steps=plan.steps,
        steps_per_epoch=plan.steps_per_epoch,
        event=plan.event,
        epsilon=plan.epsilon,
        delta=plan.delta,
        group_epsilons=None if readings is None else [g.epsilon for g in readings],
        group_accountants=None if readings is None else [g.accountant for g in readings],
        group_epsilon_bounds=None if fixed is None else [g.epsilon for g in fixed],
        clip_trajectory=log.clip_trajectory,
        nonprivate_stats=log.nonprivate_stats,
        wall_time_s=time.perf_counter() - started,
        device=str(next(model.parameters()).device),
        reproducible=plan.reproducible,
        test_release=plan.test,
    )
