"""Training loop: every registered method learns on tiny data, secret noise by default and
bit-for-bit reproducibility on request, empty Poisson batches, evaluation, callbacks, the run
plan, configuration errors."""

from __future__ import annotations

import dataclasses
import math
import sys
from functools import cache
from typing import Any

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from pydantic import ValidationError
from sklearn.datasets import load_digits

import dpfair.training.loop as loop_module
from dpfair import accounting
from dpfair.data.dataset import GroupedDataset, Split
from dpfair.errors import PrivacyError
from dpfair.fairness import rates
from dpfair.methods import registered_methods
from dpfair.tracking.run_log import epsilon_by_group
from dpfair.training import (
    Predictions,
    RunPlan,
    TrainConfig,
    TrainResult,
    evaluate,
    flat_metrics,
    make_plan,
    metrics_from_predictions,
    poisson_batch,
    resolve_device,
    train,
)

LR = {"name": "logistic_regression"}
CNN = {"name": "esipova_cnn", "channels": [8, 8]}


def _split(x: np.ndarray, y: np.ndarray, g: np.ndarray) -> Split:
    return Split(
        torch.as_tensor(x, dtype=torch.float32),
        torch.as_tensor(y, dtype=torch.long),
        torch.as_tensor(g, dtype=torch.long),
    )


@cache
def skewed_digits() -> GroupedDataset:
    """8x8 digits, 400 test; train 512 with 12 eights (about 2%), val 88 with 3; groups are
    the classes."""
    data = load_digits()
    x, y = data.images.astype(np.float32)[:, None] / 16.0, data.target
    order = np.random.default_rng(0).permutation(len(y))
    test, rest = order[:400], order[400:]
    eights, others = rest[y[rest] == 8], rest[y[rest] != 8]
    train_idx = np.concatenate([others[:500], eights[:12]])
    val = np.concatenate([others[500:585], eights[12:15]])
    names = [str(c) for c in range(10)]
    return GroupedDataset(
        "tiny_digits",
        *(_split(x[i], y[i], y[i]) for i in (train_idx, val, test)),
        class_names=names,
        group_names=names,
    )


@cache
def gaussian_tabular() -> GroupedDataset:
    """Two Gaussian classes in 6 dimensions; group 1 (25%) has a shifted class boundary."""
    rng = np.random.default_rng(1)
    n = 800
    g = (rng.random(n) < 0.25).astype(np.int64)
    y = rng.integers(0, 2, n)
    centre = np.where(y[:, None] == 1, 1.0, -1.0) * np.array([1.5, 1.0, 0, 0, 0, 0])
    x = centre + 0.7 * g[:, None] + rng.normal(size=(n, 6))
    parts = (slice(0, 500), slice(500, 600), slice(600, n))
    return GroupedDataset(
        "tiny_gaussian",
        *(_split(x[p], y[p], g[p]) for p in parts),
        class_names=["neg", "pos"],
        group_names=["majority", "minority"],
    )


def config(method: dict[str, Any], model: dict[str, Any] = LR, **kw: Any) -> TrainConfig:
    base: dict[str, Any] = {"batch_size": 50, "lr": 0.5, "progress": False, "device": "cpu"}
    if "steps" not in kw:
        base["epochs"] = 3
    if method["name"] != "nonprivate":
        base["sigma"] = 1.0
    return TrainConfig.model_validate({"method": method, "model": model, **base, **kw})


