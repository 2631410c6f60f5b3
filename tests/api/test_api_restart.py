"""Stop the server in the middle of a job and start it again: finished plans are still served,
the interrupted job is re-run (status and note say so): after a kill -9 once its lease has
expired, after a SIGTERM at once (the stopping server gives it back); interrupted again, it
is failed with the reason, and asking for it again re-runs it (here into the per-request
time limit)."""

import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import (
    LiveServer,
    long_request,
    small_request,
    start_server,
    wait_job,
)

LONG_REQUEST = long_request()


def _kill_while_running(server: LiveServer, client: httpx.Client, job_id: str,
                        attempt: int, sig: signal.Signals) -> dict[str, Any]:
    # A job still leased by a killed server reads "running" with the old attempt count until
    # the lease expires and this server claims it: wait for this attempt's claim.
    deadline = time.monotonic() + 60
    while True:
        job = wait_job(client, job_id, 60, until=("running", "succeeded", "failed"))
        if job["status"] != "running" or job["attempts"] >= attempt:
            break
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    assert job["status"] == "running" and job["attempts"] == attempt, job
    server.kill(sig)
    return job


@pytest.mark.timeout(180)
def test_restart_mid_job(tmp_path: Path) -> None:
    db = tmp_path / "restart.sqlite3"
    first = start_server(tmp_path, db, sync_wait_s=30)
    try:
        with httpx.Client(base_url=first.url, timeout=60) as c:
            done = c.post("/v1/plans", json=small_request())
            assert done.status_code == 201, done.text
            plan_id = done.headers["X-Job-Id"]
            r = c.post("/v1/plans", params={"mode": "async"}, json=LONG_REQUEST)
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]
            # SIGKILL: no shutdown hook runs, the store must cope on its own.
            _kill_while_running(first, c, job_id, attempt=1, sig=signal.SIGKILL)
    finally:
        first.kill()

    second = start_server(tmp_path, db)
    try:
        with httpx.Client(base_url=second.url, timeout=60) as c:
            served = c.get(f"/v1/plans/{plan_id}")
            assert served.status_code == 200 and served.content == done.content
            job = c.get(f"/v1/jobs/{job_id}").json()
            # Still leased by the killed server until the lease expires (2 s here).
            assert job["status"] in ("queued", "running"), job
            # An identical request finds the job instead of starting another.
            again = c.post("/v1/plans", params={"mode": "async"}, json=LONG_REQUEST)
            assert again.status_code == 202 and again.json()["id"] == job_id
            # SIGTERM to the whole group (as systemd does): the solver dies first or the
            # server stops it; either way the job is not recorded as a solver failure.
            job = _kill_while_running(second, c, job_id, attempt=2, sig=signal.SIGTERM)
            assert job["note"].startswith("re-run: the server stopped while this job was running")
    finally:
        second.kill()

    # The third server also caps a solve at 2 s: the per-request time limit, enforced by
    # stopping the solver process.
    third = start_server(tmp_path, db, job_timeout_s=2, sync_wait_s=30)
    try:
        with httpx.Client(base_url=third.url, timeout=60) as c:
            assert c.get(f"/v1/plans/{plan_id}").content == done.content
            # If the SIGTERM'd server did not give the job back before it died, its lease
            # runs out (2 s) and this server's claim loop fails it then: wait, bounded.
            job = wait_job(c, job_id, 30, until=("failed", "succeeded", "queued"))
            assert job["status"] == "failed" and job["attempts"] == 2, job
            assert "the server stopped during this job 2 times" in job["error"]["detail"]
            assert c.get(f"/v1/plans/{job_id}").status_code == 404
            retry = c.post("/v1/plans", params={"mode": "async"}, json=LONG_REQUEST)
            assert retry.status_code == 202, retry.text
            assert retry.json()["status"] in ("queued", "running")
            assert retry.json()["note"] == "re-run on request after a failure"
            timed_out = wait_job(c, job_id, 60)
            assert timed_out["status"] == "failed", timed_out
            assert "did not finish within 2 s" in timed_out["error"]["detail"]
            # The pool replaced the stopped solver: the next request is solved.
            assert c.post("/v1/plans", json=small_request(seed=5)).status_code == 201
    finally:
        third.kill()
