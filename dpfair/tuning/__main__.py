"""``python -m dpfair.tuning worker SPEC INDEX``: one worker process of a prepared search
(spawned by :func:`dpfair.tuning.worker.spawn_workers`, or started by hand on any machine
sharing the study's storage)."""

from __future__ import annotations

import argparse
import pickle
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run the worker."""
    parser = argparse.ArgumentParser(prog="python -m dpfair.tuning")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="run one tuning worker of a prepared job")
    w.add_argument("spec", help="pickle written by dpfair.tuning.write_spec")
    w.add_argument("index", type=int, help="worker index (0, 1, ...)")
    w.add_argument("--parent", type=int, default=None,
                   help="pid of the process that started this worker: die with it")
    args = parser.parse_args(argv)
    if args.parent is not None:
        from dpfair.processes import die_with_parent

        die_with_parent(args.parent)

    import optuna

    from dpfair.processes import sigterm_raises
    from dpfair.tuning.worker import run_worker

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no per-trial INFO lines
    job = pickle.loads(Path(args.spec).read_bytes())
    # SIGTERM (its owner ending it, or the owner's death): the trial in flight stops at its
    # next step and is told FAIL, never left RUNNING
    with sigterm_raises():
        run_worker(job, args.index, parent=args.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
