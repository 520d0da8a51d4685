"""The command line (edge layer): ``dpfair`` and its commands (:mod:`dpfair.cli.commands`),
the console (:mod:`dpfair.cli.console`), ``dpfair data`` and the one error boundary.

``dpfair.cli:main`` is the console script's entry point (``python -m dpfair.cli`` too);
``dpfair.cli:app``, the typer app it runs, is loaded on first use, so importing a module of this
package loads no command.
"""

from dpfair.lazy import lazy_getattr

__all__ = ["app", "main"]

__getattr__ = lazy_getattr(__name__, {"app": "commands"})


def main() -> None:
    """The ``dpfair`` command: :data:`app` in a process that ends with it, so a refused check
    ends quickly (:func:`dpfair.cli.console.checking`)."""
    from dpfair.cli.commands import app
    from dpfair.cli.console import ends_with_command

    ends_with_command()
    app()