# Settings that learn in a few tiny epochs (a method not listed runs at its example());
# dpsgd_global scales gradients by C0 / Z, so it gets a small Z and a learning rate Z times
# larger (LR_SCALE).
LEARNS: dict[str, dict[str, Any]] = {
    "nonprivate": {"name": "nonprivate"},
    "dpsgd": {"name": "dpsgd", "C": 1.0},
    "dpsgd_normalized": {"name": "dpsgd", "C": 1.0, "normalize": True},
    "dpsgd_f": {"name": "dpsgd_f", "C0": 1.0},
    "naive_reweight": {"name": "naive_reweight", "C0": 1.0},
    "dpsgd_global": {"name": "dpsgd_global", "C0": 1.0, "Z": 5.0},
    "adaptive": {"name": "adaptive", "C0": 1.0},
    "adaclip": {"name": "adaclip", "C0": 1.0},
    "dpsgd_global_adapt": {"name": "dpsgd_global_adapt", "C0": 1.0, "Z0": 2.0},
    "bounded_adaptive": {"name": "bounded_adaptive", "C0": 1.0, "C_LB": 0.1},
    "bam": {"name": "bam", "C": 1.0, "lam": 0.02},
    "dp_sat": {"name": "dp_sat", "C": 1.0, "rho": 0.05},
    "fairlens": {"name": "fairlens", "C": 1.0},
}
#: every registered method, and dpsgd normalised.
METHODS: dict[str, dict[str, Any]] = {
    name: LEARNS.get(name) or spec.example().model_dump()
    for name, spec in registered_methods().items()
} | {"dpsgd_normalized": LEARNS["dpsgd_normalized"]}
TWO_GROUPS_ONLY = {"fairlens"}
LR_SCALE = {"dpsgd_global": 5.0}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models on a shared CPU run several times faster without intra-op threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_learns_tabular(name: str) -> None:
    result = train(config(METHODS[name], lr=0.5 * LR_SCALE.get(name, 1.0)), gaussian_tabular())
    assert result.test_metrics["accuracy"] > 0.75  # chance is 0.5
    assert result.method == METHODS[name]["name"]
    assert result.device == "cpu"
    assert len(result.history) == 3


@pytest.mark.parametrize("name", sorted(set(METHODS) - TWO_GROUPS_ONLY))
def test_every_method_learns_skewed_digits(name: str) -> None:
    ds = skewed_digits()
    # reproducible: over secret noise naive_reweight reaches 0.66 ± 0.05 (300 runs, minimum
    # 0.52), too near chance for a test that must never flake; the others stay > 0.69 (25 runs)
    cfg = config(METHODS[name], epochs=4, lr=LR_SCALE.get(name, 1.0), reproducible=True)
    result = train(cfg, ds)
    assert result.test_metrics["accuracy"] > 0.5  # chance is 0.1
    metrics = result.test_metrics
    assert len(metrics["group_accuracy"]) == len(metrics["class_accuracy"]) == 10
    assert metrics["class_count"] == np.bincount(ds.test.y.numpy(), minlength=10).tolist()
    assert metrics["worst_class_accuracy"] == min(metrics["class_accuracy"])


@pytest.mark.parametrize("name", ["nonprivate", "dpsgd"])
def test_cnn_on_skewed_digits_beats_chance(name: str) -> None:
    result = train(config(METHODS[name], CNN, epochs=3, lr=0.3), skewed_digits())
    assert result.test_metrics["accuracy"] > 0.4  # chance is 0.1


