"""Property-based fuzzing of params.yaml's values and the CLI's options (Hypothesis): for every
generated input, `dpfair train` / `dpfair tune` end with exit code 0 (done), 2 (bad input),
3 (budget refused) or 4 (unreachable), print no traceback, and record nothing in the privacy
ledger when they refuse.

Each input is a valid configuration with up to three of its values replaced: by another valid
value, a wrong type, a boolean, an extreme, NaN or ∞, so the checks deeper down are reached
too. Most inputs name a tracking server that does not answer, so an accepted one ends at the
preflight (exit 4) before anything is charged; some a local store, so they train. Derandomised
(the same inputs on every run, a failure reproducible) and kept to a few dozen inputs."""

from __future__ import annotations

import copy
import math
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dpfair.cli.commands import app
from dpfair.ledger import SourceLedger
from tests.cli.conftest import CENSUS_TUNE_PARAMS, census_folder

EXTREMES = [0, -1, 1e-300, 1e300, 10**12, math.inf, -math.inf, math.nan, True, False, None,
            "", "1.0", [1], {"a": 1}]


def _wild(*valid: Any) -> st.SearchStrategy[Any]:
    """Another valid value, an extreme, an arbitrary number or a short text."""
    return st.one_of(st.sampled_from(valid), st.sampled_from(EXTREMES),
                     st.floats(allow_nan=True, allow_infinity=True), st.integers(),
                     st.text(max_size=4))


COLUMNS = ["Income", "Nationality", "person", "Hours", "nope"]
#: dotted key path of params.yaml: what may replace its value
VALUES: dict[str, st.SearchStrategy[Any]] = {
    **{f"experiment.train.{key}": strategy for key, strategy in {
        "lr": _wild(0.1, 2.0), "sigma": _wild(0.5, 3.0), "target_epsilon": _wild(1.0, 100.0),
        "epochs": _wild(1, 2), "batch_size": _wild(64, 400), "delta": _wild(1e-3),
        "weight_decay": _wild(1e-4), "momentum": _wild(0.9), "eval_every": _wild(2),
        "max_physical_batch": _wild(8)}.items()},
    "experiment.methods.dpsgd.C": _wild(0.5, 5.0),
    "experiment.seeds": st.one_of(st.lists(st.integers(-2, 3), max_size=2), _wild([0, 1])),
    **{f"tuning.{key}": strategy for key, strategy in {
        "mode": st.sampled_from(["fixed", "grid", "poisson", "tnb", "bogus"]),
        "n_runs": _wild(1, 3), "mu": _wild(1.0, 3.0), "p": _wild(0.5)}.items()},
    "tuning.spaces.dpsgd": st.dictionaries(
        st.sampled_from(["lr", "C", "batch_size", "epochs", "sigma", "nope"]),
        st.lists(_wild(0.1, 0.5, 1, 16), max_size=3), max_size=2),
    **{f"budget.{key}": strategy for key, strategy in {
        "epsilon": _wild(0.5, 10.0, 1000.0), "delta": _wild(1e-6, 0.5),
        "calibrate_noise": _wild(True), "lifetime_epsilon": _wild(1.0, 50.0)}.items()},
    **{f"datasets.census.{key}": st.sampled_from(COLUMNS)
       for key in ("target", "protected", "id_column")},
    "datasets.census.id_columns": st.lists(st.sampled_from(COLUMNS), max_size=2),
    "tracking.uri": st.sampled_from(["mysql://u:pw@h/db", "ftp://x", "mlruns", "sqlite://",
                                     "postgresql://bob:pw@127.0.0.1:{port}/db"]),
}
OPTIONS = {
    "train": {"--seed": ["1", "-1", "99999999999999999999", "x"], "--method": ["nope", ""]},
    "tune": {"--workers": ["2", "0", "-3", "100000"], "--method": ["nope"],
             "--storage": ["sqlite:///:memory:", "mysql://u:pw@h/db", "journal:", "x",
                           "postgresql://bob:pw@127.0.0.1:{port}/db"]},
}
FOLDER = Path(tempfile.mkdtemp(prefix="dpfair-fuzz-"))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _set(params: dict, path: str, value: Any) -> None:
    *parents, key = path.split(".")
    for part in parents:
        params = params.setdefault(part, {})
    params[key] = value


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_input_is_done_or_one_clear_refusal_that_charges_nothing(data: Any) -> None:
    if not (FOLDER / "census.csv").exists():
        census_folder(FOLDER)
    port = _closed_port()
    params = copy.deepcopy(CENSUS_TUNE_PARAMS)
    # a server that does not answer: an accepted input ends at the preflight, uncharged
    server = data.draw(st.sampled_from(["closed", "closed", "closed", "local"]))
    if server == "closed":
        params["tracking"]["uri"] = f"http://127.0.0.1:{port}"
    for path in data.draw(st.lists(st.sampled_from(sorted(VALUES)), max_size=3, unique=True)):
        value = data.draw(VALUES[path], label=path)
        _set(params, path, value.format(port=port) if isinstance(value, str) else value)
    command = data.draw(st.sampled_from(["train", "tune"]))
    options = data.draw(st.dictionaries(st.sampled_from(sorted(OPTIONS[command])),
                                        st.none(), max_size=2))
    args = [command]
    for option in options:
        args += [option, data.draw(st.sampled_from(OPTIONS[command][option]), label=option)
                 .format(port=port)]
    (FOLDER / "fuzz.yaml").write_text(yaml.safe_dump(params))
    args += ["--params", "fuzz.yaml"]
    ledger = SourceLedger(".dpfair/ledger.sqlite", FOLDER)
    before = len(ledger.releases())
    here = os.getcwd()
    os.chdir(FOLDER)
    try:
        out = CliRunner().invoke(app, args)
    finally:
        os.chdir(here)
    shown = (args, params, out.output[-3000:])
    assert out.exit_code in (0, 2, 3, 4), shown
    assert "Traceback" not in out.output and "bug in dpfair" not in out.output, shown
    if out.exit_code != 0:
        assert len(ledger.releases()) == before, shown
