"""The command line: ``mlxspec serve`` and its flags."""

from mlxspec.cli.main import main

__all__ = ["main"]
