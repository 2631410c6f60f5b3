"""The service's settings: limits, storage, pool size and auth, read from `PLANNER_*` variables."""

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

_ENV_PREFIX = "PLANNER_"


@dataclass(frozen=True)
class ServiceSettings:
    db_path: Path = Path("planner-service.sqlite3")
    # When set, every /v1 route and /metrics need it (X-API-Key or Authorization: Bearer).
    api_key: str | None = None
    max_body_bytes: int = 8 * 2**20
    max_tables: int = 10_000
    max_gpus: int = 4096
    max_time_limit_s: float = 600.0
    # Concurrent solves = worker processes; jobs beyond them wait, up to max_queued_jobs.
    max_concurrent_solves: int = max(1, (os.cpu_count() or 2) - 1)
    max_queued_jobs: int = 256
    # A solve may run time_limit_s + solve_overhead_s, never more than job_timeout_s.
    solve_overhead_s: float = 60.0
    job_timeout_s: float = 900.0
    # POST /v1/plans waits this long for a small request before answering 202.
    sync_wait_s: float = 5.0
    sync_max_tables: int = 500
    # A job interrupted by a server stop is re-run until it has been started this often.
    max_attempts: int = 2
    heartbeat_s: float = 2.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> "ServiceSettings":
        """Defaults, then `PLANNER_<FIELD>` variables (e.g. PLANNER_DB_PATH), then overrides."""
        env = dict(os.environ) if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(_ENV_PREFIX + f.name.upper())
            if raw is None or raw == "":
                continue
            kind = type(getattr(cls, f.name)) if f.name != "api_key" else str
            values[f.name] = Path(raw) if kind is Path else kind(raw)
        values.update(overrides)
        return cls(**values)

    def solve_deadline_s(self, time_limit_s: float) -> float:
        return min(self.job_timeout_s, time_limit_s + self.solve_overhead_s)
