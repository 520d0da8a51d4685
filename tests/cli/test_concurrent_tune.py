"""Two `dpfair tune` of one study started together (the README's multi-machine recipe, here on
one machine with one SQLite storage and ledger): the search is reserved in the privacy ledger
once, the later process joining it uncharged, and K runs are trained in all."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import optuna
import yaml

from dpfair.ledger import SourceLedger
from tests.cli.conftest import CENSUS_TUNE_PARAMS, census_folder

TUNE = """
import sys, time
from typer.testing import CliRunner
from dpfair.cli import app
time.sleep(max(0.0, float(sys.argv[1]) - time.time()))  # both at once
out = CliRunner().invoke(app, ["tune", "--method", "dpsgd", "--study", "s"])
print(out.output)
sys.exit(out.exit_code)
"""


def test_two_processes_on_one_study_charge_it_once(tmp_path: Path) -> None:
    folder = census_folder(tmp_path)
    (folder / "params.yaml").write_text(yaml.safe_dump(CENSUS_TUNE_PARAMS))  # mode fixed, n_runs 2
    start = time.time() + 8.0  # after both interpreters have imported dpfair's CLI
    procs = [subprocess.Popen([sys.executable, "-c", TUNE, str(start)], cwd=folder,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output[-3000:]
    searches = [r for r in SourceLedger(".dpfair/ledger.sqlite", folder).releases()
                if r.counts and "study" in r.context]
    assert len(searches) == 1, [r.context for r in searches]
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{folder / 'optuna.db'}"
                               ).get_trials(deepcopy=False)
    runs = [t for t in trials if t.user_attrs.get("dpfair.ledger") == "run"]
    assert len(runs) == 2 and all(t.state.name == "COMPLETE" for t in runs)


HOLD = """
import sys, time
from dpfair.ledger import SourceLedger
SourceLedger(".dpfair/ledger.sqlite", sys.argv[1]).store.claim("search s1")
print("claimed", flush=True)
time.sleep(120)
"""


def test_a_search_reserved_by_a_live_process_is_waited_for(tmp_path: Path) -> None:
    """While another live process holds the claim of a search (it is looking for, or making,
    the search's reservation), `dpfair tune` waits for it, and refuses after its wait naming
    the fix; once that process is gone (killed), the claim is taken over."""
    import pytest

    from dpfair.config.sections import BudgetSection
    from dpfair.errors import PrivacyError
    from dpfair.ledger import PrivacyGate
    from dpfair.pipeline.standalone import _search_claimed

    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=tmp_path,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
        gate = PrivacyGate(BudgetSection(), tmp_path)
        with pytest.raises(PrivacyError, match="being reserved by another dpfair process"):
            with _search_claimed(gate, "s1", wait=1.0):
                raise AssertionError("entered while another process held the claim")
    finally:
        holder.kill()
        holder.wait(30)
    entered = []
    with _search_claimed(gate, "s1", wait=10.0):
        entered.append(True)
    assert entered == [True]
