"""Shared helpers of the tuning tests: a real but fast trainer and the search settings.

The trainer is DP-SGD logistic regression in numpy (Poisson sampling, per-example clipping,
Gaussian noise) on a synthetic two-group dataset. Worker processes load it by path
(``"<this file>:fast_train"``).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from dp_accounting import dp_event

from dpfair import accounting
from dpfair.tuning import TuningConfig, TuningJob, TuningResult, draw_k, prepare, tune

THIS = str(Path(__file__).resolve())
TRAIN = f"{THIS}:fast_train"

# ----------------------------------------------------------------------- fast real trainer


def make_dataset(n: int = 1000, d: int = 5, seed: int = 0) -> SimpleNamespace:
    rng = np.random.default_rng(seed)

    def split(m: int) -> SimpleNamespace:
        g = (rng.random(m) < 0.3).astype(np.int64)
        w = np.linspace(1.0, -1.0, d)
        x = rng.normal(size=(m, d)) + 0.5 * g[:, None]
        y = ((x @ w + 0.3 * rng.normal(size=m)) > 0).astype(np.int64)
        return SimpleNamespace(x=x, y=y, g=g)

    return SimpleNamespace(
        name="synthetic",
        train=split(n),
        val=split(n // 2),
        test=split(n // 2),
        n_classes=2,
        n_groups=2,
    )


def fast_steps(config: dict, n: int) -> int:
    return config["epochs"] * math.ceil(n / config["batch_size"])


def fast_event(config: dict, dataset) -> dp_event.DpEvent:
    n = len(dataset.train.y)
    step = dp_event.GaussianDpEvent(config["sigma"])
    return accounting.run_event(step, config["batch_size"] / n, fast_steps(config, n))


def fast_train(config: dict, dataset) -> SimpleNamespace:
    """DP-SGD on logistic regression; sleeps ``config['sleep']`` s when DPFAIR_TEST_SLOW=1."""
    if config.get("crash"):
        raise RuntimeError("planned crash")
    if os.environ.get("DPFAIR_TEST_SLOW") == "1" and config.get("sleep"):
        Path(os.environ["DPFAIR_TEST_MARKER"]).write_text("started")
        time.sleep(config["sleep"])
    tr = dataset.train
    n, d = tr.x.shape
    q = config["batch_size"] / n
    clip, sigma = config["method"]["clip"], config["sigma"]
    rng = np.random.default_rng(config["seed"])
    w = np.zeros(d + 1)
    xb = np.hstack([tr.x, np.ones((n, 1))])
    for _ in range(fast_steps(config, n)):
        idx = np.flatnonzero(rng.random(n) < q)
        p = 1 / (1 + np.exp(-(xb[idx] @ w)))
        g = (p - tr.y[idx])[:, None] * xb[idx]
        norms = np.linalg.norm(g, axis=1)
        g *= np.minimum(1.0, clip / np.maximum(norms, 1e-12))[:, None]
        noisy = g.sum(0) + rng.normal(0, sigma * clip, size=d + 1)
        w -= config["lr"] * noisy / (q * n)
    va = dataset.val
    logits = np.hstack([va.x, np.ones((len(va.y), 1))]) @ w
    p = 1 / (1 + np.exp(-logits))
    loss = -(va.y * np.log(p + 1e-12) + (1 - va.y) * np.log(1 - p + 1e-12))
    pred = {"y_true": va.y, "y_pred": (logits > 0).astype(np.int64), "groups": va.g, "loss": loss}
    return SimpleNamespace(val_predictions=pred, event=fast_event(config, dataset))


def never_train(config, dataset):
    raise AssertionError("training must not start")


# ------------------------------------------------------------------------- search settings

METHOD = {"name": "dpsgd", "clip": 1.0}
BASE = {"epochs": 2, "batch_size": 40, "lr": 0.5, "sigma": 1.0, "delta": 1e-5, "seed": 0}
SPACE = {"lr": [0.1, 0.5, 2.0], "clip": [0.5, 1.0]}


def cfg(tmp_path, **kw) -> dict:
    out = {"space": SPACE, "storage": f"sqlite:///{tmp_path / 'study.db'}", "study_name": "t"}
    out.update(kw)
    return out


def fast_tune(settings: dict, dataset: SimpleNamespace | None = None, train: object = TRAIN,
              **hooks: object) -> TuningResult:
    """``tune`` METHOD over BASE (on ``make_dataset()`` by default) with the fast event and
    trainer, or ``train``."""
    ds = make_dataset() if dataset is None else dataset
    return tune(METHOD, BASE, ds, settings, train, event_fn=fast_event, **hooks)


def prepare_untrained(settings: dict, dataset: SimpleNamespace | None = None) -> TuningJob:
    """``prepare`` a search of METHOD over BASE with the fast event, whose runs must not train."""
    ds = make_dataset() if dataset is None else dataset
    return prepare(METHOD, BASE, ds, settings, never_train, event_fn=fast_event)


def seed_with_k(lo: int, hi: int, **kw) -> int:
    """A seed whose K is in [lo, hi] in a search with these settings and ``reproducible``."""
    for s in range(1000):
        if lo <= draw_k(TuningConfig(seed=s, reproducible=True, **kw), 1) <= hi:
            return s
    raise AssertionError("no seed")


# ------------------------------------------------------------------ worker processes


def worker_env() -> dict:
    """The environment of a worker process: the repository root importable."""
    env = dict(os.environ)
    root = str(Path(THIS).parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


def check_exactly_k(res: TuningResult) -> None:
    numbers = [r["number"] for r in res.trials]
    assert len(numbers) == len(set(numbers))
    runs = [r for r in res.trials if r["ledger"] == "run"]
    assert len(runs) == res.K == res.n_runs
    assert sorted(r["number"] for r in runs) == list(range(res.K))
    assert all(
        r["number"] >= res.K and r["state"] == "PRUNED"
        for r in res.trials
        if r["ledger"] == "excess"
    )
