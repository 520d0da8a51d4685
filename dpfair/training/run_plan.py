"""What one run does, fixed before any data is touched.

:func:`make_plan` derives from a :class:`TrainConfig` and the training set's size the sample
rate ``q = batch_size / n_train``, the step count ``T`` (``steps``, or ``epochs * ceil(n / B)``,
:func:`~dpfair.accounting.accountant.steps_for_epochs`), the noise multiplier σ (given, or the
smallest reaching ``target_epsilon``), the method's one-step event at σ and the run event
``SelfComposed(PoissonSampled(q, step), T)`` (:func:`~dpfair.accounting.accountant.run_event`).
It builds no model and reads no data, so tuning and tracking report ``plan.event``: what was
planned is what is accounted. The plan also fixes the epochs evaluated on the test split
(``eval_epochs``, the loop's only source) and how their metrics are released
(:class:`MetricsRelease`: exact, or noisy with the noise multiplier of
:func:`dpfair.fairness.noisy.calibrate` for that many releases).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from dp_accounting import dp_event

from dpfair import accounting
from dpfair.errors import ConfigError
from dpfair.fairness import noisy
from dpfair.methods import MethodSpec, PrivacyGuarantee, build_method
from dpfair.training.config import MAX_STEPS, TrainConfig

#: The label of exact test metrics (an MLflow tag, a results note): see MetricsRelease.label.
EXACT_TEST_METRICS = "exact (held-out test data; not covered by ε)"


@dataclass(frozen=True)
class MetricsRelease:
    """How a run releases its test metrics: ``releases`` evaluations (R), exact (``event``
    None) or each the Gaussian release of :mod:`dpfair.fairness.noisy` at
    ``noise_multiplier`` (``fairness``: and the fairness counts of the last one), all of them
    together ``event`` with ``epsilon`` at ``delta``. ``fairness`` also says whether the
    measures of :mod:`dpfair.fairness.rates` are released (exact or noisy). The
    ε is that of the test rows, disjoint from the training rows: never composed with the
    training ε."""

    releases: int
    noise_multiplier: float | None = None
    loss_clip: float | None = None
    event: dp_event.DpEvent | None = None
    epsilon: float | None = None
    delta: float | None = None
    fairness: bool = False

    @property
    def noisy(self) -> bool:
        return self.event is not None

    @property
    def label(self) -> str:
        """``noisy (ε …, δ …, …)`` or :data:`EXACT_TEST_METRICS` (MLflow tag, console)."""
        if not self.noisy:
            return EXACT_TEST_METRICS
        return (f"noisy (ε {self.epsilon:.3g} at δ {self.delta:g} for the test split over "
                f"{self.releases} evaluation{'s' * (self.releases != 1)}"
                f"{' and the fairness counts' * self.fairness}; noise multiplier "
                f"{self.noise_multiplier:.4g})")


@dataclass(frozen=True)
class RunPlan:
    """A run's privacy-relevant numbers: ``epsilon`` is ``event``'s at ``delta``; a
    non-private run has σ = 0 and ``event = NonPrivateDpEvent()`` (ε = ∞). ``reproducible``:
    the batches and noise will be drawn from the configured seed, so ``epsilon`` does not
    protect what the run releases (:data:`dpfair.training.REPLAYABLE_NOISE`).
    ``eval_epochs``: the epochs evaluated on the test split; ``test``: how their metrics are
    released (:class:`MetricsRelease`)."""

    n_train: int
    sample_rate: float
    steps_per_epoch: int
    steps: int
    sigma: float
    method: MethodSpec
    step_event: dp_event.DpEvent
    event: dp_event.DpEvent
    privacy_guarantee: PrivacyGuarantee
    epsilon: float
    delta: float
    reproducible: bool
    eval_epochs: EvalEpochs
    test: MetricsRelease


@dataclass(frozen=True, eq=False)
class EvalEpochs:
    """The epochs whose test metrics a run releases: every ``every``-th of ``1..n_epochs`` and
    the last. Held as two numbers (O(1) whatever the epoch count); ``epoch in``, ``len``,
    iteration, and ``==`` with another or with a tuple of the epochs."""

    n_epochs: int
    every: int

    def __contains__(self, epoch: object) -> bool:
        return (isinstance(epoch, int) and 1 <= epoch <= self.n_epochs
                and (epoch % self.every == 0 or epoch == self.n_epochs))

    def __len__(self) -> int:
        return self.n_epochs // self.every + (1 if self.n_epochs % self.every else 0)

    def __iter__(self) -> Iterator[int]:
        yield from range(self.every, self.n_epochs + 1, self.every)
        if self.n_epochs % self.every:
            yield self.n_epochs

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EvalEpochs):
            return (self.n_epochs, self.every) == (other.n_epochs, other.every)
        return isinstance(other, tuple) and len(other) == len(self) and tuple(self) == other

    def __hash__(self) -> int:
        return hash((self.n_epochs, self.every))


def evaluated_epochs(n_epochs: int, eval_every: int) -> EvalEpochs:
    """The epochs whose test metrics a run releases: every ``eval_every``-th and the last."""
    return EvalEpochs(n_epochs, eval_every)


def _schedule(config: TrainConfig, n_train: int) -> tuple[int, int, EvalEpochs]:
    """Steps per epoch, steps and the evaluated epochs of ``config`` on ``n_train`` examples
    (integers only: O(1) in the epoch and step counts). More than ``MAX_STEPS`` steps is a
    ConfigError."""
    per_epoch = accounting.steps_for_epochs(1, n_train, config.batch_size)
    steps = config.steps if config.steps is not None else config.epochs * per_epoch
    if steps > MAX_STEPS:
        raise ConfigError(
            f"epochs: {config.epochs} x {per_epoch} steps per epoch = {steps} steps, over the "
            f"maximum of {MAX_STEPS} for one run; train fewer epochs or a larger batch")
    return per_epoch, steps, evaluated_epochs(-(-steps // per_epoch), config.eval_every)


@functools.lru_cache(maxsize=256)
def _test_noise(
    epsilon: float, delta: float, releases: int, rows: int = 1, fairness: bool = False
) -> float:
    """:func:`dpfair.fairness.noisy.calibrate` for a unit of ``rows`` rows, cached (a search
    plans many runs)."""
    return noisy.calibrate(epsilon, delta, releases, rows, fairness)


def metrics_release(
    config: TrainConfig, n_train: int, n_test: int | None = None
) -> MetricsRelease:
    """How ``config`` on ``n_train`` training examples releases its test metrics (R = the
    evaluated epochs); noisy: the noise multiplier calibrated so that the R releases reach
    ``test_metrics.epsilon`` (:func:`dpfair.fairness.noisy.calibrate`) and, when ``n_test``
    is known, δ < 1/n_test (:func:`check_delta`)."""
    releases = len(_schedule(config, n_train)[2])
    options = config.test_metrics
    if options.release == "exact":
        return MetricsRelease(releases=releases, fairness=options.fairness)
    delta = config.test_delta
    if n_test is not None:
        check_delta(delta, n_test, allowed=config.allow_large_delta, key="test_metrics.delta",
                    opt_out="allow_large_delta")
    assert options.epsilon is not None  # MetricsReleaseConfig requires it when noisy
    z = _test_noise(options.epsilon, delta, releases, config.rows_per_unit, options.fairness)
    event = accounting.with_group(noisy.release_event(z, releases, options.fairness),
                                  config.rows_per_unit)
    return MetricsRelease(releases=releases, noise_multiplier=z, loss_clip=options.loss_clip,
                          event=event, epsilon=accounting.epsilon(event, delta), delta=delta,
                          fairness=options.fairness)


def _step_event(
    method: MethodSpec, n_groups: int, expected_batch_size: float, sigma: float
) -> dp_event.DpEvent:
    built = build_method(
        method, n_groups=n_groups, sigma=sigma, expected_batch_size=expected_batch_size
    )
    return built.step_event(sigma)


@functools.lru_cache(maxsize=1024)
def _calibrated_sigma(
    method: MethodSpec,
    n_groups: int,
    expected_batch_size: float,
    target_epsilon: float,
    sample_rate: float,
    steps: int,
    delta: float,
    rows: int = 1,
) -> float:
    """The smallest σ whose run event (for a unit of ``rows`` rows) reaches ``target_epsilon``
    (cached: a search plans many runs of one configuration)."""

    def make_event(sigma: float) -> dp_event.DpEvent:
        step = _step_event(method, n_groups, expected_batch_size, sigma)
        return accounting.with_group(accounting.run_event(step, sample_rate, steps), rows)

    return accounting.noise_for_epsilon(target_epsilon, make_event, delta)


def check_delta(
    delta: float,
    n_train: int,
    *,
    allowed: bool = False,
    key: str = "delta",
    opt_out: str = "allow_large_delta",
) -> None:
    """Refuse (``ConfigError``) ``delta >= 1/n_train`` unless ``allowed``: (ε, δ)-DP with
    δ ≥ 1/n admits a mechanism that publishes one training example outright with probability
    δ·n ≥ 1, so an ε at such a δ promises nothing (Dwork & Roth 2014, section 2.3)."""
    if allowed or delta < 1 / n_train:
        return
    raise ConfigError(
        f"{key}: {delta:g} is not below 1/n_train = 1/{n_train} = {1 / n_train:.3g}, so the "
        f"reported epsilon would promise nothing (such a delta allows releasing training "
        f"examples outright); set {key} below {1 / n_train:.3g} (e.g. {_below(n_train):g}), "
        f"or, as an expert, set {opt_out}: true (it is recorded with the run's parameters)"
    )


def _below(n_train: int) -> float:
    """A round δ well below 1/n: the power of ten at or under 1/(10 n)."""
    return 10.0 ** math.floor(math.log10(1 / (10 * n_train)))


def check_batch_size(batch_size: int, n_train: int, key: str = "batch_size") -> None:
    """Refuse a split too small to sample from, or an expected batch larger than it."""
    if n_train <= 0:
        raise ConfigError(f"the training split is empty (n_train={n_train})")
    if batch_size > n_train:
        raise ConfigError(
            f"{key}: {batch_size} exceeds the {n_train} training examples (the sample rate "
            f"batch_size / n_train would be > 1); set {key} to at most {n_train}"
        )


def make_plan(
    config: TrainConfig, n_train: int, n_groups: int, n_test: int | None = None
) -> RunPlan:
    """The plan of ``train(config, dataset)`` for a training split of ``n_train`` examples in
    ``n_groups`` groups and a test split of ``n_test`` (module docstring); raises before
    anything runs: a batch larger than the split, or a private method's δ ≥ 1/n_train (and a
    noisy test release's δ ≥ 1/n_test, :func:`check_delta`)."""
    check_batch_size(config.batch_size, n_train)
    if config.method.is_private:
        check_delta(config.delta, n_train, allowed=config.allow_large_delta)
    q = config.batch_size / n_train
    per_epoch, steps, eval_epochs = _schedule(config, n_train)
    expected = float(config.batch_size)
    if not config.method.is_private:
        sigma = 0.0
    elif config.sigma is not None:
        sigma = config.sigma
    else:
        sigma = _calibrated_sigma(
            config.method, n_groups, expected, config.target_epsilon, q, steps, config.delta,
            config.rows_per_unit,
        )
    step = _step_event(config.method, n_groups, expected, sigma)
    event = accounting.with_group(accounting.run_event(step, q, steps), config.rows_per_unit)
    return RunPlan(
        n_train=n_train,
        sample_rate=q,
        steps_per_epoch=per_epoch,
        steps=steps,
        sigma=sigma,
        method=config.method,
        step_event=step,
        event=event,
        privacy_guarantee=config.method.privacy_guarantee,
        epsilon=accounting.epsilon(event, config.delta),
        delta=config.delta,
        reproducible=config.reproducible,
        eval_epochs=eval_epochs,
        test=metrics_release(config, n_train, n_test),
    )
