"""Every place a result can land after a command ran, read back and searched for markers of
the private data (:class:`tests.release.private_table.Markers`).

Places (:data:`PLACES`): the MLflow store read through ``MlflowClient`` (experiments, runs'
params, tags, every logged value of every metric, dataset inputs, every artifact's bytes;
logged models' params, tags, metrics and files; registered models and their versions' tags and
descriptions), the files the command wrote under its project (outputs/, evaluation/,
data/prepared/, DVC's metrics, plots and lock, predictions, the raw bytes of the MLflow
store), Prefect's flow runs, task runs, logs and artifacts read through its API, the command's
stdout and stderr, and what a Python API returned.

How a marker is found: a string as text (any case) and as bytes; a float as any number
printed in text with at least :data:`MIN_DIGITS` significant digits that rounds from it (so
``52298.5``, ``5.22985e+04``, ``52298.54132080926`` and float32's ``52298.54`` all count) and
as its float32/float64 bytes in either byte order (numpy, torch and SQLite's big-endian REAL,
pickle's big-endian floats); a count as an integer token in text. Zip archives (``.npz``,
``.pt``, MLflow's zips), gzip and zlib streams (git's objects) are opened and searched too.
Binary files are searched as text only in their printable runs of 8 or more characters.

Not searched: pixels of figures (a PNG's text chunks are), Parquet's compressed pages.

:data:`ALLOWLIST` skips what README's release table documents as private working state; the
public counts never become markers (:func:`tests.release.private_table.public_counts`).
"""

from __future__ import annotations

import base64
import fnmatch
import gzip
import hashlib
import io
import os
import re
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path

from tests.release.private_table import Markers

PLACES = ("mlflow", "files", "prefect", "stdout", "stderr", "returned")
#: the fewest significant digits a printed number needs to count as a float marker
MIN_DIGITS = 6
#: README "What dpfair releases and what ε covers": private working state, never published
#: (a file matching one of these globs, relative to the project, is not searched)
ALLOWLIST = {
    ".dpfair/*": "the privacy ledger (budget.ledger): private working state",
    "optuna.db": "the Optuna storage: private working state (K, every trial and score)",
    "*.ledger.PRIVATE.json": "the search's private ledger beside the Optuna storage",
    "data/prepared/*/arrays.npz": "the private data itself, prepared (DVC output, an input)",
    "*__pycache__/*.pyc": "Python's bytecode of the project's code (its code, not a result)",
    ".dvc/cache/*": "DVC's cache: copies of the private data and of the outputs searched "
                    "in the work tree",
}
#: sha256 of every file of the project's code (dpfair, flows, tasks): a copy of one (a model's
#: ``code_paths``, a git object of the code) is code, not a result (:func:`know_code`)
CODE: set[str] = set()
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?!\w)")
#: run ids, uuids and digests: hex, never numbers (masked before numbers are read)
_HEX_ID = re.compile(r"\b[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b"
                     r"|\b[0-9a-fA-F]{16,}\b")
_PRINTABLE = re.compile(rb"[\x20-\x7e\t\n\r]{8,}")
_DATA_URI = re.compile(r"data:[\w/+.-]+;base64,([A-Za-z0-9+/=]+)")


@dataclass(frozen=True)
class Finding:
    place: str
    where: str
    marker: str
    excerpt: str

    def __str__(self) -> str:
        return f"{self.place}: {self.where}: {self.marker}: ...{self.excerpt}..."


@dataclass
class Scan:
    """What one place held: the findings, and how many items were read (a scan that read
    nothing proves nothing: tests assert ``items``)."""

    place: str
    findings: list[Finding] = field(default_factory=list)
    items: int = 0
    skipped: list[str] = field(default_factory=list)
    read: list[str] = field(default_factory=list)

    def text(self, where: str, text: str, markers: Markers) -> None:
        self.items += 1
        self.read.append(where)
        self.findings += _in_text(self.place, where, text, markers)

    def data(self, where: str, data: bytes, markers: Markers) -> None:
        if hashlib.sha256(data).hexdigest() in CODE:
            self.skipped.append(f"{where} (a copy of the project's code)")
            return
        self.items += 1
        self.read.append(where)
        self.findings += _in_bytes(self.place, where, data, markers)