@pytest.mark.parametrize("name", sorted(METHODS))
def test_same_seed_is_bit_identical_when_reproducible(name: str) -> None:
    ds = gaussian_tabular()
    cfg = config(METHODS[name], {"name": "mlp", "hidden": [8]}, steps=12, seed=7, reproducible=True)
    a, b = train(cfg, ds), train(cfg, ds)
    assert a.reproducible and make_plan(cfg, len(ds.train), ds.n_groups).reproducible
    assert a.model_state.keys() == b.model_state.keys()
    assert all(torch.equal(a.model_state[k], b.model_state[k]) for k in a.model_state)
    assert a.clip_trajectory == b.clip_trajectory
    if name == "dpsgd_f":
        assert [c["step"] for c in a.clip_trajectory] == list(range(1, a.steps + 1))
        assert len(a.clip_trajectory[-1]["C_k"]) == 2
        assert a.group_epsilons is not None and max(a.group_epsilons) <= a.epsilon
        assert a.group_accountants is not None and len(a.group_accountants) == 2
        # each group's own PLD figure, or the run's (with its accountant) where that is smaller
        run_accountant = accounting.spend(a.event, a.delta).accountant
        assert set(a.group_accountants) <= {accounting.ACCOUNTANT_PLD, run_accountant}
        table = epsilon_by_group(a, ds)
        assert (table["accountant"] == a.group_accountants).all()
        # the reading of this run beside the bound fixed before training (the run's ε here:
        # DPSGD-F's clip range lets any group hold the top bound)
        assert a.group_epsilon_bounds == pytest.approx([a.epsilon] * 2, rel=0.02)
        assert all(r <= f for r, f in zip(a.group_epsilons, a.group_epsilon_bounds, strict=True))
        assert list(table["epsilon_reading"]) == a.group_epsilons
        assert list(table["epsilon_fixed_before_training"]) == a.group_epsilon_bounds
        assert "data-dependent reading" in table["reading"].iloc[0]
    else:
        assert a.group_epsilons is None and a.group_accountants is None
        assert a.group_epsilon_bounds is None
    c = train(cfg.model_copy(update={"seed": 8}), ds)
    assert not all(torch.equal(a.model_state[k], c.model_state[k]) for k in a.model_state)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_default_noise_is_secret_and_initialisation_is_the_seeds() -> None:
    """Two default runs of one config start from the same model (the seed's initialisation,
    that of the reproducible run too) but draw other batches and other noise."""
    ds = gaussian_tabular()
    cfg = config(METHODS["dpsgd_f"], {"name": "mlp", "hidden": [8]}, steps=12, seed=7)
    # lr 1e-30: the steps move no parameter by more than 1e-20, so this is the initialisation
    starts = [
        train(c.model_copy(update={"lr": 1e-30}), ds).model_state
        for c in (cfg, cfg, cfg.model_copy(update={"reproducible": True}))
    ]
    for other in starts[1:]:
        for k in starts[0]:
            torch.testing.assert_close(starts[0][k], other[k], rtol=0.0, atol=1e-20)
    a, b = train(cfg, ds), train(cfg, ds)
    assert not a.reproducible and not make_plan(cfg, len(ds.train), ds.n_groups).reproducible
    assert not _same(a.model_state, b.model_state)
    assert a.clip_trajectory != b.clip_trajectory  # DPSGD-F's C_k come from noisy counts
    # no noise at all: the batches alone differ
    exact = config(METHODS["nonprivate"], {"name": "mlp", "hidden": [8]}, steps=12, seed=7)
    assert not _same(train(exact, ds).model_state, train(exact, ds).model_state)
    replay = exact.model_copy(update={"reproducible": True})
    assert _same(train(replay, ds).model_state, train(replay, ds).model_state)


def _values(obj: object) -> list[object]:
    """Every int, float and string inside ``obj`` (a result, its config, lists, dicts)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if isinstance(obj, TrainConfig):
        obj = obj.model_dump()
    if isinstance(obj, torch.Tensor | np.ndarray):
        return np.asarray(obj).ravel().tolist()
    if isinstance(obj, dict):
        return [*obj, *(v for x in obj.values() for v in _values(x))]
    if isinstance(obj, list | tuple):
        return [v for x in obj for v in _values(x)]
    return [obj if isinstance(obj, int | float | str) else str(obj)]


def test_nothing_in_the_result_replays_the_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-running with every field of the result's config reproduces neither the model nor
    the trajectory, and no value of the result is one of the secret seeds."""
    ds = gaussian_tabular()
    states: list[bytes] = []
    reseed = loop_module.reseed_secretly

    def spy(generator: torch.Generator) -> None:
        reseed(generator)
        states.append(generator.get_state().numpy().tobytes())

    monkeypatch.setattr(loop_module, "reseed_secretly", spy)
    cfg = config(METHODS["dpsgd_f"], {"name": "mlp", "hidden": [8]}, steps=12, seed=7)
    result = train(cfg, ds)
    assert len(states) == result.steps and len(set(states)) == len(states)  # a state a step
    # the first state words of every step: none of them is a value of the result
    drawn = [int.from_bytes(state[24 + 8 * i:32 + 8 * i], "little")
             for state in states for i in range(4)]
    values = _values(result)
    assert not set(drawn) & {v for v in values if isinstance(v, int)}
    assert not any(str(seed) in v for seed in drawn for v in values if isinstance(v, str))
    again = train(TrainConfig.model_validate(result.config.model_dump()), ds)
    assert again.config == result.config
    assert not _same(again.model_state, result.model_state)
    assert again.clip_trajectory != result.clip_trajectory


