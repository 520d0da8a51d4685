"""The release test (issue #40, item 4): markers planted in a private table (a unique value, a
unique category, an extreme row's mean and standard deviation, exact counts) must appear in
no place any command or API that reads private data can put a result, outside the documented
private working state (:data:`tests.release.scan.ALLOWLIST`). One case per command x place,
so a failure names both, and the marker and where it was found.

A command or output that can carry private data joins this suite (ARCHITECTURE.md, "Where
things go"): a :class:`tests.release.commands.Command` and, for a new place, its reader in
:mod:`tests.release.scan`.
"""

from __future__ import annotations

import fnmatch

import pytest

from tests.release.commands import COMMANDS, PLANTED
from tests.release.scan import PLACES, flow_runs_between, report

pytestmark = pytest.mark.slow

#: commands that only read what another command logged: they write no file
READ_ONLY = {"results", "results --full"}


def _cases() -> list:
    cases = []
    for command in COMMANDS:
        assert set(command.places) <= set(PLACES), f"{command.name}: a place scan.py reads"
        for place in command.places:
            cases.append(pytest.param(command.name, place,
                                      id=f"{command.name}-{place}".replace(" ", "_")))
    return cases


def _refused(outcome) -> bool:
    """``fit`` without declared preprocessing is refused, as ``dpfair train`` is."""
    return (outcome.command.name == "fit undeclared" and outcome.returncode != 0
            and "allow_fitted_preprocessing" in outcome.stderr)


@pytest.mark.parametrize(("command", "place"), _cases())
def test_no_marker_of_the_private_table_leaves_through(release, command, place):
    outcome = release.outcomes[command]
    if command == "fit undeclared":  # a transform fitted on the rows is refused
        assert _refused(outcome), outcome.stderr
    assert outcome.returncode == 0 or _refused(outcome), (
        f"{command} failed ({outcome.returncode}):\n{outcome.stdout}\n{outcome.stderr}")
    found = release.scan(command, place)
    # a scan that read nothing proves nothing
    if place == "stdout" and not _refused(outcome):
        assert outcome.stdout.strip(), f"{command} printed nothing"
    elif place == "mlflow":
        for kind in outcome.command.logs:
            assert any(kind in where for where in found.read), f"{command}: no {kind} read"
    elif place == "prefect":
        for kind in ("flow run", "task run", "logs", "artifact"):
            assert any(kind in where for where in found.read), f"{command}: no {kind} read"
    elif place == "files" and command not in READ_ONLY and not _refused(outcome):
        assert found.items + len(found.skipped) > 0, f"{command} wrote no file"
        for pattern in outcome.command.writes:
            assert fnmatch.filter(found.read, pattern), f"{command}: no {pattern} read"
    elif place == "returned" and not _refused(outcome):
        assert outcome.returned, f"{command} returned nothing"
    documented = [f for f in found.findings if any(
        fnmatch.fnmatch(f"{place}:{f.where}", glob) for glob in outcome.command.documented)]
    if any(glob.startswith(f"{place}:") for glob in outcome.command.documented):
        assert documented, f"{command}: no documented release found in {place}"
    leaked = [f for f in found.findings if f not in documented]
    assert not leaked, f"{command} put private data in {place}:\n{report(leaked)}"


@pytest.mark.parametrize("command", [PLANTED.name])
def test_a_planted_leak_fails_the_release_test(release, command):
    """`dpfair train` with the training rows' mean logged as a param, their standard
    deviation printed and both saved as float32 in a compressed file: each found, by place."""
    outcome = release.outcomes[command]
    assert outcome.returncode == 0, outcome.stderr
    mean, std = "mean of income, training rows", "std (ddof 0) of income, training rows"
    for place, planted in (("mlflow", [mean]), ("stdout", [std]), ("files", [mean, std])):
        found = release.scan(command, place).findings
        for name in planted:
            assert any(f.marker.startswith(f"{name} (") for f in found), (place, name, found)


@pytest.mark.parametrize("command", [c.name for c in COMMANDS if "prefect" in c.places])
def test_every_flow_run_started_meanwhile_was_scanned(release, command):
    """The Prefect scans read the flow runs the commands name (and their parents and
    subflows): no flow run started while ``command`` ran is missing from them."""
    outcome = release.outcomes[command]
    scanned = {r.id for name, o in release.outcomes.items() if "prefect" in o.command.places
               for r in release.flow_runs(name)}
    started = {r.id: r.name for r in flow_runs_between(outcome.since, outcome.until)}
    assert {r.id for r in release.flow_runs(command)} <= started.keys()
    assert started and started.keys() <= scanned, {
        started[i] for i in started.keys() - scanned}
