"""The service's parts without a server: settings from the environment, and the store's
queue on both stores (SQLite, and a real PostgreSQL server the tests start): migrations,
atomic admission, claims with leases, takeover only after expiry, fenced writes, cancel."""

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.migrations import LATEST
from api.settings import ServiceSettings
from api.store import QueueFull, SqliteStore, Store


def test_settings_from_env() -> None:
    s = ServiceSettings.from_env({"PLANNER_MAX_TABLES": "12", "PLANNER_API_KEY": "k",
                                  "PLANNER_DB_PATH": "/tmp/x.db", "PLANNER_SYNC_WAIT_S": "0.5",
                                  "PLANNER_MAX_GPUS": "",
                                  "PLANNER_DATABASE_URL": "postgresql://u@h/db"}, max_gpus=7)
    assert (s.max_tables, s.api_key, s.db_path, s.sync_wait_s, s.max_gpus) == (
        12, "k", Path("/tmp/x.db"), 0.5, 7)
    assert s.database_url == "postgresql://u@h/db"
    assert ServiceSettings.from_env({}).api_key is None
    assert ServiceSettings.from_env({}).database_url is None
    # A solve may run its own time limit plus the overhead, never past the job timeout.
    s = ServiceSettings(solve_overhead_s=60, job_timeout_s=100)
    assert s.solve_deadline_s(10) == 70 and s.solve_deadline_s(50) == 100


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        s: Store = SqliteStore(tmp_path / "s.sqlite3")
    else:
        from api.store_pg import PostgresStore

        s = PostgresStore(request.getfixturevalue("pg_url"))
    try:
        yield s
    finally:
        s.close()


def _err(row: object) -> str:
    return '{"title": "x", "status": 503}'


@pytest.mark.timeout(60)
def test_migrations_are_recorded_and_idempotent(store: Store) -> None:
    assert store.schema_version() == LATEST
    assert store.migrate() == []  # a second replica starting: nothing to do


@pytest.mark.timeout(30)
def test_old_sqlite_file_is_adopted(tmp_path: Path) -> None:
    """A file of the service before migrations (no lease columns) is migrated in place."""
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, status TEXT NOT NULL, request TEXT NOT NULL, "
        "tables INTEGER NOT NULL, time_limit_s REAL NOT NULL, created_at REAL NOT NULL, "
        "updated_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, owner TEXT, "
        "owner_pid INTEGER, error TEXT, note TEXT);"
        "CREATE TABLE plans (id TEXT PRIMARY KEY, plan_hash TEXT NOT NULL, plan TEXT NOT NULL, "
        "created_at REAL NOT NULL);"
        "INSERT INTO jobs VALUES ('j', 'succeeded', '{}', 1, 1.0, 1.0, 1.0, 1, 'b', 1, NULL, "
        "NULL);"
        "INSERT INTO plans VALUES ('j', 'sha256:x', '{\"p\": 1}', 1.0);")
    db.commit()
    db.close()
    store = SqliteStore(path)
    try:
        assert store.schema_version() == LATEST
        job = store.get_job("j")
        assert job is not None and job.status == "succeeded" and job.fence == 0
        assert store.get_plan("j") == '{"p": 1}'
    finally:
        store.close()


