"""What the processes of tests/training/test_distributed.py run (a module, so that the spawned
processes can import it): a few private steps of one method on fixed batches, each process on
its shard of every batch, or the whole batches in one process."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
from pydantic import TypeAdapter
from torch import nn

from dpfair.engine.collective import ALONE, Collective
from dpfair.engine.step import PrivateStep
from dpfair.methods import MethodConfig, build_method
from dpfair.training.distributed import ProcessGroup

#: the noise multiplier and expected batch size of the steps
SIGMA, EXPECTED = 0.7, 6.0


def batches(seed: int = 3) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Four Poisson-like batches of sizes 13, 1 (process 0's half empty), 0 and 9."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for size in (13, 1, 0, 9):
        x = torch.randn(size, 5, generator=gen, dtype=torch.float64) * 3
        y = torch.randint(0, 2, (size,), generator=gen)
        g = torch.randint(0, 2, (size,), generator=gen)
        out.append((x, y, g))
    return out


def model() -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2)).double()


def steps(config: dict[str, Any], collective: Collective, rank: int = 0, world: int = 1,
          ) -> list[dict[str, Any]]:
    """Every batch of :func:`batches`, one SGD step each; this process's shard of each."""
    method = build_method(TypeAdapter(MethodConfig).validate_python(config), n_groups=2,
                          sigma=SIGMA, expected_batch_size=EXPECTED)
    net = model()
    step = PrivateStep(net, method, sigma=SIGMA, expected_batch_size=EXPECTED,
                       collective=collective)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.3)
    noise = torch.Generator().manual_seed(5)  # used by the process that draws the noise only
    found = []
    for x, y, g in batches():
        part = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
        optimizer.zero_grad(set_to_none=True)
        info = step(x[part], y[part], g[part], noise)
        found.append({"grads": [p.grad.clone() for p in net.parameters()],
                      "state": info.state, "loss": info.nonprivate_batch_loss,
                      "sensitivity": info.sensitivity})
        optimizer.step()
    return found


def one_process(config: dict[str, Any]) -> list[dict[str, Any]]:
    return steps(config, ALONE)


def distributed_part(configs: dict[str, dict[str, Any]], *, group: ProcessGroup,
                     ) -> dict[str, list[dict[str, Any]]]:
    """:func:`steps` of every method of ``configs`` (by key), one after the other."""
    return {key: steps(config, group, group.rank, group.world) for key, config in configs.items()}


def batch_sizes(n: int, q: float, steps_: int, *, group: ProcessGroup) -> list[int]:
    """The realised global batch sizes of ``steps_`` steps of the training loop's sampling."""
    from dpfair.training.entropy import reseed_secretly
    from dpfair.training.loop import poisson_batch

    shard = group.shard(n)
    generator = torch.Generator()
    sizes = torch.zeros(steps_, dtype=torch.float64)
    for t in range(steps_):
        reseed_secretly(generator)
        sizes[t] = len(poisson_batch(len(shard), q, generator))
    group.sum_([sizes])
    return [int(s) for s in sizes]


def die_in_process_1(seconds: float, *, group: ProcessGroup) -> str:
    """Process 1 kills itself (SIGKILL) while process 0 waits in an all-reduce."""
    if group.rank == 1:
        time.sleep(seconds)
        os.kill(os.getpid(), signal.SIGKILL)
    group.sum_([torch.zeros(1)])  # never completes: its partner is gone
    return "finished"


class DiesInProcess1(nn.Module):
    """A classifier whose forward pass kills (SIGKILL) process 1 of a run over processes."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if os.environ.get("RANK") == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        return self.lin(x)


def launch_from_here(answers: Any) -> None:
    """Try a run over 2 processes from this (daemonic) process; put what happened in
    ``answers``."""
    from dpfair.training.distributed import launch

    try:
        answers.put(repr(launch(batch_sizes, (10, 0.5, 1), nproc=2, device="cpu")))
    except Exception as error:  # the test reads it
        answers.put(f"{type(error).__name__}: {error}")
