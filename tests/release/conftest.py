"""The release test's commands, run once per module in two lanes (flows one after another, so
each Prefect scan sees only its own flow runs; the other commands beside them), and their
scans, read once per command and place."""

from __future__ import annotations

import os
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from tests.release import commands, private_table, scan

# as tests/flows/conftest.py: Prefect's home in a temp dir (kept if that conftest set it)
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="dpfair-prefect-home-"))
from tests.release.commands import BY_NAME, Outcome

#: README "Where the results are": the MLflow parent run's tag naming its Prefect flow run
PREFECT_RUN_TAG = "dpfair.prefect_flow_run_id"
#: two lanes in parallel (2 cores; more only makes them wait on each other), each one command
#: after another, balanced by their times; a lane's later commands may use an earlier one's
#: project (predict and results read what run logged)
LANES = (("run", "predict", "results", "results --full", "retrain", "tune all_trials", "fit",
          "train fitted"),
         ("dvc exp run", "train", "tune selected", "audit", "fit undeclared", "data prepare",
          "train with a planted leak"))
_RELEASES: list[Release] = []


class Release:
    """The outcomes of the selected commands and their scans (cached)."""

    def __init__(self, base: Path, repo_root: Path, env: dict[str, str]) -> None:
        self.base, self.repo_root, self.env = base, repo_root, env
        self.outcomes: dict[str, Outcome] = {}
        self.scans: dict[tuple[str, str], scan.Scan] = {}
        self.markers = private_table.markers(private_table.frame())
        self._done = {name: threading.Event() for name in BY_NAME}
        self._errors: list[BaseException] = []

    def _run(self, name: str) -> None:
        command = BY_NAME[name]
        try:
            if command.project is not None:
                self._done[command.project].wait()
                root = self.outcomes[command.project].root
            else:
                root = commands.make_project(self.base / name.replace(" ", "_"),
                                             self.repo_root, command)
            self.outcomes[name] = commands.finish(*commands.start(command, root, self.env))
        except BaseException as exc:  # raised by run_all, in the test's thread
            self._errors.append(exc)
        finally:
            self._done[name].set()

    def run_all(self, names: set[str]) -> None:
        needed = names | {BY_NAME[n].project for n in names if BY_NAME[n].project}
        assert {n for lane in LANES for n in lane} == set(BY_NAME), "every command in a lane"
        lanes = [threading.Thread(target=lambda lane=lane: [self._run(n) for n in lane
                                                            if n in needed])
                 for lane in LANES]
        for lane in lanes:
            lane.start()
        for lane in lanes:
            lane.join()
        if self._errors:
            raise self._errors[0]

    def scan(self, name: str, place: str) -> scan.Scan:
        if (name, place) not in self.scans:
            self.scans[name, place] = self._scan(name, place)
        return self.scans[name, place]

    def flow_runs(self, name: str) -> list:
        """The flow runs of command ``name``: those its MLflow runs name (README: the parent
        run's ``dpfair.prefect_flow_run_id``) and its script reported, their parents and
        subflows."""
        from mlflow import MlflowClient

        outcome = self.outcomes[name]
        client = MlflowClient(outcome.tracking_uri)
        tagged = [run.data.tags[PREFECT_RUN_TAG]
                  for exp in client.search_experiments()
                  for run in client.search_runs([exp.experiment_id])
                  if PREFECT_RUN_TAG in run.data.tags]
        return scan.flow_runs([*tagged, *outcome.flow_runs])

    def _scan(self, name: str, place: str) -> scan.Scan:
        outcome, markers = self.outcomes[name], self.markers
        if place == "mlflow":
            found = scan.scan_mlflow(outcome.tracking_uri, markers)
        elif place == "files":
            found = scan.scan_files(outcome.root, markers, outcome.before,
                                    outcome.command.releases)
        elif place == "prefect":
            found = scan.scan_prefect(self.flow_runs(name), markers)
            home = scan.scan_files(outcome.prefect_home, markers, {})
            found.findings += [replace(f, where=f"PREFECT_HOME/{f.where}", place="prefect")
                               for f in home.findings]
            found.items += home.items
        elif place in ("stdout", "stderr"):
            found = scan.scan_stream(place, getattr(outcome, place), markers)
        else:
            found = scan.scan_returned(name, outcome.returned or b"", markers)
        project = outcome.command.project
        if project is not None and place == "mlflow":  # what the project's command left
            earlier = {(f.where, f.marker) for f in self.scan(project, place).findings}
            found.findings = [f for f in found.findings if (f.where, f.marker) not in earlier]
        return found


def _selected(session: pytest.Session, module: str) -> set[str]:
    return {item.callspec.params["command"] for item in session.items
            if item.path.name == module and hasattr(item, "callspec")
            and "command" in item.callspec.params}


@pytest.fixture(scope="module")
def release(request, prefect_api, tmp_path_factory, repo_root):
    """Every command this module's selected tests name, run once."""
    scan.know_code(repo_root)
    env = commands.environment(prefect_api)
    found = Release(tmp_path_factory.mktemp("release"), repo_root, env)
    found.run_all(_selected(request.session, request.path.name))
    _RELEASES.append(found)
    return found


def pytest_terminal_summary(terminalreporter):
    """How long each command ran (the suite's cost, for whoever adds one)."""
    if _RELEASES:
        lines = [f"{name}: {o.seconds:.0f} s" for r in _RELEASES for name, o in r.outcomes.items()]
        terminalreporter.write_line("release test commands: " + "; ".join(lines))
