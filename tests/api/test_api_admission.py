"""Admission on a real server: /readyz reports saturation (503 once the queue is full, when
a POST would get 429), DELETE /v1/jobs/{id} cancels a queued job and a running one, and a
cancelled running job frees its solver (the process stopped, the slot free) within 2 s."""

import contextlib
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import long_request, small_request, start_server, wait_job

LONG_REQUEST = long_request()


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found |= {int(p) for p in f.read().split()}
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(120)
def test_saturation_cancel_and_solver_freed(tmp_path: Path) -> None:
    server = start_server(tmp_path, tmp_path / "adm.sqlite3", max_queued_jobs=1, sync_wait_s=10)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            ready = c.get("/readyz").json()
            assert (ready["solvers"], ready["solvers_busy"], ready["jobs_queued"]) == (1, 0, 0)
            assert ready["store"] == "sqlite"
            running = c.post("/v1/plans", params={"mode": "async"}, json=LONG_REQUEST).json()
            job = wait_job(c, running["id"], 30, until=("running", "succeeded", "failed"))
            assert job["status"] == "running", job
            assert c.get("/readyz").json()["solvers_busy"] == 1
            queued = c.post("/v1/plans", params={"mode": "async"}, json=small_request(seed=11))
            assert queued.status_code == 202 and queued.json()["status"] == "queued"
            time.sleep(0.2)
            age = [line for line in c.get("/metrics").text.splitlines()
                   if line.startswith("planner_queue_oldest_age_seconds ")]
            assert age and float(age[0].split()[1]) >= 0.2, age
            # The queue is full: /readyz says so, and a POST is refused with Retry-After.
            saturated = c.get("/readyz")
            assert saturated.status_code == 503 and "saturated" in saturated.json()["detail"]
            refused = c.post("/v1/plans", json=small_request(seed=12))
            assert refused.status_code == 429 and refused.headers["Retry-After"]
            # Cancel the queued job: room again.
            gone = c.delete(f"/v1/jobs/{queued.json()['id']}")
            assert gone.status_code == 200 and gone.json()["status"] == "cancelled"
            assert gone.json()["error"]["type"].endswith("cancelled")
            assert c.get("/readyz").status_code == 200

            # Cancel the running job: its solver process stops and the slot is free in < 2 s.
            before = {p for p in _children(server.proc.pid) if _alive(p)}
            t0 = time.monotonic()
            r = c.delete(f"/v1/jobs/{running['id']}")
            assert r.status_code == 200 and r.json()["status"] == "cancelled"
            while time.monotonic() - t0 < 5:
                stopped = {p for p in before if not _alive(p)}
                if stopped and c.get("/readyz").json()["solvers_busy"] == 0:
                    break
                time.sleep(0.02)
            freed_s = time.monotonic() - t0
            assert stopped, "no solver process stopped"
            assert freed_s < 2.0, f"solver freed after {freed_s:.2f} s"
            print(f"\ncancelled running job: solver process stopped, slot free in "
                  f"{freed_s * 1000:.0f} ms")
            assert c.get(f"/v1/jobs/{running['id']}").json()["status"] == "cancelled"
            assert c.get(f"/v1/plans/{running['id']}").status_code == 404
            # Cancelling a finished job changes nothing; unknown jobs are 404.
            assert c.delete(f"/v1/jobs/{running['id']}").json()["status"] == "cancelled"
            assert c.delete("/v1/jobs/" + "0" * 64).status_code == 404
            # The freed solver takes the next job (the pool replaced the stopped process).
            assert c.post("/v1/plans", json=small_request(seed=13)).status_code == 201
            # Posted again, a cancelled job is re-run.
            again = c.post("/v1/plans", params={"mode": "async"}, json=small_request(seed=11))
            assert again.status_code == 202
            assert again.json()["note"] == "re-run on request after its cancellation"
            assert wait_job(c, again.json()["id"], 30)["status"] == "succeeded"
    finally:
        server.kill(signal.SIGTERM)


@pytest.mark.timeout(120)
def test_cancel_reaches_the_replica_that_runs_the_job(tmp_path: Path, pg_url: str) -> None:
    """Two replicas on PostgreSQL: DELETE on one stops the solve on the other (at its next
    lease renewal), and that replica's solver is free again in < 2 s."""
    env = {"database_url": pg_url, "lease_renew_s": 0.4}
    a = start_server(tmp_path, tmp_path / "unused.sqlite3", **env)
    b = None
    try:
        with httpx.Client(base_url=a.url, timeout=30) as ca:
            job = ca.post("/v1/plans", params={"mode": "async"}, json=LONG_REQUEST).json()
            assert wait_job(ca, job["id"], 30, until=("running",))["status"] == "running"
            assert ca.get("/readyz").json()["solvers_busy"] == 1
            b = start_server(tmp_path, tmp_path / "unused.sqlite3", **env)
            with httpx.Client(base_url=b.url, timeout=30) as cb:
                assert cb.get("/readyz").json()["solvers_busy"] == 0  # a holds it
                t0 = time.monotonic()
                r = cb.delete(f"/v1/jobs/{job['id']}")
                assert r.status_code == 200 and r.json()["status"] == "cancelled"
                while ca.get("/readyz").json()["solvers_busy"] and time.monotonic() - t0 < 5:
                    time.sleep(0.02)
                freed_s = time.monotonic() - t0
                assert freed_s < 2.0, f"solver on the other replica freed after {freed_s:.2f} s"
                print(f"\ncancel across replicas: solver free in {freed_s * 1000:.0f} ms")
                assert ca.get(f"/v1/jobs/{job['id']}").json()["status"] == "cancelled"
                text = ca.get("/metrics").text
                assert "planner_leases_lost_total 1.0" in text
    finally:
        a.kill(signal.SIGTERM)
        if b is not None:
            b.kill(signal.SIGTERM)