def _excerpt(text: str, start: int, end: int) -> str:
    return text[max(0, start - 40):end + 40].replace("\n", " ")


def _digits(token: str) -> tuple[int, float] | None:
    """(significant digits, half the unit of the last digit) of a printed number."""
    try:
        sign, digits, exponent = Decimal(token).as_tuple()
    except InvalidOperation:
        return None
    if not isinstance(exponent, int) or not -300 < exponent + len(digits) < 300:
        return None
    significant = len("".join(map(str, digits)).lstrip("0"))
    return significant, 0.5 * 10.0 ** exponent


def _in_text(place: str, where: str, text: str, markers: Markers) -> list[Finding]:
    found = []
    lower = text.lower()
    for name, marker in markers.strings.items():
        at = lower.find(marker.lower())
        if at >= 0:
            found.append(Finding(place, where, f"{name} {marker!r}",
                                 _excerpt(text, at, at + len(marker))))
    masked = _HEX_ID.sub(lambda m: "#" * len(m.group()), text)
    for match in _NUMBER.finditer(masked):
        token = match.group()
        shape = _digits(token)
        if shape is None:
            continue
        significant, half_unit = shape
        value = float(token)
        if "." not in token and "e" not in token.lower():
            for name, count in markers.counts.items():
                if int(token.lstrip("+")) == count:
                    found.append(Finding(place, where, f"{name} ({count})",
                                         _excerpt(text, *match.span())))
        if significant < MIN_DIGITS:
            continue
        for name, marker in markers.floats.items():
            # printed from float64, or from float32 (whose shortest repr rounds further)
            if abs(value - marker) <= max(half_unit, abs(marker) * 6e-8) * (1 + 1e-12):
                found.append(Finding(place, where, f"{name} ({marker!r})",
                                     _excerpt(text, *match.span())))
    return found


def _float_bytes(value: float) -> dict[str, bytes]:
    return {f"{kind} {order}": struct.pack(f"{'<' if order == 'LE' else '>'}{code}", value)
            for kind, code in (("float64", "d"), ("float32", "f")) for order in ("LE", "BE")}


