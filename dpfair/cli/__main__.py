"""``python -m dpfair.cli``: the ``dpfair`` command."""

from dpfair.cli.commands import app

app()