@pytest.mark.timeout(60)
def test_lease_claim_renew_takeover_and_fenced_write(store: Store) -> None:
    row, created = store.submit("a", "{}", 1, 10.0, max_queued=8)
    assert created and row.status == "queued"
    assert store.submit("a", "{}", 1, 10.0, max_queued=8) == (store.get_job("a"), False)
    claimed, failed = store.claim("r1", ttl_s=0.5, limit=4, max_attempts=2, failed_error=_err)
    assert [r.id for r in claimed] == ["a"] and failed == []
    a1 = claimed[0]
    assert (a1.status, a1.lease_owner, a1.attempts, a1.fence) == ("running", "r1", 1, 1)
    # Held and renewed: nobody else takes it, however often they look.
    assert store.claim("r2", 0.5, 4, 2, _err) == ([], [])
    assert store.renew("r1", 0.5, {"a": 1}) == {"a"}
    time.sleep(0.2)
    assert store.renew("r1", 0.5, {"a": 1}) == {"a"}
    assert store.claim("r2", 0.5, 4, 2, _err) == ([], [])
    # r1 stops renewing (killed): after expiry r2 takes it over with a new token.
    time.sleep(0.7)
    claimed, _ = store.claim("r2", 5.0, 4, 2, _err)
    assert [(r.id, r.lease_owner, r.fence, r.attempts) for r in claimed] == [("a", "r2", 2, 2)]
    assert claimed[0].note is not None and claimed[0].note.startswith("re-run: the server")
    # r1 comes back (a long pause, not dead): its lease is gone and its write is fenced off.
    assert store.renew("r1", 0.5, {"a": 1}) == set()
    assert not store.finish("a", "r1", 1, "succeeded", plan="stale", plan_hash="h")
    assert store.get_plan("a") is None
    assert store.finish("a", "r2", 2, "succeeded", plan='{"ok": 1}', plan_hash="h")
    assert store.get_plan("a") == '{"ok": 1}' and store.get_job("a").status == "succeeded"  # type: ignore[union-attr]
    # Finished is final: not even the holder writes twice.
    assert not store.finish("a", "r2", 2, "failed", error="{}")
    # Claimed max_attempts times and expired again: failed with the reason, not re-run.
    store.submit("b", "{}", 1, 10.0, max_queued=8)
    for owner in ("r1", "r2"):
        claimed, _ = store.claim(owner, 0.05, 4, 2, _err)
        assert [r.id for r in claimed] == ["b"]
        time.sleep(0.1)
    claimed, failed = store.claim("r3", 5.0, 4, 2, _err)
    assert claimed == [] and [r.id for r in failed] == ["b"]
    b = store.get_job("b")
    assert b is not None and (b.status, b.attempts, b.error) == ("failed", 2, _err(None))
    # Posted again, a failed job is queued afresh.
    row, created = store.submit("b", "{}", 1, 10.0, max_queued=8)
    assert created and row.status == "queued" and row.attempts == 0
    assert row.note == "re-run on request after a failure"


@pytest.mark.timeout(60)
def test_release_and_cancel(store: Store) -> None:
    store.submit("q", "{}", 1, 1.0, max_queued=8)
    store.submit("r", "{}", 1, 1.0, max_queued=8)
    (q, r), _ = store.claim("me", 30, 2, 2, _err)
    assert store.release(q.id, "me", q.fence, "re-run: interrupted")
    assert store.get_job("q").status == "queued"  # type: ignore[union-attr]
    assert not store.release(q.id, "me", q.fence, "twice")  # no longer held
    # Cancel a queued job and a running one: the holder's renewal reports the loss.
    assert store.cancel("q", '{"title": "c", "status": 409}')[1]
    row, cancelled = store.cancel("r", '{"title": "c", "status": 409}')
    assert cancelled and row is not None and row.status == "cancelled"
    assert store.renew("me", 30, {"r": r.fence}) == set()
    assert not store.finish("r", "me", r.fence, "succeeded", plan="{}", plan_hash="h")
    assert store.cancel("r", "{}") == (store.get_job("r"), False)  # already final
    assert store.cancel("nope", "{}") == (None, False)
    assert store.submit("r", "{}", 1, 1.0, 8)[0].note == "re-run on request after its cancellation"


@pytest.mark.timeout(60)
def test_queue_limit_is_atomic_under_concurrent_submits(store: Store) -> None:
    """32 threads submit 64 distinct jobs against a limit of 8: exactly 8 are admitted."""
    limit, admitted, refused = 8, [], []
    barrier = threading.Barrier(32)

    def client(n: int) -> None:
        barrier.wait()
        for k in (n, n + 32):
            try:
                _, created = store.submit(f"job{k}", "{}", 1, 1.0, max_queued=limit)
                admitted.append(created)
            except QueueFull:
                refused.append(k)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert admitted.count(True) == limit and len(refused) == 64 - limit
    assert store.counts().queued == limit


@pytest.mark.timeout(60)
def test_db_upgrade_command(pg_url: str) -> None:
    """`planner db-upgrade`: what a deployment runs before (or while) rolling out."""
    import subprocess
    import sys

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "planner.cli", "db-upgrade",
                               "--database-url", pg_url, *args], capture_output=True,
                              text=True, timeout=60, check=False)

    behind = run("--check")
    assert behind.returncode == 1 and "schema version 0" in behind.stdout, behind
    done = run()
    assert done.returncode == 0 and f"schema version {LATEST}" in done.stdout, done
    assert run("--check").returncode == 0


