"""Durable jobs and plans: one interface, two stores.

`SqliteStore` (the default: one embedded file, WAL, synchronous=FULL, nothing to set up) and
`PostgresStore` (api/store_pg.py, `PLANNER_DATABASE_URL=postgresql://...`, for replicas)
share every SQL statement below; a store only supplies its connection, its clock expression
and its row locking. `open_store(settings)` picks one.

The queue lives in the database. A job is queued; a replica with a free solver claims it
with a lease (holder, expiry on the database's clock, a fencing token bumped by every
claim), renews the lease while it solves, and writes the result only while it still holds
that lease (a fenced write: the holder and the token must match, else nothing is written).
A job whose lease expired (its replica died) is claimed again by any replica; after
`max_attempts` claims it is failed with the reason. A job's final status and its plan are
written in one transaction, so a finished job always has its plan.
"""

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from api.migrations import LATEST, MIGRATIONS

if TYPE_CHECKING:
    from api.settings import ServiceSettings

UNFINISHED = ("queued", "running")
# A job in one of these states is queued again when the same request is posted again.
RETRYABLE = ("failed", "cancelled")


class OverQuota(Exception):
    """The client (API key) is at a quota: as many unfinished jobs as it may have
    (kind "jobs"), or its solver seconds over the window used up (kind "solver_seconds");
    `retry_after_s`: when a retry may be admitted (an estimate for "jobs")."""

    def __init__(self, client: str, unfinished: int, kind: str = "jobs",
                 used_s: float = 0.0, retry_after_s: float = 5.0) -> None:
        super().__init__(f"{client}: {unfinished} jobs unfinished, {used_s:.1f} solver s used")
        self.client = client
        self.unfinished = unfinished
        self.kind = kind
        self.used_s = used_s
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class SolverQuota:
    """A client's solver seconds: at most `max_s` over any `window_s` (finished solve
    attempts recorded in solver_usage, plus the time its running jobs have run so far)."""

    max_s: float
    window_s: float = 3600.0


class QueueFull(Exception):
    """The deployment's queue (jobs waiting for a solver) is at its limit."""

    def __init__(self, queued: int) -> None:
        super().__init__(f"{queued} jobs queued")
        self.queued = queued


@dataclass(frozen=True)
class JobRow:
    id: str
    status: str
    request: str
    tables: int
    time_limit_s: float
    created_at: float
    updated_at: float
    attempts: int  # claims so far (a solve started; a takeover after a crash makes it 2)
    error: str | None  # a Problem as JSON, for infeasible, bad_input, failed and cancelled
    note: str | None
    lease_owner: str | None  # the instance holding (or that last held) the job
    lease_expires: float | None  # store clock, seconds since the epoch
    fence: int  # bumped by every claim: a write must carry the current one
    client: str | None  # the API key's name that asked for it, if any


_JOB_COLUMNS = ("id, status, request, tables, time_limit_s, created_at, updated_at, attempts, "
                "error, note, lease_owner, lease_expires, fence, client")


def _row(r: Sequence[Any]) -> JobRow:
    return JobRow(*r)


class Query(Protocol):
    def __call__(self, sql: str, params: Sequence[Any] = ()) -> Any: ...


@dataclass(frozen=True)
class QueueCounts:
    queued: int
    running: int
    oldest_queued_age_s: float = 0.0  # how long the oldest queued job has waited


