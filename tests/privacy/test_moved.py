"""The old ``dpfair.privacy`` paths still import, as the same modules, with a warning."""

from __future__ import annotations

import subprocess
import sys

from dpfair.privacy import new_name


def test_every_old_path_is_the_new_module_and_warns() -> None:
    # a fresh interpreter: this process has imported the new paths already, never the old
    code = (
        "import importlib, sys, warnings\n"
        "from dpfair.privacy import MOVED\n"
        "for name, target in MOVED.items():\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        old = importlib.import_module('dpfair.privacy.' + name)\n"
        "    assert old is importlib.import_module(target), (name, old)\n"
        "    assert [w for w in caught if issubclass(w.category, DeprecationWarning)"
        " and target in str(w.message)], (name, caught)\n"
        "from dpfair.privacy.methods.dpsgd import Dpsgd\n"
        "assert Dpsgd is importlib.import_module('dpfair.methods.dpsgd').Dpsgd\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_only_moved_names_are_redirected() -> None:
    assert new_name("dpfair.privacy.methods.dpsgd_f") == "dpfair.methods.dpsgd_f"
    assert new_name("dpfair.privacy.nothing_here") is None
    assert new_name("dpfair.engine.step") is None