@pytest.mark.parametrize(
    "opt", [{"optimizer": "sgd", "momentum": 0.9, "lr": 0.1}, {"optimizer": "adam", "lr": 0.05}]
)
def test_optimizers_post_process_the_private_gradient(opt: dict[str, Any]) -> None:
    result = train(config(METHODS["dpsgd"], weight_decay=1e-3, **opt), gaussian_tabular())
    assert result.test_metrics["accuracy"] > 0.75


def test_fast_and_materialized_engines_agree() -> None:
    ds = gaussian_tabular()
    cfg = config(METHODS["dpsgd_f"], {"name": "mlp", "hidden": [8]}, epochs=1, reproducible=True)
    fast = train(cfg.model_copy(update={"engine": "fast"}), ds).model_state
    slow = train(cfg.model_copy(update={"engine": "materialized"}), ds).model_state
    for k in fast:
        torch.testing.assert_close(fast[k], slow[k], rtol=1e-4, atol=1e-5)


def test_seed_does_not_touch_global_rng() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    train(config(METHODS["dpsgd"], steps=2), gaussian_tabular())
    assert torch.equal(torch.rand(3), expected)


def test_empty_batches_still_release_noise() -> None:
    ds = gaussian_tabular()
    gen = torch.Generator().manual_seed(0)
    sizes = [len(poisson_batch(len(ds.train), 1 / len(ds.train), gen)) for _ in range(200)]
    assert min(sizes) == 0 and max(sizes) >= 1
    cfg = config(METHODS["dpsgd"], steps=30, batch_size=1)
    start = train(cfg.model_copy(update={"lr": 1e-30}), ds).model_state
    result = train(cfg, ds)
    moved = [not torch.equal(result.model_state[k], start[k]) for k in start]
    assert all(moved)
    assert all(torch.isfinite(v).all() for v in result.model_state.values())


def test_steps_mode_partial_epoch_and_eval_every() -> None:
    ds = gaussian_tabular()  # 500 train / batch 50: 10 steps per epoch
    result = train(config(METHODS["dpsgd"], epochs=None, steps=25, eval_every=2), ds)
    assert result.steps == 25 and result.steps_per_epoch == 10
    assert [(h["epoch"], h["step"]) for h in result.history] == [(2, 20), (3, 25)]
    assert result.sample_rate == pytest.approx(0.1)


def test_result_fields_and_privacy() -> None:
    ds = gaussian_tabular()
    result = train(config(METHODS["dpsgd"], epochs=2, delta=1e-5), ds)
    event = accounting.run_event(dp_event.GaussianDpEvent(1.0), 0.1, 20)
    assert result.event == event
    assert result.epsilon == pytest.approx(accounting.epsilon(event, 1e-5))
    assert (result.sigma, result.count_sigma, result.steps) == (1.0, None, 20)
    assert result.privacy_guarantee
    for pred, split in ((result.test_predictions, ds.test), (result.val_predictions, ds.val)):
        assert isinstance(pred, Predictions)
        assert np.array_equal(pred.y_true, split.y.numpy())
        assert np.array_equal(pred.groups, split.g.numpy())
        assert pred.y_pred.shape == pred.loss.shape == (len(split),)
    assert result.val_metrics is not None and sum(result.val_metrics["group_count"]) == len(ds.val)
    assert result.nonprivate_stats == []
    model = result.load_model()
    found = result.test_predictions  # the last evaluation adds the fairness measures
    fairness = rates.exact_rates(found.y_true, found.y_pred, found.groups, 2, 2, found.prob)
    assert {**evaluate(model, ds.test, 2, 2), **fairness} == result.test_metrics
    assert result.history[-1]["test"] == result.test_metrics


