"""The command line: click's options, help and exit statuses over the rest."""

from once.cli.main import main

__all__ = ["main"]
