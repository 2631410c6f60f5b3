"""Durable jobs and plans in SQLite (one embedded file; WAL, synchronous=FULL).

A job's final status and its plan are written in one transaction, so a finished job always has
its plan. Each server instance registers itself with a heartbeat; a job whose owner is gone
(a dead pid, our own pid from an earlier boot, or a stale heartbeat) is an orphan that the
next instance re-runs or marks failed, so no job is lost silently.
"""

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

UNFINISHED = ("queued", "running")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    request TEXT NOT NULL,
    tables INTEGER NOT NULL,
    time_limit_s REAL NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    owner_pid INTEGER,
    error TEXT,
    note TEXT
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs(status);
CREATE TABLE IF NOT EXISTS plans (
    id TEXT PRIMARY KEY,
    plan_hash TEXT NOT NULL,
    plan TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS instances (
    boot TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    heartbeat REAL NOT NULL
);
"""


@dataclass(frozen=True)
class JobRow:
    id: str
    status: str
    request: str
    tables: int
    time_limit_s: float
    created_at: float
    updated_at: float
    attempts: int
    owner: str | None
    owner_pid: int | None
    error: str | None  # a Problem as JSON, for infeasible, bad_input and failed
    note: str | None


_JOB_COLUMNS = ("id, status, request, tables, time_limit_s, created_at, updated_at, attempts, "
                "owner, owner_pid, error, note")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Store:
    """Thread-safe: one connection behind a lock; every call is one short transaction."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                                   timeout=10.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        with self._lock:
            self._db.executescript(_SCHEMA)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def ping(self) -> None:
        with self._lock:
            self._db.execute("SELECT 1").fetchone()

    # Instances
    def heartbeat(self, boot: str, pid: int) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO instances(boot, pid, heartbeat) VALUES (?, ?, ?) "
                       "ON CONFLICT(boot) DO UPDATE SET heartbeat=excluded.heartbeat",
                       (boot, pid, time.time()))

    def forget_instance(self, boot: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM instances WHERE boot=?", (boot,))

    # Jobs
    def get_job(self, job_id: str) -> JobRow | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id=?",
                                   (job_id,)).fetchone()
        return JobRow(*row) if row else None

    def create_job(self, job_id: str, request: str, tables: int, time_limit_s: float,
                   boot: str, pid: int) -> tuple[JobRow, bool]:
        """Insert a queued job owned by `boot`, or return the existing one (and False)."""
        now = time.time()
        with self._tx() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO jobs(id, status, request, tables, time_limit_s, "
                "created_at, updated_at, attempts, owner, owner_pid) "
                "VALUES (?, 'queued', ?, ?, ?, ?, ?, 0, ?, ?)",
                (job_id, request, tables, time_limit_s, now, now, boot, pid))
            created = cur.rowcount == 1
            row = db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,)).fetchone()
        return JobRow(*row), created

    def mark_running(self, job_id: str, boot: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE jobs SET status='running', attempts=attempts+1, updated_at=? "
                       "WHERE id=? AND owner=?", (time.time(), job_id, boot))

    def finish(self, job_id: str, boot: str, status: str, *, plan: str | None = None,
               plan_hash: str | None = None, error: str | None = None,
               note: str | None = None) -> None:
        """The job's final status, and its plan, in one transaction."""
        now = time.time()
        with self._tx() as db:
            if plan is not None:
                db.execute("INSERT OR REPLACE INTO plans(id, plan_hash, plan, created_at) "
                           "VALUES (?, ?, ?, ?)", (job_id, plan_hash, plan, now))
            db.execute("UPDATE jobs SET status=?, error=?, note=COALESCE(?, note), "
                       "updated_at=? WHERE id=? AND owner=?",
                       (status, error, note, now, job_id, boot))

    def count_unfinished(self) -> int:
        with self._lock:
            (n,) = self._db.execute("SELECT COUNT(*) FROM jobs WHERE status IN (?, ?)",
                                    UNFINISHED).fetchone()
        return int(n)

    def claim_orphans(self, boot: str, pid: int, stale_after_s: float) -> list[JobRow]:
        """Take over unfinished jobs whose owner is gone; they come back owned by `boot`."""
        now = time.time()
        with self._tx() as db:
            beats = dict(db.execute("SELECT boot, heartbeat FROM instances").fetchall())
            rows = [JobRow(*r) for r in db.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE status IN (?, ?) AND owner IS NOT ?",
                (*UNFINISHED, boot)).fetchall()]
            orphans = []
            for r in rows:
                beat = beats.get(r.owner)
                dead = (r.owner_pid is None or r.owner_pid == pid or not _pid_alive(r.owner_pid)
                        or beat is None or now - beat > stale_after_s)
                if dead:
                    db.execute("UPDATE jobs SET owner=?, owner_pid=?, updated_at=? WHERE id=?",
                               (boot, pid, now, r.id))
                    orphans.append(r)
            for b, beat in beats.items():
                if b != boot and now - beat > stale_after_s:
                    db.execute("DELETE FROM instances WHERE boot=?", (b,))
        return orphans

    def requeue(self, job_id: str, boot: str, note: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE jobs SET status='queued', note=?, updated_at=? "
                       "WHERE id=? AND owner=?", (note, time.time(), job_id, boot))

    # Plans
    def get_plan(self, job_id: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT plan FROM plans WHERE id=?", (job_id,)).fetchone()
        return str(row[0]) if row else None

    def retry_failed(self, job_id: str, boot: str, pid: int) -> JobRow | None:
        """Queue a failed job again under `boot`; None if it is no longer failed."""
        with self._tx() as db:
            cur = db.execute("UPDATE jobs SET status='queued', attempts=0, error=NULL, "
                             "note='re-run on request after a failure', owner=?, owner_pid=?, "
                             "updated_at=? WHERE id=? AND status='failed'",
                             (boot, pid, time.time(), job_id))
            if cur.rowcount != 1:
                return None
            row = db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id=?", (job_id,)).fetchone()
        return JobRow(*row)
