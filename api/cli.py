"""CLI commands of this package, registered on the main `planner` app by planner/cli.py.
Heavy imports stay inside the command functions so `planner plan` starts fast."""

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add this package's commands to `app`."""

    @app.command("api-key")
    def api_key_cmd(
        name: Annotated[str, typer.Argument(help="who the key is for (jobs carry the name)")],
        max_unfinished_jobs: Annotated[int | None, typer.Option(
            help="quota: queued + running jobs at once")] = None,
        max_time_limit_s: Annotated[float | None, typer.Option(
            help="cap on options.time_limit_s for this key")] = None,
        max_solver_seconds: Annotated[float | None, typer.Option(
            help="quota: solver wall time over the window (429 with Retry-After beyond)")
        ] = None,
        solver_seconds_window_s: Annotated[float | None, typer.Option(
            help="the window of --max-solver-seconds (default 3600)")] = None,
    ) -> None:
        """Make an API key: prints the key (give it to the client; it is not stored) and the
        entry to add to PLANNER_API_KEYS_FILE's "keys" (only its SHA-256). The server picks
        the change up within a second; add a second entry under a name to rotate its key."""
        import json

        from api.security import digest, new_key

        key = new_key()
        entry: dict[str, object] = {"name": name, "sha256": digest(key)}
        if max_unfinished_jobs is not None:
            entry["max_unfinished_jobs"] = max_unfinished_jobs
        if max_time_limit_s is not None:
            entry["max_time_limit_s"] = max_time_limit_s
        if max_solver_seconds is not None:
            entry["max_solver_seconds"] = max_solver_seconds
        if solver_seconds_window_s is not None:
            entry["solver_seconds_window_s"] = solver_seconds_window_s
        typer.echo(f"key:   {key}")
        typer.echo(f"entry: {json.dumps(entry)}")

    @app.command("db-upgrade")
    def db_upgrade_cmd(
        database_url: Annotated[str | None, typer.Option(
            help="postgresql://... or sqlite:///PATH (default $PLANNER_DATABASE_URL, else "
                 "$PLANNER_DB_PATH)")] = None,
        check: Annotated[bool, typer.Option(
            "--check", help="only report the schema version; exit 1 if behind")] = False,
    ) -> None:
        """Apply the service's schema migrations to its database. Migrations only add, so
        a running deployment can apply them while the previous version serves."""
        from api.migrations import LATEST
        from api.settings import ServiceSettings
        from api.store import open_store

        overrides = {"database_url": database_url} if database_url else {}
        store = open_store(ServiceSettings.from_env(**overrides), migrate=False)
        try:
            version = store.schema_version()
            if check:
                typer.echo(f"{store.kind}: schema version {version}, this code's {LATEST}")
                raise typer.Exit(0 if version >= LATEST else 1)
            applied = store.migrate()
            typer.echo(f"{store.kind}: applied {applied or 'nothing'}; schema version "
                       f"{store.schema_version()}")
        finally:
            store.close()

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
        import resource

        import uvicorn

        from api.server import uvicorn_options
        from api.settings import ServiceSettings

        # Workers are separate processes that build the app from the environment.
        if db is not None:
            os.environ["PLANNER_DB_PATH"] = str(db)
        if solvers is not None:
            os.environ["PLANNER_MAX_CONCURRENT_SOLVES"] = str(solvers)
        # Several workers: Prometheus multiprocess mode (api/metrics.py), in a directory of
        # this server's own unless PROMETHEUS_MULTIPROC_DIR names one (then wipe it between
        # runs yourself).
        made_dir = None
        if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            import tempfile

            made_dir = tempfile.mkdtemp(prefix="planner-metrics-")
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = made_dir
        # Connections are file descriptors: room for the connection cap.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        settings = ServiceSettings.from_env()
        wanted = settings.max_connections + 256
        if soft != resource.RLIM_INFINITY and soft < wanted:
            new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        try:
            uvicorn.run("api.app:create_app", factory=True, host=host, port=port,
                        workers=workers, log_level=log_level, proxy_headers=False,
                        **uvicorn_options(settings))
        finally:
            if made_dir is not None:
                import shutil

                shutil.rmtree(made_dir, ignore_errors=True)