@pytest.mark.timeout(60)
def test_retention(store: Store) -> None:
    """Finished jobs past the TTL go with their plans; beyond max_plans the oldest plans go
    with their jobs; queued and running jobs are never touched."""
    for i in range(5):
        store.submit(f"done{i}", "{}", 1, 1.0, max_queued=99)
    (running,), _ = store.claim("r", 60, 1, 2, _err)
    for row in store.claim("r", 60, 9, 2, _err)[0]:
        store.finish(row.id, "r", row.fence, "succeeded", plan=f'"{row.id}"', plan_hash="h")
        time.sleep(0.02)  # distinct creation times
    store.submit("waiting", "{}", 1, 1.0, max_queued=99)
    # Keep the newest 2 plans (no grace period here).
    assert store.cleanup(None, 2, grace_s=0) == 2
    kept = [i for i in ("done1", "done2", "done3", "done4") if store.get_plan(i)]
    assert kept == ["done3", "done4"] and store.get_job("done1") is None
    time.sleep(0.3)
    assert store.cleanup(0.2, None) == 2  # the two finished ones, past the TTL
    assert store.get_job("done4") is None and store.get_plan("done4") is None
    assert store.get_job(running.id).status == "running"  # type: ignore[union-attr]
    assert store.get_job("waiting").status == "queued"  # type: ignore[union-attr]


@pytest.mark.timeout(60)
def test_solver_seconds_quota(store: Store) -> None:
    """A key's solver seconds over a sliding window: recorded attempts plus its running jobs'
    time so far; over the quota, OverQuota with when enough use leaves the window."""
    from api.store import OverQuota, SolverQuota

    quota = SolverQuota(max_s=2.0, window_s=1.5)
    store.submit("k1", "{}", 1, 1.0, 99, client="team", client_solver_quota=quota)
    (job,), _ = store.claim("r", 30, 1, 2, _err)
    store.record_usage("team", job.id, job.fence, 1.5)
    store.record_usage("team", job.id, job.fence, 9.0)  # the same attempt: counted once
    store.finish(job.id, "r", job.fence, "succeeded", plan="{}", plan_hash="h")
    store.record_usage("other", "x", 1, 50.0)  # another key's use is not this key's
    used, _ = store.solver_seconds("team", 1.5)
    assert used == pytest.approx(1.5)
    store.submit("k2", "{}", 1, 1.0, 99, client="team", client_solver_quota=quota)
    (job2,), _ = store.claim("r", 30, 1, 2, _err)
    time.sleep(0.6)  # running for 0.6 s: 1.5 + 0.6 >= 2
    with pytest.raises(OverQuota) as refused:
        store.submit("k3", "{}", 1, 1.0, 99, client="team", client_solver_quota=quota)
    assert refused.value.kind == "solver_seconds" and refused.value.used_s >= 2.0
    assert 0.0 < refused.value.retry_after_s <= 1.5
    # A request already known is answered whatever the quota.
    assert store.submit("k2", "{}", 1, 1.0, 99, client="team",
                        client_solver_quota=quota)[1] is False
    store.finish(job2.id, "r", job2.fence, "succeeded", plan="{}", plan_hash="h")
    store.record_usage("team", job2.id, job2.fence, 0.6)
    time.sleep(refused.value.retry_after_s + 0.05)  # the 1.5 s attempt left the window
    assert store.submit("k3", "{}", 1, 1.0, 99, client="team", client_solver_quota=quota)[1]
    store.cleanup(None, None, usage_older_than_s=0.0)
    assert store.solver_seconds("team", 1.5)[0] == pytest.approx(0.0, abs=0.01)


def test_lease_renewal_never_cancels_a_job_whose_result_is_being_written() -> None:
    """A renewal that runs while a finished job's fenced write commits finds the job no
    longer running; it must not take that for a lost lease and cancel the task between the
    commit and its audit line (seen under load in test_two_replicas_one_killed). A job that
    is not finishing and missing from the renewal's answer is still stopped."""
    import asyncio

    from api.jobs import JobRunner, _Held
    from api.metrics import Metrics

    class Renewed:  # the store's answer: neither job is running under this lease any more
        def renew(self, owner: str, ttl_s: float, leases: dict[str, int]) -> set[str]:
            return set()

    async def scenario() -> tuple[bool, bool]:
        runner = JobRunner(ServiceSettings(lease_renew_s=0.02), Renewed(),  # type: ignore[arg-type]
                           Metrics())
        writing = asyncio.ensure_future(asyncio.sleep(5))
        solving = asyncio.ensure_future(asyncio.sleep(5))
        runner._held["writing"] = _Held(1, writing, finishing=True)
        runner._held["solving"] = _Held(1, solving)
        keeper = asyncio.ensure_future(runner._keep_leases())
        await asyncio.sleep(0.2)
        keeper.cancel()
        cancelled = (writing.cancelled(), solving.cancelled())
        writing.cancel()
        await asyncio.gather(writing, solving, keeper, return_exceptions=True)
        runner._lease_thread.shutdown()
        return cancelled

    assert asyncio.run(scenario()) == (False, True)
