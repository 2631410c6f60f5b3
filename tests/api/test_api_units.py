"""The service's parts without a server: settings from the environment, and which unfinished
jobs the store hands to a new server (the owner is gone) and which it leaves alone."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from api.settings import ServiceSettings
from api.store import Store


def test_settings_from_env() -> None:
    s = ServiceSettings.from_env({"PLANNER_MAX_TABLES": "12", "PLANNER_API_KEY": "k",
                                  "PLANNER_DB_PATH": "/tmp/x.db", "PLANNER_SYNC_WAIT_S": "0.5",
                                  "PLANNER_MAX_GPUS": ""}, max_gpus=7)
    assert (s.max_tables, s.api_key, s.db_path, s.sync_wait_s, s.max_gpus) == (
        12, "k", Path("/tmp/x.db"), 0.5, 7)
    assert ServiceSettings.from_env({}).api_key is None
    # A solve may run its own time limit plus the overhead, never past the job timeout.
    s = ServiceSettings(solve_overhead_s=60, job_timeout_s=100)
    assert s.solve_deadline_s(10) == 70 and s.solve_deadline_s(50) == 100


@pytest.mark.timeout(30)
def test_orphans_are_jobs_whose_owner_is_gone(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite3")
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        # owner alive and beating: not an orphan; owner's pid gone: orphan; owner alive but
        # silent for longer than the staleness limit: orphan; our own pid from an earlier
        # boot (a container restart reuses pids): orphan.
        owners = {"live": alive.pid, "dead": dead.pid, "silent": alive.pid,
                  "earlier": os.getpid()}
        for boot, pid in owners.items():
            store.heartbeat(boot, pid)
            store.create_job(f"job-{boot}", "{}", 1, 10.0, boot, pid)
            store.mark_running(f"job-{boot}", boot)
        store.create_job("job-done", "{}", 1, 10.0, "dead", dead.pid)
        store.finish("job-done", "dead", "succeeded", plan="{}", plan_hash="sha256:x")
        time.sleep(0.3)
        store.heartbeat("live", alive.pid)
        claimed = store.claim_orphans("new", os.getpid(), stale_after_s=0.2)
        assert sorted(r.id for r in claimed) == ["job-dead", "job-earlier", "job-silent"]
        assert all(r.status == "running" and r.attempts == 1 for r in claimed)
        assert store.get_job("job-dead").owner == "new"  # type: ignore[union-attr]
        assert store.get_job("job-live").owner == "live"  # type: ignore[union-attr]
        assert store.get_plan("job-done") == "{}"
        # Once the new owner beats, another server takes nothing from it (or from "live").
        store.heartbeat("new", os.getpid())
        store.heartbeat("live", alive.pid)
        assert store.claim_orphans("newer", dead.pid, stale_after_s=60) == []
    finally:
        alive.kill()
        alive.wait()
        store.close()