def _opened(data: bytes) -> Iterator[tuple[str, bytes]]:
    """The members of a zip archive, or the content of a gzip or zlib stream."""
    if data[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                for info in archive.infolist():
                    if not info.is_dir():
                        yield f"!{info.filename}", archive.read(info)
        except (zipfile.BadZipFile, OSError, EOFError):
            return
    elif data[:2] == b"\x1f\x8b":
        try:
            yield "!gunzip", gzip.decompress(data)
        except (OSError, EOFError):
            return
    elif data[:1] == b"\x78" and data[1:2] in (b"\x01", b"\x5e", b"\x9c", b"\xda"):
        try:
            inflated = zlib.decompress(data)
        except zlib.error:
            return
        if inflated.startswith(b"blob "):  # a git object: its header, then the file
            inflated = inflated[inflated.index(b"\0") + 1:]
            if hashlib.sha256(inflated).hexdigest() in CODE:
                return
        yield "!inflate", inflated


def _in_bytes(place: str, where: str, data: bytes, markers: Markers) -> list[Finding]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        # a text file holds numbers as text, never as raw float bytes (four letters of a page
        # can spell a float32 by chance); the files it embeds (base64 data URIs) are read whole
        found = _in_text(place, where, text, markers)
        for i, embedded in enumerate(_DATA_URI.finditer(text)):
            found += _in_bytes(place, f"{where}!data-uri{i}",
                               base64.b64decode(embedded.group(1)), markers)
        return found
    # binary: strings as bytes, numbers in its printable runs and as float bytes
    lower = data.lower()
    found = [Finding(place, where, f"{name} {marker!r}", "(bytes)")
             for name, marker in markers.strings.items()
             if marker.lower().encode() in lower
             or marker.lower().encode("utf-16-le") in lower]
    for run in _PRINTABLE.finditer(data):
        found += [f for f in _in_text(place, where, run.group().decode("ascii"), markers)
                  if not f.marker.startswith(tuple(markers.strings))]
    for name, value in markers.floats.items():
        for kind, pattern in _float_bytes(value).items():
            if pattern in data:
                found.append(Finding(place, where, f"{name} ({value!r}) as {kind} bytes",
                                     "(bytes)"))
    for member, content in _opened(data):
        found += _in_bytes(place, where + member, content, markers)
    return found


# -- the places ---------------------------------------------------------------------------

def know_code(repo_root: Path) -> None:
    """Record the project's code (:data:`CODE`): its copies are skipped, by content."""
    for package in ("dpfair", "flows", "tasks"):
        CODE.update(hashlib.sha256(p.read_bytes()).hexdigest()
                    for p in (repo_root / package).rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts)


def allowed(relative: str) -> str | None:
    """The README reason a project file is private working state (None: search it)."""
    for pattern, reason in ALLOWLIST.items():
        if fnmatch.fnmatch(relative, pattern):
            return reason
    return None


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file under ``root``: what a command found there."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file()}


def scan_files(root: Path, markers: Markers, before: dict[str, tuple[int, int]],
               released: tuple[str, ...] = ()) -> Scan:
    """Every file the command created or changed under its project ``root``: not the
    :data:`ALLOWLIST`, except the files matching ``released`` (what the command publishes)."""
    scan = Scan("files")
    for relative, stamp in sorted(snapshot(root).items()):
        if before.get(relative) == stamp:
            continue
        released_here = any(fnmatch.fnmatch(relative, p) for p in released)
        if not released_here and (reason := allowed(relative)) is not None:
            scan.skipped.append(f"{relative} ({reason})")
            continue
        scan.data(relative, (root / relative).read_bytes(), markers)
    return scan


def _lines(values: dict) -> str:
    return "\n".join(f"{k}={v!r}" for k, v in sorted(values.items()))


def _tree(scan: Scan, where: str, folder: Path, markers: Markers) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            scan.data(f"{where}/{path.relative_to(folder)}", path.read_bytes(), markers)


def scan_mlflow(uri: str, markers: Markers) -> Scan:
    """The whole MLflow store at ``uri`` through ``MlflowClient``."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    scan = Scan("mlflow")
    client = MlflowClient(uri)
    experiments = client.search_experiments(view_type=ViewType.ALL)
    for exp in experiments:
        scan.text(f"experiment {exp.name!r} tags", f"{exp.name}\n{_lines(exp.tags)}", markers)
        for run in client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL,
                                      max_results=10_000):
            name = f"run {run.info.run_name!r}"
            scan.text(f"{name} params", _lines(run.data.params), markers)
            scan.text(f"{name} tags", _lines(run.data.tags), markers)
            history = [f"{key}[{m.step}]={m.value!r}" for key in sorted(run.data.metrics)
                       for m in client.get_metric_history(run.info.run_id, key)]
            scan.text(f"{name} metrics", "\n".join(history), markers)
            for item in run.inputs.dataset_inputs:
                ds = item.dataset
                scan.text(f"{name} dataset input {ds.name!r}", "\n".join(
                    [ds.name, ds.digest, ds.source_type, ds.source, ds.schema or "",
                     ds.profile or "", _lines({t.key: t.value for t in item.tags})]), markers)
            with tempfile.TemporaryDirectory() as tmp:
                if client.list_artifacts(run.info.run_id):
                    mlflow.artifacts.download_artifacts(run_id=run.info.run_id, dst_path=tmp,
                                                        tracking_uri=uri)
                    _tree(scan, f"{name} artifact", Path(tmp), markers)
        for model in client.search_logged_models([exp.experiment_id]):
            name = f"logged model {model.name!r}"
            scan.text(f"{name} params, tags, metrics", "\n".join(
                [_lines(model.params), _lines(model.tags),
                 *(f"{m.key}={m.value!r}" for m in model.metrics or [])]), markers)
            with tempfile.TemporaryDirectory() as tmp:
                mlflow.artifacts.download_artifacts(artifact_uri=model.artifact_location,
                                                    dst_path=tmp, tracking_uri=uri)
                _tree(scan, f"{name} file", Path(tmp), markers)
    for registered in client.search_registered_models():
        name = f"registered model {registered.name!r}"
        scan.text(name, f"{registered.description or ''}\n{_lines(registered.tags)}", markers)
        for version in client.search_model_versions(f"name = '{registered.name}'"):
            scan.text(f"{name} version {version.version}", "\n".join(
                [version.description or "", version.source or "", _lines(version.tags)]),
                markers)
    return scan


def flow_runs(seeds: Iterable[str]) -> list:
    """The flow runs ``seeds`` (ids), their parents and their subflows, through Prefect's API."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterParentFlowRunId,
    )

    with get_client(sync_client=True) as client:
        runs = {r.id: r for r in client.read_flow_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[UUID(s) for s in seeds])))} if seeds else {}
        while True:
            parents = {client.read_task_run(r.parent_task_run_id).flow_run_id
                       for r in runs.values() if r.parent_task_run_id} - runs.keys()
            found = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=list(parents)))) if parents else []
            found += client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=list(runs))))
            new = {r.id: r for r in found if r.id not in runs}
            if not new:
                return list(runs.values())
            runs.update(new)


