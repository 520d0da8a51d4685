"""``python -m dpfair.cli``: the ``dpfair`` command."""

from dpfair.cli import main

main()
