"""Two `dpfair tune` of one study started together (the README's multi-machine recipe, here on
one machine with one SQLite storage and ledger; a file barrier starts them at once): the search
is reserved in the privacy ledger once (its identity is a unique reservation key,
:meth:`dpfair.ledger.SourceLedger.reserve_once`), the later process joining it uncharged, and
K runs are trained in all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import yaml

from dpfair.ledger import SourceLedger
from tests.cli.conftest import CENSUS_TUNE_PARAMS, census_folder

TUNE = """
import sys, time
from pathlib import Path
from typer.testing import CliRunner
from dpfair.cli import app
barrier, me = Path(sys.argv[1]), sys.argv[2]
(barrier / f"ready-{me}").touch()  # dpfair's CLI imported: wait for the other, then both go
while len(list(barrier.glob("ready-*"))) < 2:
    time.sleep(0.001)
out = CliRunner().invoke(app, ["tune", "--method", "dpsgd", "--study", "s"])
print(out.output)
sys.exit(out.exit_code)
"""


def test_two_processes_on_one_study_charge_it_once(tmp_path: Path) -> None:
    folder = census_folder(tmp_path)
    (folder / "params.yaml").write_text(yaml.safe_dump(CENSUS_TUNE_PARAMS))  # mode fixed, n_runs 2
    (folder / "barrier").mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", TUNE, str(folder / "barrier"), str(i)],
                              cwd=folder,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
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

