"""What users and contributors read never sends them to a document the repository does not ship:
no DESIGN.md or STYLE.md in the code's messages and docstrings, the tests, the benchmarks, the
README, ARCHITECTURE.md, dvc.yaml or params.yaml."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNSHIPPED = ("DESIGN.md", "STYLE.md")


def test_no_text_cites_a_document_the_repository_does_not_ship():
    files = [path for folder in ("dpfair", "flows", "tasks", "tests", "benchmarks")
             for path in ROOT.joinpath(folder).rglob("*.py") if path != Path(__file__).resolve()]
    files += [*ROOT.glob("*.md"), ROOT / "benchmarks" / "README.md", ROOT / "dvc.yaml",
              ROOT / "params.yaml"]
    citing = [f"{f.relative_to(ROOT)}: {name}" for f in files for name in UNSHIPPED
              if name in f.read_text(encoding="utf-8")]
    assert not any((ROOT / name).exists() for name in UNSHIPPED) and citing == []


def test_the_longest_first_files_exist():
    """A renamed or removed file in tests/conftest.py's schedule would silently start late."""
    from tests.conftest import LONGEST_FIRST, REPO_ROOT

    assert [name for name in LONGEST_FIRST if not (REPO_ROOT / name).is_file()] == []