def flow_runs_between(since: datetime, until: datetime) -> list:
    """Every flow run that started between ``since`` and ``until``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterStartTime

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            start_time=FlowRunFilterStartTime(after_=since, before_=until)))


def scan_prefect(runs: list, markers: Markers) -> Scan:
    """Flow runs ``runs`` (:func:`flow_runs`): names, parameters, tags and states, their task
    runs, logs and artifacts, through the API of the current Prefect settings."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )

    scan = Scan("prefect")
    ids = [r.id for r in runs]
    for r in runs:
        scan.text(f"flow run {r.name!r}", "\n".join(
            [r.name, _lines(r.parameters), " ".join(r.tags),
             (r.state.message or "") if r.state else ""]), markers)
    if not ids:
        return scan
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
        for t in tasks:
            scan.text(f"task run {t.name!r}", "\n".join(
                [t.name, " ".join(t.tags), (t.state.message or "") if t.state else ""]), markers)
        offset, logs = 0, []
        while batch := client.read_logs(log_filter=LogFilter(
                flow_run_id=LogFilterFlowRunId(any_=ids)), limit=200, offset=offset):
            logs += batch
            offset += len(batch)
        if logs:
            scan.text(f"logs ({len(logs)} lines)", "\n".join(log.message for log in logs),
                      markers)
        for artifact in client.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=ids))):
            scan.text(f"artifact {artifact.key!r}", "\n".join(
                [artifact.key or "", artifact.description or "", str(artifact.data)]), markers)
    return scan


def scan_stream(name: str, text: str, markers: Markers) -> Scan:
    scan = Scan(name)
    scan.text(name, text, markers)
    return scan


def scan_returned(what: str, data: bytes, markers: Markers) -> Scan:
    """What a Python API returned, pickled (the caller's to publish)."""
    scan = Scan("returned")
    scan.data(what, data, markers)
    return scan


def report(findings: Iterable[Finding]) -> str:
    return "\n".join(map(str, findings))