class Store:
    """The SQL of both stores. Every method is one short transaction and thread-safe."""

    # A SQL expression for "now" on the store's clock, in seconds since the epoch: leases are
    # judged by one clock, whatever the replicas' own clocks say.
    now_sql = ""
    # Appended to the claim's SELECT where the store can skip rows other replicas are taking.
    skip_locked = ""
    kind = ""

    # Dialect hooks
    def _tx(self) -> AbstractContextManager[Query]:
        """A write transaction: serialized against other writers of the queue."""
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[Query]:
        raise NotImplementedError

    def _lock_admission(self, q: Query) -> None:
        """Inside _tx: hold the lock that makes count-then-insert atomic across replicas."""

    def _migration_lock(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _sql(self, sql: str) -> str:
        return sql.replace("{now}", self.now_sql)

    # Migrations
    def schema_version(self) -> int:
        with self._read() as q:
            try:
                row = q("SELECT MAX(version) FROM schema_migrations").fetchone()
            except Exception:
                return 0
        return int(row[0] or 0)

    def migrate(self) -> list[int]:
        """Apply the migrations this database lacks; the versions applied."""
        applied: list[int] = []
        with self._migration_lock():
            with self._tx() as q:
                q("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
                  "name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)")
            for m in MIGRATIONS:
                with self._tx() as q:
                    if q("SELECT 1 FROM schema_migrations WHERE version=?",
                         (m.version,)).fetchone():
                        continue
                    for statement in m.statements:
                        q(self._sql(statement))
                    q(self._sql("INSERT INTO schema_migrations(version, name, applied_at) "
                                "VALUES (?, ?, {now})"), (m.version, m.name))
                applied.append(m.version)
        return applied

    def _fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._read() as q:
            return list(q(self._sql(sql), params).fetchall())

    def ping(self) -> None:
        self._fetchall("SELECT 1")

    def now(self) -> float:
        return float(self._fetchall("SELECT {now}")[0][0])

    # Jobs
    def get_job(self, job_id: str) -> JobRow | None:
        rows = self._fetchall(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,))
        return _row(rows[0]) if rows else None

    def statuses(self, job_ids: Sequence[str]) -> dict[str, str]:
        if not job_ids:
            return {}
        marks = ", ".join("?" * len(job_ids))
        return dict(self._fetchall(f"SELECT id, status FROM jobs WHERE id IN ({marks})",
                                   tuple(job_ids)))

    def counts(self) -> QueueCounts:
        rows = self._fetchall("SELECT status, COUNT(*), {now} - MIN(created_at) FROM jobs "
                              "WHERE status IN (?, ?) GROUP BY status", UNFINISHED)
        got = {status: (int(n), float(age or 0.0)) for status, n, age in rows}
        queued, age = got.get("queued", (0, 0.0))
        return QueueCounts(queued=queued, running=got.get("running", (0, 0.0))[0],
                           oldest_queued_age_s=max(age, 0.0))

    def solver_seconds(self, client: str, window_s: float) -> tuple[float, float]:
        """(seconds `client`'s solves used over the last window_s, seconds until enough of
        that leaves the window for the total to drop by the excess) -- see _solver_quota."""
        with self._read() as q:
            return self._solver_use(q, client, window_s, None)

    def _solver_use(self, q: Query, client: str, window_s: float,
                    max_s: float | None) -> tuple[float, float]:
        now = float(q(self._sql("SELECT {now}")).fetchone()[0])
        rows = [(float(a), float(s)) for a, s in q(
            "SELECT at, seconds FROM solver_usage WHERE client=? AND at > ? ORDER BY at",
            (client, now - window_s)).fetchall()]
        (running,) = q("SELECT COALESCE(SUM(? - updated_at), 0) FROM jobs WHERE client=? "
                       "AND status='running'", (now, client)).fetchone()
        used = sum(s for _, s in rows) + max(float(running or 0.0), 0.0)
        retry = 0.0
        if max_s is not None and used >= max_s:
            # The oldest recorded solves leave the window first; running time stays.
            retry, left = window_s, used
            for at, seconds in rows:
                left -= seconds
                if left < max_s:
                    retry = at + window_s - now
                    break
        return used, retry

    def record_usage(self, client: str, job_id: str, fence: int, seconds: float) -> None:
        """One solve attempt's wall time, charged to `client` (idempotent per attempt)."""
        with self._tx() as q:
            q(self._sql("INSERT INTO solver_usage(job_id, fence, client, seconds, at) "
                        "VALUES (?, ?, ?, ?, {now}) ON CONFLICT (job_id, fence) DO NOTHING"),
              (job_id, fence, client, max(seconds, 0.0)))

    def submit(self, job_id: str, request: str, tables: int, time_limit_s: float,
               max_queued: int, client: str | None = None,
               client_max_unfinished: int | None = None,
               client_solver_quota: SolverQuota | None = None) -> tuple[JobRow, bool]:
        """The job for this request: the stored one (created False), or queued now (True).
        A failed or cancelled job is queued again. The queue limit is counted in the same
        transaction as the insert, under the admission lock: it holds across replicas.
        QueueFull when `max_queued` jobs are already waiting; OverQuota when `client` already
        has `client_max_unfinished` jobs queued or running, or has used its solver seconds
        (`client_solver_quota`: recorded solves in the window plus its running jobs so far;
        a request already solved or running is answered whatever the quota)."""
        with self._tx() as q:
            self._lock_admission(q)
            got = q(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,)).fetchone()
            existing = _row(got) if got else None
            if existing is not None and existing.status not in RETRYABLE:
                return existing, False
            (queued,) = q("SELECT COUNT(*) FROM jobs WHERE status='queued'").fetchone()
            if int(queued) >= max_queued:
                raise QueueFull(int(queued))
            if client is not None and client_max_unfinished is not None:
                (mine,) = q("SELECT COUNT(*) FROM jobs WHERE client=? AND status IN (?, ?)",
                            (client, *UNFINISHED)).fetchone()
                if int(mine) >= client_max_unfinished:
                    raise OverQuota(client, int(mine))
            if client is not None and client_solver_quota is not None:
                quota = client_solver_quota
                used, retry = self._solver_use(q, client, quota.window_s, quota.max_s)
                if used >= quota.max_s:
                    raise OverQuota(client, 0, kind="solver_seconds", used_s=used,
                                    retry_after_s=retry)
            if existing is None:
                q(self._sql("INSERT INTO jobs(id, status, request, tables, time_limit_s, "
                            "created_at, updated_at, attempts, client) "
                            "VALUES (?, 'queued', ?, ?, ?, {now}, {now}, 0, ?)"),
                  (job_id, request, tables, time_limit_s, client))
            else:
                why = "a failure" if existing.status == "failed" else "its cancellation"
                note = f"re-run on request after {why}"
                q(self._sql("UPDATE jobs SET status='queued', attempts=0, error=NULL, note=?, "
                            "lease_expires=NULL, client=?, created_at={now}, updated_at={now} "
                            "WHERE id=?"), (note, client, job_id))
            row = q(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,)).fetchone()
        return _row(row), True

    def claim(self, owner: str, ttl_s: float, limit: int, max_attempts: int,
              failed_error: Callable[[JobRow], str]) -> tuple[list[JobRow], list[JobRow]]:
        """Claim up to `limit` jobs for `owner`: queued ones, oldest first, and running ones
        whose lease expired (their holder is gone). Each gets a lease of ttl_s, a new fencing
        token and one more attempt. A job already claimed `max_attempts` times is failed
        instead (error: failed_error(row)). Returns (claimed, failed)."""
        if limit <= 0:
            return [], []
        claimed: list[JobRow] = []
        failed: list[JobRow] = []
        with self._tx() as q:
            rows = [_row(r) for r in q(self._sql(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE status='queued' OR (status='running' "
                f"AND lease_expires < {{now}}) ORDER BY created_at LIMIT ?{self.skip_locked}"),
                (limit,)).fetchall()]
            for r in rows:
                if r.attempts >= max_attempts:
                    q(self._sql("UPDATE jobs SET status='failed', error=?, lease_expires=NULL, "
                                "updated_at={now} WHERE id=?"), (failed_error(r), r.id))
                    failed.append(r)
                    continue
                note = r.note
                if r.status == "running":
                    note = (f"re-run: the server stopped while this job was running (after "
                            f"{r.attempts} start{'s' if r.attempts != 1 else ''})")
                q(self._sql("UPDATE jobs SET status='running', attempts=attempts+1, "
                            "fence=fence+1, lease_owner=?, lease_expires={now} + ?, note=?, "
                            "updated_at={now} WHERE id=?"), (owner, ttl_s, note, r.id))
                got = q(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id=?", (r.id,)).fetchone()
                claimed.append(_row(got))
        return claimed, failed

    def renew(self, owner: str, ttl_s: float, leases: dict[str, int]) -> set[str]:
        """Extend `owner`'s leases (job id -> fencing token); the ids still held. A job missing
        from the answer was cancelled, or taken over after its lease expired: stop it."""
        if not leases:
            return set()
        ids = tuple(leases)
        marks = ", ".join("?" * len(ids))
        with self._tx() as q:
            q(self._sql(f"UPDATE jobs SET lease_expires={{now}} + ? WHERE status='running' "
                        f"AND lease_owner=? AND id IN ({marks})"), (ttl_s, owner, *ids))
            held = q(f"SELECT id, fence FROM jobs WHERE status='running' AND lease_owner=? "
                     f"AND id IN ({marks})", (owner, *ids)).fetchall()
        return {i for i, fence in held if leases.get(i) == int(fence)}

    def finish(self, job_id: str, owner: str, fence: int, status: str, *,
               plan: str | None = None, plan_hash: str | None = None,
               error: str | None = None, note: str | None = None) -> bool:
        """The job's final status, and its plan, in one transaction, written only while
        `owner` holds the lease with token `fence` (False: nothing written)."""
        with self._tx() as q:
            cur = q(self._sql("UPDATE jobs SET status=?, error=?, note=COALESCE(?, note), "
                              "lease_expires=NULL, updated_at={now} WHERE id=? AND "
                              "status='running' AND lease_owner=? AND fence=?"),
                    (status, error, note, job_id, owner, fence))
            if cur.rowcount != 1:
                return False
            if plan is not None:
                q(self._sql("INSERT INTO plans(id, plan_hash, plan, created_at) "
                            "VALUES (?, ?, ?, {now}) ON CONFLICT(id) DO UPDATE SET "
                            "plan_hash=excluded.plan_hash, plan=excluded.plan, "
                            "created_at=excluded.created_at"), (job_id, plan_hash, plan))
        return True

    def release(self, job_id: str, owner: str, fence: int, note: str) -> bool:
        """Give a held job back to the queue (its solve was interrupted): fenced as finish."""
        with self._tx() as q:
            cur = q(self._sql("UPDATE jobs SET status='queued', note=?, lease_expires=NULL, "
                              "updated_at={now} WHERE id=? AND status='running' AND "
                              "lease_owner=? AND fence=?"), (note, job_id, owner, fence))
        return bool(cur.rowcount == 1)

    def cancel(self, job_id: str, error: str) -> tuple[JobRow | None, bool]:
        """Cancel a queued or running job: (the job, whether this call cancelled it). Its
        lease holder sees the lease gone at its next renewal and stops the solve."""
        with self._tx() as q:
            cur = q(self._sql("UPDATE jobs SET status='cancelled', error=?, lease_expires=NULL, "
                              "note='cancelled on request', updated_at={now} WHERE id=? AND "
                              "status IN ('queued', 'running')"), (error, job_id))
            got = q(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,)).fetchone()
        return (_row(got) if got else None), cur.rowcount == 1

    def cleanup(self, older_than_s: float | None, max_plans: int | None,
                grace_s: float = 60.0, usage_older_than_s: float | None = None) -> int:
        """Retention: delete finished jobs (and their plans) last updated more than
        older_than_s ago, then the oldest plans (and their jobs) beyond the newest
        max_plans, sparing plans younger than grace_s (a POST may be about to answer with
        one). Queued and running jobs are never touched (they have no plan yet). Solver usage
        older than usage_older_than_s (past every key's quota window) goes too. Returns
        the number of jobs deleted."""
        deleted = 0
        with self._tx() as q:
            if older_than_s is not None:
                q(self._sql("DELETE FROM plans WHERE id IN (SELECT id FROM jobs WHERE status "
                            "NOT IN ('queued', 'running') AND updated_at < {now} - ?)"),
                  (older_than_s,))
                cur = q(self._sql("DELETE FROM jobs WHERE status NOT IN ('queued', 'running') "
                                  "AND updated_at < {now} - ?"), (older_than_s,))
                deleted += max(cur.rowcount, 0)
            if max_plans is not None:
                q(self._sql("DELETE FROM plans WHERE created_at < {now} - ? AND created_at < "
                            "(SELECT created_at FROM plans ORDER BY created_at DESC LIMIT 1 "
                            "OFFSET ?)"), (grace_s, max(max_plans - 1, 0)))
                cur = q("DELETE FROM jobs WHERE status='succeeded' AND id NOT IN "
                        "(SELECT id FROM plans)")
                deleted += max(cur.rowcount, 0)
            if usage_older_than_s is not None:
                q(self._sql("DELETE FROM solver_usage WHERE at < {now} - ?"),
                  (usage_older_than_s,))
        return deleted

    # Plans
    def get_plan(self, job_id: str) -> str | None:
        rows = self._fetchall("SELECT plan FROM plans WHERE id=?", (job_id,))
        return str(rows[0][0]) if rows else None


class SqliteStore(Store):
    """One connection behind a lock; writes take SQLite's write lock up front (BEGIN
    IMMEDIATE), which also makes admission atomic across the workers sharing the file."""

    now_sql = "((julianday('now') - 2440587.5) * 86400.0)"
    kind = "sqlite"

    def __init__(self, path: Path, migrate: bool = True) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                                   timeout=10.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        if migrate:
            self.migrate()

    def _query(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self._db.execute(sql, tuple(params))

    @contextmanager
    def _tx(self) -> Iterator[Query]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._query
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[Query]:
        with self._lock:
            yield self._query

    @contextmanager
    def _migration_lock(self) -> Iterator[None]:
        # Other processes: each migration checks and applies itself under BEGIN IMMEDIATE.
        with self._lock:
            yield

    def close(self) -> None:
        with self._lock:
            self._db.close()


def open_store(settings: "ServiceSettings", migrate: bool = True) -> Store:
    """PostgreSQL when settings.database_url says so, else the SQLite file."""
    url = settings.database_url
    if url:
        if url.startswith(("postgresql://", "postgres://")):
            from api.store_pg import PostgresStore

            return PostgresStore(url, migrate=migrate)
        if url.startswith("sqlite:///"):
            return SqliteStore(Path(url.removeprefix("sqlite:///")), migrate=migrate)
        raise ValueError(f"PLANNER_DATABASE_URL: unsupported scheme in {url.split(':')[0]!r} "
                         "(postgresql://... or sqlite:///PATH)")
    return SqliteStore(settings.db_path, migrate=migrate)


__all__ = ["LATEST", "RETRYABLE", "UNFINISHED", "JobRow", "OverQuota", "QueueCounts", "QueueFull",
           "SolverQuota", "SqliteStore", "Store", "open_store"]
