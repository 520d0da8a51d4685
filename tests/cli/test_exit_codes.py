"""Exit codes exactly as the README's table says (issue 43): the README, `dpfair --help` and
the error boundary name the same codes, and each kind of failure gets its code."""

from __future__ import annotations

import errno
import re

import pytest
from typer.testing import CliRunner

from dpfair.cli import error_boundary
from dpfair.cli.commands import app
from dpfair.errors import BudgetExceededError, ConfigError, DataError, UnreachableError

CODES = {0: None, 1: error_boundary.EXIT_BUG, 2: error_boundary.EXIT_USAGE,
         3: error_boundary.EXIT_BUDGET, 4: error_boundary.EXIT_UNREACHABLE,
         5: error_boundary.EXIT_VIOLATION}


def test_the_readme_the_help_and_the_boundary_name_the_same_codes(repo_root):
    readme = (repo_root / "README.md").read_text()
    table = readme[readme.index("Exit codes: "):].split("\n\n")[0].split("\nA `postgresql")[0]
    assert [int(c) for c in re.findall(r"`(\d)`", table)] == list(CODES)
    assert all(code == value for value, code in CODES.items() if code is not None)
    shown = " ".join(CliRunner().invoke(app, ["--help"]).output.split())
    listed = shown[shown.index("Exit codes: "):]
    assert [int(c) for c in re.findall(r"(?:: |, )(\d) ", listed)] == list(CODES), listed


@pytest.mark.parametrize(("error", "code"), [
    (BudgetExceededError("over budget"), 3),
    (UnreachableError("tracking server http://x:5000 could not be reached"), 4),
    (PermissionError(errno.EACCES, "Permission denied", "/srv/out/preds.csv"), 4),
    (OSError(errno.EROFS, "Read-only file system", "/mnt/ro/evaluation"), 4),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "rows.csv"), 2),
    (IsADirectoryError(errno.EISDIR, "Is a directory", "data"), 2),
    (ConfigError("experiment.seeds: not a list"), 2), (DataError("no rows"), 2)])
def test_each_kind_of_failure_gets_the_readmes_code(error, code):
    assert error_boundary.describe_failure(error) is not None  # one message, no traceback
    assert error_boundary.exit_code(error) == code


def test_a_missing_parameters_file_and_a_mistyped_option_are_bad_input(tmp_path):
    done = CliRunner().invoke(app, ["results", "--params", str(tmp_path / "nope.yaml")])
    assert done.exit_code == 2, done.output
    assert CliRunner().invoke(app, ["results", "--ful"]).exit_code == 2
