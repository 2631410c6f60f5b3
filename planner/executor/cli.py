"""CLI commands of this package, registered on the main `planner` app by planner/cli.py.
Heavy imports stay inside the command functions so `planner plan` starts fast."""

import typer


def register(app: typer.Typer) -> None:
    """Add this package's commands to `app`."""
