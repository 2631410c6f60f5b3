"""Schema migrations, shared by the SQLite and PostgreSQL stores (the SQL is written once, in
the subset both accept; `{now}` is the store's clock expression).

Rules that let a running deployment apply them (`planner db-upgrade`, or any replica at
start): a migration only adds (tables, nullable columns or columns with a default, indexes);
nothing is renamed or dropped, so replicas still running the previous version keep working
against the new schema. Each migration runs in its own transaction under the store's
migration lock and is recorded in `schema_migrations`; a database newer than this code is
used as it is (the additions are invisible to older code).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    # Version 1 is the schema the service had before migrations (IF NOT EXISTS: an existing
    # SQLite file of that version is adopted as it is).
    Migration(1, "jobs, plans, instances", (
        """CREATE TABLE IF NOT EXISTS jobs (
            id TEXT PRIMARY KEY,
            status TEXT NOT NULL,
            request TEXT NOT NULL,
            tables INTEGER NOT NULL,
            time_limit_s DOUBLE PRECISION NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            owner TEXT,
            owner_pid INTEGER,
            error TEXT,
            note TEXT)""",
        "CREATE INDEX IF NOT EXISTS jobs_status ON jobs(status)",
        """CREATE TABLE IF NOT EXISTS plans (
            id TEXT PRIMARY KEY,
            plan_hash TEXT NOT NULL,
            plan TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS instances (
            boot TEXT PRIMARY KEY,
            pid INTEGER NOT NULL,
            heartbeat DOUBLE PRECISION NOT NULL)""",
    )),
    # Leases replace owner pids: the holder, its expiry (the store's clock), and a fencing
    # token bumped by every claim, so only the current holder's write lands. `client` names
    # the API key that asked for the job (quotas). owner/owner_pid/instances stay, unused.
    Migration(2, "job leases and fencing tokens", (
        "ALTER TABLE jobs ADD COLUMN lease_owner TEXT",
        "ALTER TABLE jobs ADD COLUMN lease_expires DOUBLE PRECISION",
        "ALTER TABLE jobs ADD COLUMN fence BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN client TEXT",
        "CREATE INDEX IF NOT EXISTS jobs_status_created ON jobs(status, created_at)",
    )),
    # Solver seconds per API key (its quota over a sliding window): one row per solve attempt
    # (a job and its fencing token), written when the solve stops, whatever its outcome.
    Migration(3, "solver seconds used per key", (
        """CREATE TABLE IF NOT EXISTS solver_usage (
            job_id TEXT NOT NULL,
            fence BIGINT NOT NULL,
            client TEXT NOT NULL,
            seconds DOUBLE PRECISION NOT NULL,
            at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (job_id, fence))""",
        "CREATE INDEX IF NOT EXISTS solver_usage_client_at ON solver_usage(client, at)",
    )),
)

LATEST = MIGRATIONS[-1].version
