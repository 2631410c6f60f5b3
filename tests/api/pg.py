"""A real PostgreSQL server for the tests: Debian's `postgresql` binaries, a cluster made by
initdb in a temporary directory, listening on a free loopback port, stopped (immediate mode)
and deleted by the tests themselves. PostgreSQL refuses to run as root: as root the cluster
belongs to the `postgres` user and is run through runuser."""

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 30


def pg_bin_dir() -> Path | None:
    """The newest PostgreSQL's bin directory with initdb, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name)
                   if Path(p).parent.parent.name.isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


SKIP_REASON = ("PostgreSQL binaries not found (/usr/lib/postgresql/*/bin/initdb): install "
               "Debian's `postgresql` package (scripts/setup.sh does as root; CI does)")


def _as_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError as exc:
        raise RuntimeError("running as root and there is no `postgres` user to run "
                           "PostgreSQL as") from exc
    return ["runuser", "-u", "postgres", "--"]


@dataclass
class PgServer:
    root: Path
    port: int
    bin: Path
    as_user: list[str]

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, db: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        subprocess.run([*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.root / "data"),
                        "-m", "immediate", "-w", "-t", "20", "stop"],
                       capture_output=True, timeout=30, check=False)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def postgres_server() -> Iterator[PgServer]:
    """initdb + pg_ctl start on a free loopback port; stopped and removed on exit."""
    bindir = pg_bin_dir()
    if bindir is None:
        raise FileNotFoundError(SKIP_REASON)
    as_user = _as_user()
    root = Path(tempfile.mkdtemp(prefix="planner-pg-"))
    if as_user:
        shutil.chown(root, user="postgres")
    port = free_port()
    server = PgServer(root, port, bindir, as_user)
    try:
        subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(root / "data"), "-A",
                        "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"],
                       check=True, capture_output=True, timeout=60)
        # fsync off and small memory: a test cluster on a shared 2-core machine.
        opts = (f"-h 127.0.0.1 -p {port} -k {root} -F -c max_connections=200 "
                "-c shared_buffers=32MB -c synchronous_commit=off")
        started = subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(root / "data"), "-o", opts, "-l",
             str(root / "log"), "-w", "-t", str(START_TIMEOUT_S), "start"],
            capture_output=True, timeout=START_TIMEOUT_S + 10, check=False)
        if started.returncode != 0:
            log = (root / "log").read_text() if (root / "log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {started.stderr.decode()} {log}")
        deadline = time.monotonic() + START_TIMEOUT_S
        import psycopg

        while True:
            try:
                psycopg.connect(server.admin_url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
