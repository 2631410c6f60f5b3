"""CLI commands of this package, registered on the main `planner` app by planner/cli.py.
Heavy imports stay inside the command functions so `planner plan` starts fast."""

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add this package's commands to `app`."""

    @app.command("serve")
    def serve_cmd(
        host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="port to bind (0: any free port)")] = 8000,
        workers: Annotated[int, typer.Option(help="uvicorn worker processes")] = 1,
        db: Annotated[Path | None, typer.Option(
            help="SQLite file for plans and jobs (default $PLANNER_DB_PATH or "
                 "./planner-service.sqlite3)")] = None,
        solvers: Annotated[int | None, typer.Option(
            help="concurrent solves per worker (default $PLANNER_MAX_CONCURRENT_SOLVES or "
                 "CPUs - 1)")] = None,
        log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
    ) -> None:
        """Run the HTTP service (uvicorn). Limits and the API key come from PLANNER_*
        variables; see the README."""
        import os

        import uvicorn

        # Workers are separate processes that build the app from the environment.
        if db is not None:
            os.environ["PLANNER_DB_PATH"] = str(db)
        if solvers is not None:
            os.environ["PLANNER_MAX_CONCURRENT_SOLVES"] = str(solvers)
        uvicorn.run("api.app:create_app", factory=True, host=host, port=port, workers=workers,
                    log_level=log_level, proxy_headers=False)
