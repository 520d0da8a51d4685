"""Puts the venv's ``bin/`` first on PATH in a DVC command of this venv's Python that starts
the experiment queue's workers (``.venv/bin/dvc queue start``, ``python -m dvc queue start``,
``dvc exp run --run-all``), as activating the venv would.

`make install` copies this module into the venv's site-packages with a ``.pth`` file that
imports it when the venv's Python starts (as virtualenv's own ``_virtualenv.pth`` does); any
other command is left as it is.

Why: DVC's experiment queue starts its worker (``dvc exp queue-worker``), which starts each
queued experiment (``dvc exp exec-run``), as ``dvc`` by name from PATH, so ``.venv/bin/dvc
queue start`` from a shell without the venv on PATH printed "Started" and its worker failed on
"no such file: 'dvc'" (or ran another installation's ``dvc``, without dpfair). With the venv's
``bin/`` first, the worker and the experiments (which inherit its PATH) run this venv's DVC.
Other DVC commands start no ``dvc`` by name and need nothing on PATH (``bin/dvc-python``).

It imports nothing but ``os`` and ``sys``: every Python start of the venv reads it.
"""

import os
import sys


def _starts_queue_workers(argv: list[str]) -> bool:
    """Whether the command line ``argv`` (the interpreter's, ``sys.orig_argv``) runs DVC (its
    console script ``dvc`` or ``-m dvc``) with a command that starts queue workers: ``queue
    ...`` or ``exp run --run-all``."""
    if len(argv) > 1 and os.path.basename(argv[1]) == "dvc":
        rest = argv[2:]
    elif "-m" in argv[:-1] and argv[argv.index("-m") + 1] == "dvc":
        rest = argv[argv.index("-m") + 2:]
    else:
        return False
    words = [w for k, w in enumerate(rest)  # the command's words (--cd takes a value)
             if not w.startswith("-") and (k == 0 or rest[k - 1] != "--cd")]
    return words[:1] == ["queue"] or (words[:2] == ["exp", "run"] and "--run-all" in rest)


def put_venv_first(argv: list[str], executable: str, environ: dict[str, str]) -> None:
    """``executable``'s folder (the venv's ``bin/``; ``sys.executable`` keeps the venv's path)
    first on ``environ``'s PATH when ``argv`` starts DVC's queue workers and it is not first
    already."""
    if not _starts_queue_workers(argv):
        return
    bin_dir = os.path.dirname(executable)
    path = environ.get("PATH", "")
    if bin_dir and path.split(os.pathsep)[0] != bin_dir:
        environ["PATH"] = os.pathsep.join(p for p in (bin_dir, path) if p)


put_venv_first(sys.orig_argv, sys.executable, os.environ)  # type: ignore[arg-type]
