"""Private training over several processes (dpfair.training.distributed), on 2 gloo processes:
the same batch and the same noise give the one-process update to 1e-12 in float64, for every
method; the loop's sampling over shards is Poisson over the whole dataset; a killed process ends
the run with a clear error, never a hang."""

from __future__ import annotations

import importlib
import math
import os
import sys
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from scipy import stats

from dpfair.errors import ConfigError, DistributedError
from dpfair.methods import registered_methods
from dpfair.training.distributed import launch
from tests.conftest import biting_method_config

# the spawned processes import the functions they run from this folder's dist_parts.py
sys.path.insert(0, str(Path(__file__).parent))
dist_parts = importlib.import_module("dist_parts")

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 CPU cores")

#: every registered method but FairLens, whose gradients hold terms of the whole batch (refused)
KEYS = sorted({*registered_methods(), "dpsgd_normalized"} - {"fairlens"})


def _close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-12


@pytest.fixture(scope="module")
def together() -> dict[str, list[dict]]:
    """Every method's steps on 2 processes (one launch for all of them)."""
    configs = {key: biting_method_config(key) for key in KEYS}
    return launch(dist_parts.distributed_part, (configs,), nproc=2, device="cpu")


@pytest.mark.parametrize("key", KEYS)
def test_two_processes_give_the_one_process_update(key: str, together: dict) -> None:
    alone = dist_parts.one_process(biting_method_config(key))
    together = together[key]
    assert len(together) == len(alone)
    for t, (one, two) in enumerate(zip(alone, together, strict=True)):
        for a, b in zip(one["grads"], two["grads"], strict=True):
            assert a.dtype == torch.float64
            assert torch.allclose(a, b, rtol=0, atol=1e-12), (key, t, (a - b).abs().max())
        assert one["state"].keys() == two["state"].keys()
        for name, value in one["state"].items():
            for u, v in zip(torch.tensor(value).flatten().tolist(),
                            torch.tensor(two["state"][name]).flatten().tolist(), strict=True):
                assert _close(u, v), (key, t, name, u, v)
        assert _close(one["loss"], two["loss"]), (key, t)
        assert _close(one["sensitivity"], two["sensitivity"])
    # the noise is there (drawn once, by process 0): a private step is not its clipped sum
    if key != "nonprivate":
        assert not torch.equal(alone[2]["grads"][0], torch.zeros_like(alone[2]["grads"][0]))


def test_a_method_with_batch_terms_is_refused_over_processes() -> None:
    from pydantic import ValidationError

    from dpfair.training.config import TrainConfig

    with pytest.raises(ValidationError, match="cannot be split over processes: set nproc to 1"):
        TrainConfig(method={"name": "fairlens"}, epochs=1, sigma=1.0, nproc=2, device="cpu")
    with pytest.raises(DistributedError, match="train it with nproc 1"):
        launch(dist_parts.distributed_part, ({"fairlens": {"name": "fairlens", "C": 0.3}},),
               nproc=2, device="cpu")


def test_more_processes_than_cores_is_refused_with_the_fix() -> None:
    from pydantic import ValidationError

    from dpfair.training.config import TrainConfig

    cores = os.cpu_count() or 1
    with pytest.raises(ValidationError, match=f"set nproc to at most {cores}"):
        TrainConfig(method={"name": "dpsgd"}, epochs=1, sigma=1.0, nproc=cores + 1,
                    device="cpu")
    with pytest.raises(ConfigError, match=f"at most {cores}"):
        launch(dist_parts.distributed_part, ({},), nproc=cores + 1, device="cpu")


#: the sampled dataset size, rate and steps of :func:`sampled`
N, Q, STEPS = 101, 0.1, 2000


@pytest.fixture(scope="module")
def sampled() -> tuple[list[int], bool]:
    """One launch of :func:`dist_parts.batch_sizes` (N, Q, STEPS) under a
    SIGTERM handler of the caller's: the global batch sizes, and whether that handler is the
    one installed after the launch."""
    import signal

    def callers(signum, frame) -> None:  # noqa: ANN001 - a signal handler
        raise AssertionError("not called")

    original = signal.signal(signal.SIGTERM, callers)
    try:
        sizes = launch(dist_parts.batch_sizes, (N, Q, STEPS), nproc=2, device="cpu")
        return sizes, signal.getsignal(signal.SIGTERM) is callers
    finally:
        signal.signal(signal.SIGTERM, original)


def test_batch_sizes_over_shards_are_binomial_over_the_dataset(sampled) -> None:
    """Each process samples its shard (n = 101: shards of 50 and 51) with rate q; the global
    batch size of every step must then be Binomial(n, q), whatever the split (a chi-square test
    of 2000 steps; the per-shard sizes alone would be Binomial(50, q) and Binomial(51, q))."""
    n, q, steps = N, Q, STEPS
    sizes, _ = sampled
    assert len(sizes) == steps
    law = stats.binom(n, q)
    edges = [0, 6, 8, 9, 10, 11, 12, 14, n + 1]  # bins of expected count >= 100
    observed = [sum(lo <= s < hi for s in sizes) for lo, hi in pairwise(edges)]
    expected = [steps * (law.cdf(hi - 1) - law.cdf(lo - 1)) for lo, hi in pairwise(edges)]
    assert min(expected) > 5
    assert stats.chisquare(observed, expected).pvalue > 1e-4, (observed, expected)
    assert abs(sum(sizes) / steps - n * q) < 5 * math.sqrt(n * q * (1 - q) / steps)


