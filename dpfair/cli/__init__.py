"""The command line (edge layer): ``dpfair`` and its commands (:mod:`dpfair.cli.commands`),
the console (:mod:`dpfair.cli.base`), ``dpfair data`` and the one error boundary.

``dpfair.cli:app`` is the console script's entry point; it is loaded on first use, so
importing a module of this package loads no command.
"""

from dpfair.lazy import lazy_getattr

__all__ = ["app"]

__getattr__ = lazy_getattr(__name__, {"app": "commands"})
