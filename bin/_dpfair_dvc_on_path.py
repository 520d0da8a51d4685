"""Puts the venv's ``bin/`` first on PATH in a DVC process that this venv's Python runs
(``.venv/bin/dvc ...`` or ``.venv/bin/python -m dvc ...``), as activating the venv would.

`make install` copies this module into the venv's site-packages with a ``.pth`` file that
imports it when the venv's Python starts (as virtualenv's own ``_virtualenv.pth`` does); any
other program of the venv is left as it is.

Why: DVC's experiment queue starts its worker (``dvc exp queue-worker``) and each queued
experiment (``dvc exp exec-run``) as ``dvc`` by name from PATH, so ``.venv/bin/dvc queue
start`` from a shell without the venv on PATH printed "Started" and its worker failed on "no
such file: 'dvc'" (or ran another installation's ``dvc``, without dpfair). With the venv's
``bin/`` first, the worker and the experiments run this venv's DVC, and the stage commands
(``bin/dvc-python``) this venv's Python.

It imports nothing but ``os`` and ``sys`` and does nothing outside DVC: every Python start
of the venv reads it.
"""

import os
import sys


def _runs_dvc(argv: list[str]) -> bool:
    """Whether the command line ``argv`` (the interpreter's, ``sys.orig_argv``) runs DVC: its
    script is named ``dvc`` (the venv's console script) or it names the module (``-m dvc``)."""
    script = argv[1] if len(argv) > 1 else ""
    return os.path.basename(script) == "dvc" or any(
        flag == "-m" and module == "dvc" for flag, module in zip(argv, argv[1:], strict=False))


def put_venv_first(argv: list[str], executable: str, environ: dict[str, str]) -> None:
    """``executable``'s folder (the venv's ``bin/``; ``sys.executable`` keeps the venv's path)
    first on ``environ``'s PATH when ``argv`` runs DVC and it is not first already."""
    if not _runs_dvc(argv):
        return
    bin_dir = os.path.dirname(executable)
    path = environ.get("PATH", "")
    if bin_dir and path.split(os.pathsep)[0] != bin_dir:
        environ["PATH"] = os.pathsep.join(p for p in (bin_dir, path) if p)


put_venv_first(sys.orig_argv, sys.executable, os.environ)  # type: ignore[arg-type]
