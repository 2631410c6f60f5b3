"""A real server for the API tests: uvicorn in its own process group on a loopback port,
started and killed by the tests themselves (nothing is left running)."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from planner.presets import fixture_text

if TYPE_CHECKING:
    from tests.api.pg import PgServer

REPO = Path(__file__).resolve().parents[2]
API_KEY = "test-key-1234"
START_TIMEOUT_S = 90.0  # generous: the shared 2-core box is often loaded


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiveServer:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (server and solver workers), then reap it."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        # Solver workers are in the same group: make sure none outlives the server.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def start_server(tmp: Path, db: Path, workers: int = 1, **env: Any) -> LiveServer:
    """`planner serve` on a free loopback port (`workers` uvicorn workers); returns once
    /readyz says ready."""
    port = free_port()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
    full_env |= {"PLANNER_DB_PATH": str(db), "PLANNER_MAX_CONCURRENT_SOLVES": "1",
                 "PLANNER_LEASE_TTL_S": "2", "PLANNER_LEASE_RENEW_S": "0.4"}
    full_env |= {f"PLANNER_{k.upper()}": str(v) for k, v in env.items()}
    log = tmp / f"server-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "planner.cli", "serve", "--host", "127.0.0.1", "--port",
             str(port), "--log-level", "warning", "--workers", str(workers)],
            cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    server = LiveServer(f"http://127.0.0.1:{port}", proc, log)
    _STARTED.append(server)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {log.read_text()[-3000:]}")
            try:
                if httpx.get(server.url + "/readyz", timeout=1.0).status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready in {START_TIMEOUT_S} s: {log.read_text()[-3000:]}")
    except BaseException:  # Ctrl-C while it starts too: the caller never got it to kill
        server.kill()
        raise


# Every server started, killed at the end of the session whatever happened (Ctrl-C between
# a start and the test's own `finally` included).
_STARTED: list[LiveServer] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for server in _STARTED:
        server.kill()
    _STARTED.clear()


def fixture_model(name: str) -> dict[str, Any]:
    model: dict[str, Any] = json.loads(fixture_text(name))
    return model


def long_request(**options: Any) -> dict[str, Any]:
    """A solve the service tests stop mid-way (cancel, kill, job timeout): zionex_12t on 2
    hosts, about 16 s here. hugectr_510 on one host served until the partitioner got faster
    (2-3 s), when jobs began to finish before their DELETE or the 2 s job timeout."""
    return {"model": fixture_model("zionex_12t"), "hardware": {"preset": "h100", "hosts": 2},
            "options": options}


def small_request(hosts: int = 1, **options: Any) -> dict[str, Any]:
    return {"model": fixture_model("criteo_kaggle"),
            "hardware": {"preset": "h100", "hosts": hosts}, "options": options}


def wait_job(client: httpx.Client, job_id: str, timeout_s: float,
             until: tuple[str, ...] = ("succeeded", "infeasible", "no_plan_found", "bad_input",
                                      "failed"),
             ) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in until or time.monotonic() > deadline:
            return job
        time.sleep(0.05)


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server for the functional tests: an API key and small limits, so every limit can
    be hit with a small request."""
    tmp = tmp_path_factory.mktemp("live")
    server = start_server(tmp, tmp / "plans.sqlite3", api_key=API_KEY,
                          max_body_bytes=2 * 2**20, max_tables=300, max_gpus=256,
                          max_time_limit_s=120, sync_wait_s=20)
    try:
        yield server
    finally:
        server.kill(signal.SIGTERM)


@pytest.fixture
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, headers={"X-API-Key": API_KEY}, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def pg_server() -> Iterator["PgServer"]:
    """One PostgreSQL cluster for the session (each test takes its own database)."""
    from tests.api.pg import SKIP_REASON, pg_bin_dir, postgres_server

    if pg_bin_dir() is None:
        pytest.skip(SKIP_REASON)
    with postgres_server() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: "PgServer") -> str:
    return pg_server.new_database()
