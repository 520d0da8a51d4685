"""`dvc exp run -S key=value` rewrites params.yaml through DVC's own override code: the file is
kept in the format that code writes, so an experiment's diff is the values it changed."""

from __future__ import annotations

import shutil
from pathlib import Path

from dvc.utils.hydra import apply_overrides

ROOT = Path(__file__).resolve().parents[2]


def _changed(tmp_path: Path, *overrides: str) -> list[tuple[str, str]]:
    copy = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", copy)
    apply_overrides(copy, list(overrides))
    before, after = (ROOT / "params.yaml").read_text(), copy.read_text()
    assert len(before.splitlines()) == len(after.splitlines()), after
    return [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True)
            if a != b]


def test_dvc_set_changes_only_the_values_it_sets(tmp_path):
    assert _changed(tmp_path, "experiment.seeds=[0,1]") == []  # the same value: no diff
    changed = _changed(tmp_path, "experiment.train.epochs=3", "budget.epsilon=4.0")
    assert [b.split("#")[0].strip() for _, b in changed] == ["epochs: 3", "epsilon: 4.0"]
