"""What users read never sends them to a document the repository does not ship: no DESIGN.md
in the code's messages and docstrings, the README, dvc.yaml or params.yaml."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_user_facing_text_cites_the_unshipped_design_document():
    files = [*ROOT.joinpath("dpfair").rglob("*.py"), *ROOT.joinpath("flows").rglob("*.py"),
             *ROOT.joinpath("tasks").rglob("*.py"),
             *(ROOT / name for name in ("README.md", "ARCHITECTURE.md", "dvc.yaml",
                                        "params.yaml"))]
    citing = [str(f.relative_to(ROOT)) for f in files if "DESIGN.md" in f.read_text()]
    assert not (ROOT / "DESIGN.md").exists() and citing == []
