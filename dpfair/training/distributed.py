"""Data-parallel private training over several processes on ``torch.distributed``.

:func:`launch` starts ``nproc`` processes through torch's elastic launcher (the engine of
``torchrun``, ``torch.distributed.run``) on this machine: backend ``gloo`` on the CPU, ``nccl``
on GPUs (process ``r`` on GPU ``r``). Each joins the process group set up from the environment
the launcher gives it (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and runs the
training function on a :class:`ProcessGroup`:

* **Sampling** (Beltran et al., arXiv 2406.17298, Sec. 3: per-rank sampling must stay Poisson
  over the whole dataset): process ``r`` holds the contiguous shard :meth:`ProcessGroup.shard`
  of the training set and keeps each of its examples with probability ``q`` from its own
  secret generator. Every example is then in the batch with probability ``q`` independently of
  all others, whatever the number of processes: the batch is the one-process Poisson batch and
  the accountant is unchanged.
* **The step** (:class:`dpfair.engine.step.PrivateStep` with this group as its
  ``collective``): each process clips its examples' gradients; the noise of every release (the
  gradient's, and the counts of DPSGD-F, naive reweighting and adaptive clipping) is drawn by
  process 0 alone and added to its part before :meth:`ProcessGroup.sum_` (an all-reduce), so
  every process holds the same noisy update and the same released state: noise drawn once.
* **Writing**: only process 0's result comes back; the caller (one process) writes MLflow,
  the ledger and the registry.
* **A crashed process**: the launcher's agent watches the processes and stops the others when
  one ends with an error or is killed (``max_restarts = 0``); every collective also ends after
  :data:`COLLECTIVE_TIMEOUT`. :func:`launch` then raises :class:`~dpfair.errors.DistributedError`
  naming the process and its error: no hang, and the privacy gate settles the run as failed.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from dpfair.engine.collective import Collective
from dpfair.errors import ConfigError, DistributedError
from dpfair.training.config import check_cpu_processes

__all__ = ["COLLECTIVE_TIMEOUT", "ProcessGroup", "check_nproc", "launch"]

#: Every collective of a run (an all-reduce waiting for a process that died) ends after this.
COLLECTIVE_TIMEOUT = timedelta(minutes=5)

R = TypeVar("R")


def check_nproc(nproc: int, device: str) -> None:
    """Refuse more processes than the machine has for them: on a CPU more than its cores (each
    process then gets no core of its own), on CUDA more than its GPUs."""
    if nproc == 1:
        return
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        gpus = torch.cuda.device_count()
        if nproc > gpus:
            raise ConfigError(f"nproc {nproc} is more processes than the {gpus} GPUs of this "
                              f"machine: set experiment.train.nproc (or --nproc) to at most {gpus}")
        return
    check_cpu_processes(nproc)


@dataclass(frozen=True)
class ProcessGroup(Collective):
    """This process's place among the ``world`` processes of one run: its shard of the training
    set, and the all-reduce of the step (module docstring)."""

    rank: int
    world: int
    device: torch.device

    @property
    def draws_noise(self) -> bool:  # type: ignore[override]
        return self.rank == 0

    @property
    def several(self) -> bool:  # type: ignore[override]
        return self.world > 1

    def shard(self, n: int) -> range:
        """The contiguous block of ``range(n)`` this process samples from."""
        return range(self.rank * n // self.world, (self.rank + 1) * n // self.world)

    def sum_(self, tensors: list[torch.Tensor]) -> None:
        """All-reduce (sum) of every tensor, in place: one collective per dtype."""
        for dtype in dict.fromkeys(t.dtype for t in tensors):
            same = [t for t in tensors if t.dtype == dtype]
            flat = torch.cat([t.reshape(-1) for t in same])
            dist.all_reduce(flat)
            for t, part in zip(same, flat.split([t.numel() for t in same]), strict=True):
                t.copy_(part.view_as(t))


def _device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


@record
def _bootstrap(fn: Callable[..., R], args: tuple, device: str, threads: int) -> R | None:
    """One process of the run: joins the group set up from torchrun's environment, runs
    ``fn(*args, group=...)``; process 0 returns its value."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(threads)
    on_gpu = device == "cuda"
    if on_gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if on_gpu else "gloo", timeout=COLLECTIVE_TIMEOUT)
    try:
        where = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        value = fn(*args, group=ProcessGroup(rank, world, where))
        dist.barrier()  # no process leaves while another still needs it
        return value if rank == 0 else None
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(fn: Callable[..., R], args: tuple[Any, ...], *, nproc: int, device: str,
           threads: int | None = None) -> R:
    """Run ``fn(*args, group=ProcessGroup)`` in ``nproc`` processes (torchrun's launcher, on
    this machine) and return process 0's value; ``fn`` must be importable (a module-level
    function) and ``args`` picklable. ``threads``: torch threads of each process (None: on the
    CPU this process's threads shared out, at least 1; 1 on GPUs). Raises
    :class:`~dpfair.errors.DistributedError` when a process fails or is killed (the others are
    stopped first)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    check_nproc(nproc, device)
    if multiprocessing.current_process().daemon:
        raise ConfigError(
            f"nproc {nproc}: this is a daemonic process (a Dask worker's, by default), which may "
            "not start processes: start the Dask workers with the setting "
            "distributed.worker.daemon: false (DASK_DISTRIBUTED__WORKER__DAEMON=False), or "
            "train with nproc 1")
    device = _device(device)
    if threads is None:
        threads = max(1, torch.get_num_threads() // nproc) if device == "cpu" else 1
    # the launcher's folder (a failed process's error file: its traceback) is removed after
    with tempfile.TemporaryDirectory(prefix="dpfair-distributed-") as logs:
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"dpfair-{uuid.uuid4().hex}",
            rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{_free_port()}", max_restarts=0,
            monitor_interval=0.1, start_method="spawn", logs_specs=DefaultLogsSpecs(logs),
        )
        try:
            with _signals_kept():
                values = elastic_launch(config, _bootstrap)(fn, args, device, threads)
        except ChildFailedError as error:
            rank, failure = error.get_first_failure()
            raise DistributedError(
                f"process {rank} of {nproc} failed ({_reason(failure)}); the others were "
                "stopped. Fix its error and run again, or train with nproc 1") from None
    return values[0]


#: the signals torch's launcher takes over while it runs (its TORCHELASTIC_SIGNALS_TO_HANDLE)
_LAUNCHER_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP",
                                                              "SIGQUIT") if hasattr(signal, name))


@contextlib.contextmanager
def _signals_kept() -> Iterator[None]:
    """The caller's signal handlers, back after the launch: torch's launcher sets its own
    (stop the processes, raise ``SignalException``) and leaves them set, so a later SIGTERM
    would no longer end the caller as it expects (``dpfair.processes.sigterm_raises``). A signal
    the launcher took is delivered again to the caller's handler, once its processes stopped."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in _LAUNCHER_SIGNALS}

    def restore() -> None:
        for sig, handler in kept.items():
            if handler is not None:  # None: set outside Python, cannot be set back
                signal.signal(sig, handler)

    try:
        yield
    except SignalException as error:
        restore()
        signal.raise_signal(error.sigval)  # the caller's handler: Terminated, or the default
        raise
    finally:
        restore()


def _reason(failure: Any) -> str:
    """A failed process's error in one line: its exception, or the signal that killed it."""
    if failure.signal_name() != "<N/A>" and failure.exitcode < 0:
        return f"killed by {failure.signal_name()}"
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    lines = str(message).strip().splitlines()
    return lines[-1] if lines else f"exit code {failure.exitcode}"
