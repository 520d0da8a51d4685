"""Every line the error boundary prints fits 120 columns (issue 43): a long message is wrapped
between words, a path longer than a line stands whole on its own line, the text is unchanged
but for the line breaks; short messages are printed as they are."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from dpfair.cli.console import WIDTH, fit
from dpfair.cli.error_boundary import cli_errors
from dpfair.errors import BudgetExceededError, DataError

LONG_PATH = "/home/someone/projects/" + "a-rather-deep-folder/" * 7 + "loans.csv"
MESSAGE = (f"data error in {LONG_PATH}: the column 'Antrag' holds dates (e.g. '2024-01-01'), "
           "which are neither numbers nor categories\nfix: leave it out of features: in "
           "params.yaml, or derive numbers from it (days since a date, the month) in a column "
           "of its own; then declare that column's public range under numeric_ranges, as "
           "every numeric feature is declared")


def _run(error: Exception) -> tuple[int, str]:
    demo = typer.Typer()

    @demo.command()
    @cli_errors
    def go() -> None:
        raise error

    @demo.command()
    def other() -> None:  # a second command: typer then expects the command's name
        """Unused."""

    done = CliRunner().invoke(demo, ["go"])
    return done.exit_code, done.output


def test_a_long_error_message_is_wrapped_within_120_columns_and_keeps_its_words():
    code, output = _run(DataError(MESSAGE))
    assert code == 2
    lines = output.splitlines()
    assert all(len(line) <= WIDTH or line.strip() == LONG_PATH + ":" for line in lines), output
    assert any(line.strip() == LONG_PATH + ":" for line in lines)  # whole, on its own line
    assert output.split() == f"data error: {MESSAGE}".split()
    assert lines[0].startswith("data error: ") and any(line.startswith("fix: ") for line in lines)


def test_a_short_error_message_is_printed_as_it_is_and_keeps_its_exit_code():
    code, output = _run(BudgetExceededError("over budget\n  dpsgd: ε 9.1 > 8.0\nfix: raise it"))
    assert code == 3
    assert output == "budget refused: over budget\n  dpsgd: ε 9.1 > 8.0\nfix: raise it\n"


def test_fit_keeps_a_wrapped_lines_indentation():
    line = "    " + " ".join(["word"] * 60)
    wrapped = fit(line).splitlines()
    assert len(wrapped) > 1 and all(w.startswith("    word") for w in wrapped)
    assert all(len(w) <= WIDTH for w in wrapped) and fit("short") == "short"


def test_the_registered_model_line_fits_120_columns_with_a_long_name(capsys):
    """The line of a registered challenger (about 150 columns in the issue): its text wrapped,
    the predict command on lines of its own, the promote command on the last."""
    from dpfair.cli.console import print_registered

    name = "dpfair-" + "loans-of-the-northern-region-" * 2
    print_registered({"name": name, "version": "12", "champion": "3"})
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= WIDTH for line in lines), lines
    assert lines[2:4] == [f"  dpfair predict --model {name} \\",
                          "    --input rows.csv --output preds.csv"]
    assert lines[-1] == f"to serve it as @champion: dpfair promote {name} 12"
