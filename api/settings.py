"""The service's settings: limits, storage, pool size and auth, read from `PLANNER_*` variables."""

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

_ENV_PREFIX = "PLANNER_"
# Fields whose default is None: their type when set.
_OPTIONAL: dict[str, type] = {"api_key": str, "database_url": str, "audit_log": Path,
                              "api_keys_file": Path}


@dataclass(frozen=True)
class ServiceSettings:
    db_path: Path = Path("planner-service.sqlite3")
    # postgresql://user:pass@host/db: jobs and plans in PostgreSQL, shared by replicas (then
    # db_path is unused); sqlite:///PATH is the same as db_path.
    database_url: str | None = None
    # When set, every /v1 route and /metrics need it (X-API-Key or Authorization: Bearer).
    api_key: str | None = None
    # Named keys, hashed, with quotas; re-read when the file changes (api/security.py).
    api_keys_file: Path | None = None
    max_body_bytes: int = 8 * 2**20
    # The edge (api/server.py, api/body.py): open connections, a request's headers and body
    # must arrive within these times, idle keep-alive connections are closed, headers are
    # at most max_header_bytes, and all bodies being read at once share a byte budget.
    max_connections: int = 2048
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    max_header_bytes: int = 16 * 2**10
    max_body_bytes_in_flight: int = 64 * 2**20
    # JSON bodies: nesting depth, and digits of an integer.
    max_json_depth: int = 64
    max_int_digits: int = 30
    max_tables: int = 10_000
    max_gpus: int = 4096
    max_time_limit_s: float = 600.0
    # Concurrent solves = worker processes; jobs beyond them wait, up to max_queued_jobs.
    max_concurrent_solves: int = max(1, (os.cpu_count() or 2) - 1)
    max_queued_jobs: int = 256
    # Processes for /v1/check and /v1/evaluate: a pool of their own, never behind a solve.
    tool_workers: int = 1
    # A solve may run time_limit_s + solve_overhead_s, never more than job_timeout_s.
    solve_overhead_s: float = 60.0
    job_timeout_s: float = 900.0
    # POST /v1/plans waits this long for a small request before answering 202.
    sync_wait_s: float = 5.0
    sync_max_tables: int = 500
    # A job interrupted by a server stop is re-run until it has been started this often.
    max_attempts: int = 2
    # A claimed job's lease lasts lease_ttl_s and is renewed every lease_renew_s while it
    # solves; another replica takes the job over only once the lease has expired. A cancel
    # reaches the solve within lease_renew_s. Idle replicas look for queued jobs every
    # claim_poll_s (at once for jobs posted to themselves).
    lease_ttl_s: float = 15.0
    lease_renew_s: float = 1.0
    claim_poll_s: float = 0.25
    # Retention (0: keep): finished jobs and their plans are deleted retention_days after
    # they finished, and plans beyond the newest max_plans; checked every cleanup_every_s.
    retention_days: float = 0.0
    max_plans: int = 0
    cleanup_every_s: float = 300.0
    # Solver usage (the keys' solver-seconds quotas) is kept this long: past every window.
    solver_usage_keep_s: float = 7 * 86400.0
    # A JSON line per claim, solve, fenced write and release (for audits and the tests).
    audit_log: Path | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> "ServiceSettings":
        """Defaults, then `PLANNER_<FIELD>` variables (e.g. PLANNER_DB_PATH), then overrides."""
        env = dict(os.environ) if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(_ENV_PREFIX + f.name.upper())
            if raw is None or raw == "":
                continue
            kind = _OPTIONAL.get(f.name) or type(getattr(cls, f.name))
            values[f.name] = Path(raw) if kind is Path else kind(raw)
        values.update(overrides)
        return cls(**values)

    def solve_deadline_s(self, time_limit_s: float) -> float:
        return min(self.job_timeout_s, time_limit_s + self.solve_overhead_s)