def test_a_killed_process_ends_the_run() -> None:
    """Process 1 is SIGKILLed while process 0 waits for it in an all-reduce: the launcher stops
    process 0 and raises naming the killed process (a collective's timeout would instead fail
    process 0 with a timeout, naming process 0)."""
    with pytest.raises(DistributedError, match=r"process 1 of 2 failed \(killed by SIGKILL\)"):
        launch(dist_parts.die_in_process_1, (1.0,), nproc=2, device="cpu")


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_the_shards_partition_the_training_set(world: int) -> None:
    """Every example is in exactly one process's shard, so each is sampled exactly once a step."""
    from dpfair.training.distributed import ProcessGroup

    for n in (0, 1, 5, 101, 1000):
        shards = [ProcessGroup(r, world, torch.device("cpu")).shard(n) for r in range(world)]
        assert [i for s in shards for i in s] == list(range(n))


def test_fit_with_two_processes_trains_through_the_gate(tmp_path, monkeypatch) -> None:
    """dpfair.fit(..., nproc=2): the run goes through the privacy gate (charged once, in this
    one process), plans the one-process ε, learns, and returns every evaluated epoch."""
    from torch import nn

    from dpfair.api import fit
    from dpfair.data.synthetic import SyntheticOptions, generate
    from dpfair.ledger.book import SourceLedger

    monkeypatch.chdir(tmp_path)
    x, y, g = (torch.from_numpy(a) for a in generate(SyntheticOptions(n=600, n_features=6)))
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    common = {"target_epsilon": 2.0, "delta": 1e-4, "C": 1.0, "epochs": 3, "batch_size": 64,
              "lr": 0.5, "progress": False, "eval_every": 1}
    result = fit(net, (x, y, g), nproc=2, **common)
    assert result.config.nproc == 2
    assert 1.98 < result.epsilon <= 2.0
    assert [entry["epoch"] for entry in result.history] == [1, 2, 3]
    assert result.test_metrics["accuracy"] > 0.7  # chance is 0.5
    (charged,) = SourceLedger(".dpfair/ledger.sqlite", tmp_path).releases()
    assert charged.status == "released"  # charged once, settled by this one process
    assert charged.epsilon == pytest.approx(result.epsilon)


def test_a_killed_process_fails_the_run_and_the_gate_settles_it(tmp_path, monkeypatch) -> None:
    from dpfair.api import fit
    from dpfair.data.synthetic import SyntheticOptions, generate
    from dpfair.ledger.book import SourceLedger

    monkeypatch.chdir(tmp_path)
    x, y, g = (torch.from_numpy(a) for a in generate(SyntheticOptions(n=300, n_features=6)))
    with pytest.raises(DistributedError, match=r"process 1 of 2 failed \(killed by SIGKILL\)"):
        fit(dist_parts.DiesInProcess1(6), (x, y, g), nproc=2, sigma=1.0, C=1.0, epochs=1,
            batch_size=32, progress=False)
    (charged,) = SourceLedger(".dpfair/ledger.sqlite", tmp_path).releases()
    assert charged.status == "failed"  # possibly released: still counted, never pending


def test_a_daemonic_process_is_refused_with_the_fix() -> None:
    """A Dask worker is daemonic by default and may not start processes: one clear error."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    answers = context.Queue()
    worker = context.Process(target=dist_parts.launch_from_here, args=(answers,), daemon=True)
    worker.start()
    answer = answers.get(timeout=300)
    worker.join(timeout=60)
    assert answer.startswith("ConfigError: nproc 2: this is a daemonic process"), answer
    assert "DASK_DISTRIBUTED__WORKER__DAEMON=False" in answer


def test_nproc_on_a_local_dask_cluster_is_refused_when_params_load() -> None:
    from pydantic import ValidationError

    from dpfair.config.params import Params

    train = {"epochs": 1, "sigma": 1.0, "nproc": 2, "device": "cpu"}
    with pytest.raises(ValidationError, match="set pipeline.task_runner: threads, or nproc: 1"):
        Params.model_validate({"experiment": {"train": train},
                               "pipeline": {"task_runner": "dask"}})
    Params.model_validate({"experiment": {"train": train},  # a remote cluster: checked there
                           "pipeline": {"task_runner": "dask", "dask_address": "tcp://h:8786"}})


def test_the_callers_signal_handlers_are_back_after_a_launch(sampled) -> None:
    """torch's launcher sets its own SIGTERM handler and leaves it: the caller's comes back, so
    `dpfair.processes.sigterm_raises` still turns a later SIGTERM into Terminated."""
    _, callers_handler_back = sampled
    assert callers_handler_back
