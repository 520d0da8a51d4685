"""The release test's scanner (:mod:`tests.release.scan`) on planted bytes, and its markers:
each form a leak can take is found, other numbers and ids are not."""

from __future__ import annotations

import io
import json
import pickle
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.release import private_table, scan
from tests.release.private_table import Markers
from tests.release.scan import Scan, allowed, scan_files

MEAN = 52298.54132080926
PLANTED_MARKERS = Markers({"id": "zqxmarker"}, {"mean": MEAN}, {"count": 1575})


def _found(text: str | bytes) -> set[str]:
    scan = Scan("test")
    if isinstance(text, str):
        scan.text("planted", text, PLANTED_MARKERS)
    else:
        scan.data("planted", text, PLANTED_MARKERS)
    return {f.marker.split(" ")[0] for f in scan.findings}


@pytest.mark.parametrize("text", [
    repr(MEAN), f"{MEAN:.6g}", f"{MEAN:.8g}", f"{MEAN:.2f}", f"{MEAN:.5e}", f"{MEAN:E}",
    json.dumps({"mean_": [MEAN]}), str(np.float32(MEAN)), f"mean={MEAN:.1f}.",
], ids=lambda t: t[:24])
def test_a_float_marker_is_found_printed_at_any_precision(text):
    assert _found(f"scaler: {text}, done") == {"mean"}


@pytest.mark.parametrize("text", [
    f"{MEAN:.5g}", f"{MEAN + 1:.2f}", f"{MEAN:.0f}", "run 52298541320809263aa", "v52298.54",
    "b7d3a1575" + "0" * 23, "12c41575-aaaa-bbbb-cccc-000000001575", "0.1575", "15750",
    "id1575",
], ids=lambda t: t[:24])
def test_other_numbers_and_ids_are_not_markers(text):
    assert _found(f"x {text} y") == set()


def test_each_form_of_marker_is_found_in_binary_files():
    buffer = io.BytesIO()
    np.savez_compressed(buffer, stats=np.array([MEAN], np.float32))  # zip, deflated
    assert _found(buffer.getvalue()) == {"mean"}
    assert _found(pickle.dumps({"mean": MEAN})) == {"mean"}  # pickle: big-endian float64
    assert _found(b"\x00\xff" + "ZQXMarker".encode("utf-16-le") + b"\x00") == {"id"}
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        zipped.writestr("inner/log.txt", "rows of group f: 1575\n")
    assert _found(archive.getvalue()) == {"count"}
    assert _found(b"\x00\x9c\xff" * 40 + b" count 1575 in a printable run \x00") == {"count"}
    assert _found(np.arange(1000, dtype=np.float64).tobytes()) == set()


def test_the_allowlist_is_readmes_private_working_state():
    assert allowed(".dpfair/ledger.sqlite") and allowed("optuna.db")
    assert allowed("loans-dpsgd-0a1b.ledger.PRIVATE.json")
    for published in ("outputs/pipeline/results.csv", "evaluation/metrics.json", "dvc.lock",
                      "data/prepared/loans/summary.json", "mlflow.db", "predictions.csv"):
        assert allowed(published) is None, published


def test_a_file_the_command_releases_is_searched_despite_the_allowlist(tmp_path):
    (tmp_path / "s.ledger.PRIVATE.json").write_text(json.dumps({"best": MEAN}))
    (tmp_path / "old.txt").write_text(f"{MEAN}")
    before = {"old.txt": ((tmp_path / "old.txt").stat().st_size,
                          (tmp_path / "old.txt").stat().st_mtime_ns)}
    private = scan_files(tmp_path, PLANTED_MARKERS, before)
    assert (private.findings, private.items, len(private.skipped)) == ([], 0, 1)
    released = scan_files(tmp_path, PLANTED_MARKERS, before, ("*.ledger.PRIVATE.json",))
    assert [f.where for f in released.findings] == ["s.ledger.PRIVATE.json"]


def test_a_copy_of_the_projects_code_is_not_searched(tmp_path, repo_root, monkeypatch):
    code = (repo_root / "dpfair" / "training" / "entropy.py").read_bytes()
    monkeypatch.setattr(scan, "CODE", set())
    scan.know_code(repo_root)
    copied = Scan("test")
    copied.data("model/code/entropy.py", code, PLANTED_MARKERS)
    blob = zlib.compress(b"blob %d\0" % len(code) + code)
    assert _found(blob + b"") == set() and copied.items == 0 and copied.skipped
    assert _found(b"\x00" + code) == set()  # not a copy: searched (and holds no marker)


def test_the_extreme_row_is_a_training_row_that_moves_mean_and_deviation():
    floats = private_table.markers(private_table.frame()).floats
    raw, clipped = (floats[f"mean of income{w}, training rows"] for w in ("", " clipped"))
    assert raw - clipped > 200  # the one row clipped to the range moves the mean by > 200
    assert floats["std (ddof 0) of income, training rows"] > 2 * floats[
        "std (ddof 0) of income clipped, training rows"]


def test_public_counts_are_not_markers():
    table = private_table.frame()
    counts = set(private_table.markers(table).counts.values())
    assert counts and not counts & set(private_table.public_counts(table).values())
    assert min(counts) >= private_table.MIN_COUNT


def test_the_markers_training_rows_are_the_loaders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    table = private_table.frame()
    table.to_csv("loans.csv", index=False)
    Path("params.yaml").write_text(yaml.safe_dump({
        "datasets": {"loans": {**private_table.OPTIONS, "path": "loans.csv"}},
        "experiment": {"dataset": "loans"}}))
    private_table.check_split_matches(table, Path("params.yaml"))


def test_a_page_is_read_as_text_and_its_embedded_files_as_bytes():
    """Four letters of a text page can spell a float32 by chance: a page is searched as text,
    and the files it embeds (base64 data URIs) as files of their own."""
    import base64
    import struct

    ascii_mean = 52081.38302259496  # the release test's mean once: its float32 is b"GKqb"
    spelled = struct.pack(">f", ascii_mean).decode("ascii")
    scan = Scan("test")
    scan.data("page", f"<p>{spelled} by chance</p>".encode(), Markers({}, {"mean": ascii_mean},
                                                                      {}))
    assert scan.findings == []
    png_like = b"\x89PNG\r\n\x1a\n" + struct.pack(">f", MEAN) + b"\x00\xff" * 8
    page = f'<img src="data:image/png;base64,{base64.b64encode(png_like).decode()}">'
    assert _found(page.encode()) == {"mean"}