def test_nonprivate_reference_has_no_noise_and_infinite_epsilon() -> None:
    result = train(config(METHODS["nonprivate"], sigma=3.0), gaussian_tabular())
    assert result.sigma == 0.0 and math.isinf(result.epsilon)
    assert result.event == dp_event.NonPrivateDpEvent() and result.privacy_guarantee == "none"


def test_nonprivate_stats_only_on_request() -> None:
    result = train(config(METHODS["dpsgd"], nonprivate_stats=True), gaussian_tabular())
    assert [s["epoch"] for s in result.nonprivate_stats] == [1, 2, 3]
    assert all(math.isfinite(s["train_loss"]) for s in result.nonprivate_stats)


def test_target_epsilon_calibrates_sigma() -> None:
    ds = gaussian_tabular()
    cfg = config(METHODS["dpsgd"], sigma=None, target_epsilon=3.0, steps=5)
    result = train(cfg, ds)
    assert result.epsilon == pytest.approx(3.0, rel=1e-3) and result.epsilon <= 3.0


def test_target_epsilon_with_a_fixed_count_noise() -> None:
    """A count noise that does not scale with σ calibrates; it bounds ε from below."""
    method = {"name": "dpsgd_global_adapt", "sigma2": 10.0}
    plan = make_plan(config(method, sigma=None, target_epsilon=3.0, steps=5), 500, 2)
    assert plan.epsilon == pytest.approx(3.0, rel=1e-3) and plan.epsilon <= 3.0
    gradient, counts = dp_event.GaussianDpEvent(plan.sigma), dp_event.GaussianDpEvent(10.0)
    assert plan.step_event == dp_event.ComposedDpEvent([gradient, counts])
    floor = accounting.epsilon(accounting.run_event(counts, 0.1, 5), 1e-6)
    below = config(method, sigma=None, target_epsilon=0.9 * floor, steps=5)
    with pytest.raises(PrivacyError, match="no sigma <= 1e7 reaches epsilon"):
        make_plan(below, 500, 2)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_the_plan_is_what_train_reports(name: str) -> None:
    """make_plan (no model, no data) gives the result's q, steps, σ, event and ε; a
    target_epsilon gives the same plan as the σ it calibrates to."""
    ds = gaussian_tabular()
    cfg = config(METHODS[name], {"name": "mlp", "hidden": [4]}, steps=6)
    plan = make_plan(cfg, len(ds.train), ds.n_groups)
    assert isinstance(plan, RunPlan) and plan.method == cfg.method
    result = train(cfg, ds)
    assert (result.sample_rate, result.steps, result.steps_per_epoch, result.sigma) == (
        plan.sample_rate, plan.steps, plan.steps_per_epoch, plan.sigma)
    assert result.event == plan.event and result.epsilon == plan.epsilon
    assert result.privacy_guarantee == plan.privacy_guarantee
    assert plan.event == accounting.run_event(plan.step_event, plan.sample_rate, plan.steps)
    if not cfg.method.is_private:
        assert plan.event == dp_event.NonPrivateDpEvent() and plan.epsilon == math.inf
        return
    target = config(METHODS[name], sigma=None, target_epsilon=plan.epsilon, steps=6)
    calibrated = make_plan(target, len(ds.train), ds.n_groups)
    assert calibrated.sigma == pytest.approx(plan.sigma, rel=1e-5)
    assert calibrated.epsilon <= plan.epsilon


def test_registry_digits_end_to_end() -> None:
    from dpfair.data import load_dataset

    ds = load_dataset("digits", {"seed": 0})
    result = train(config(METHODS["dpsgd"], CNN, epochs=1, lr=0.5), ds)
    assert result.n_train == len(ds.train) and result.n_groups == 10
    assert result.test_metrics["accuracy"] > 0.2  # chance is 0.1


def test_callbacks() -> None:
    seen: list[tuple[str, Any]] = []

    class Recorder:
        def on_epoch_end(self, epoch: int, metrics: dict[str, Any]) -> None:
            seen.append(("epoch", epoch))
            assert flat_metrics(metrics["test"], "test/")["test/group_accuracy/1"] >= 0

        def on_train_end(self, result: TrainResult) -> None:
            seen.append(("end", result.steps))

    train(config(METHODS["dpsgd"], progress=True), gaussian_tabular(), callbacks=[Recorder()])
    assert seen == [("epoch", 1), ("epoch", 2), ("epoch", 3), ("end", 30)]


def test_progress_bar_auto_only_on_a_terminal_without_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpfair.training.progress import progress_bar, shows_progress

    assert TrainConfig.model_fields["progress"].default == "auto"
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert not shows_progress("auto") and shows_progress(True) and not shows_progress(False)
    assert type(progress_bar("auto", "run", 3)).__name__ == "_Silent"  # a pipe, a log file
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert shows_progress("auto")
    monkeypatch.setenv("CI", "true")
    assert not shows_progress("auto") and shows_progress(True)
    monkeypatch.delenv("CI")
    assert type(progress_bar(False, "run", 3)).__name__ == "_Silent"
    with progress_bar("auto", "run", 3) as bar, progress_bar("auto", "other", 2) as other:
        bar.advance()
        other.advance()
        bar.status("epoch 1")
        assert bar.progress is other.progress  # concurrent trainings share one display
    assert type(bar).__name__ == "_RichBar"


def test_metrics_absent_group_is_nan() -> None:
    pred = Predictions(
        y_true=np.array([0, 1, 1]), y_pred=np.array([0, 0, 1]),
        groups=np.array([0, 0, 0]), loss=np.array([0.1, 2.0, 0.3]),
    )
    with pytest.warns(RuntimeWarning):
        m = metrics_from_predictions(pred, n_classes=2, n_groups=2)
    assert m["accuracy"] == pytest.approx(2 / 3)
    assert m["class_accuracy"] == [1.0, 0.5] and m["macro_accuracy"] == 0.75
    assert math.isnan(m["group_accuracy"][1]) and m["group_count"] == [3, 0]
    assert m["worst_group_accuracy"] == pytest.approx(2 / 3)


def test_device_selection() -> None:
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


@pytest.mark.parametrize(
    ("update", "match"),
    [
        ({"steps": 10}, "exactly one of epochs and steps"),
        ({"momentum": 0.5, "optimizer": "adam"}, "momentum is an SGD option"),
        ({"epochs": None}, "exactly one of epochs and steps"),
        ({"lr": -0.1}, "greater than 0"),
        ({"sigma": None}, "exactly one of sigma and target_epsilon"),
        ({"target_epsilon": 1.0}, "exactly one of sigma and target_epsilon"),
        ({"device": "tpu"}, "device"),
        ({"batch_size": 0}, "greater than 0"),
        ({"learning_rate": 0.1}, "Extra inputs are not permitted"),
        ({"method": {"name": "dpsgd_x"}}, "dpsgd_x"),
    ],
)
def test_bad_config_is_a_clear_error(update: dict[str, Any], match: str) -> None:
    data = config(METHODS["dpsgd"]).model_dump()
    with pytest.raises(ValidationError, match=match):
        TrainConfig.model_validate({**data, **update})


def test_batch_larger_than_dataset_is_a_clear_error() -> None:
    with pytest.raises(
        ValueError, match="batch_size: 501 exceeds the 500 training examples.*at most 500"
    ):
        train(config(METHODS["dpsgd"], batch_size=501), gaussian_tabular())
