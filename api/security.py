"""API keys: when PLANNER_API_KEY or PLANNER_API_KEYS_FILE is set, /v1 and /metrics need a
key as `X-API-Key: KEY` or `Authorization: Bearer KEY`; /healthz and /readyz stay open.

PLANNER_API_KEYS_FILE names a JSON file of named keys, stored only as SHA-256 digests (keys
are random 256-bit tokens, so a fast hash is enough), each with optional quotas:

    {"keys": [{"name": "team-a", "sha256": "<hex>", "max_unfinished_jobs": 8,
               "max_time_limit_s": 120, "max_solver_seconds": 3600,
               "solver_seconds_window_s": 3600}]}

max_solver_seconds: the wall time its solves may take over any solver_seconds_window_s
(default an hour), counted in the store across replicas; over it, POST /v1/plans is 429
with Retry-After (when enough of the use leaves the window).

Two entries with one name are two valid keys for it: add the new key, move clients, delete
the old entry (rotation). The file is re-read when it changes (checked at most once a
second), without a restart; a file that does not parse keeps the keys read before.
`planner api-key NAME` makes a key and prints its entry. PLANNER_API_KEY (one plain key,
no quotas) still works, as the key named "default".
"""

import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from api.problems import UNAUTHORIZED, Problem, ProblemError
from api.settings import ServiceSettings
from api.store import SolverQuota

log = logging.getLogger("planner.service")

api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False,
                              description="an API key of this server, when it has keys")
bearer = HTTPBearer(auto_error=False, description="an API key of this server, when it has keys")
_RELOAD_EVERY_S = 1.0
_KEY_FIELDS = {"name", "sha256", "max_unfinished_jobs", "max_time_limit_s", "max_solver_seconds",
               "solver_seconds_window_s"}


@dataclass(frozen=True)
class ApiKey:
    name: str
    sha256: str
    max_unfinished_jobs: int | None = None  # queued + running jobs it asked for
    max_time_limit_s: float | None = None  # its cap on options.time_limit_s
    max_solver_seconds: float | None = None  # solver wall time over the window
    solver_seconds_window_s: float = 3600.0

    def solver_quota(self) -> SolverQuota | None:
        if self.max_solver_seconds is None:
            return None
        return SolverQuota(max_s=self.max_solver_seconds, window_s=self.solver_seconds_window_s)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return "pk_" + secrets.token_urlsafe(32)


def parse_keys(text: str) -> list[ApiKey]:
    data = json.loads(text)
    keys = []
    for entry in data["keys"]:
        if set(entry) - _KEY_FIELDS:
            raise ValueError(f"unknown fields in key entry {entry.get('name')!r}")
        for field in _KEY_FIELDS - {"name", "sha256"}:
            value = entry.get(field)
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, int | float) or not value > 0):
                raise ValueError(f"key {entry.get('name')!r}: {field} must be a number > 0")
        sha = str(entry["sha256"]).lower()
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise ValueError(f"key {entry.get('name')!r}: sha256 is not 64 hex digits")
        keys.append(ApiKey(name=str(entry["name"]), sha256=sha,
                           max_unfinished_jobs=entry.get("max_unfinished_jobs"),
                           max_time_limit_s=entry.get("max_time_limit_s"),
                           max_solver_seconds=entry.get("max_solver_seconds"),
                           solver_seconds_window_s=float(
                               entry.get("solver_seconds_window_s") or 3600.0)))
    return keys


class KeyRing:
    """The keys in force: the file's (re-read when it changes) and PLANNER_API_KEY."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.path: Path | None = settings.api_keys_file
        self.legacy = (ApiKey(name="default", sha256=digest(settings.api_key))
                       if settings.api_key else None)
        self._keys: list[ApiKey] = []
        self._stamp: tuple[float, int] | None = None
        self._checked = 0.0
        self._lock = threading.Lock()
        self.reload()

    @property
    def enabled(self) -> bool:
        return self.path is not None or self.legacy is not None

    def reload(self) -> None:
        if self.path is None:
            return
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime, st.st_size)
            if stamp == self._stamp:
                return
            keys = parse_keys(self.path.read_text())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("API keys file %s not (re)loaded, keeping %d key(s): %s", self.path,
                      len(self._keys), exc)
            return
        self._keys, self._stamp = keys, stamp
        log.info("API keys: %d loaded from %s", len(keys), self.path)

    def lookup(self, given: str) -> ApiKey | None:
        now = time.monotonic()
        if now - self._checked > _RELOAD_EVERY_S:
            with self._lock:
                self._checked = now
                self.reload()
        want = digest(given)
        found = None
        for key in (*self._keys, *((self.legacy,) if self.legacy else ())):
            if hmac.compare_digest(key.sha256, want):
                found = key
        return found


async def require_api_key(
    request: Request,
    key: Annotated[str | None, Depends(api_key_header)],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """Installed on the routers only when keys are configured, so the OpenAPI schema says
    so. The key found is `request.state.api_key` (its name goes on the jobs it asks for)."""
    ring: KeyRing = request.app.state.keys
    if not ring.enabled:
        return
    given = key if key is not None else (creds.credentials if creds is not None else None)
    found = ring.lookup(given) if given else None
    if found is None:
        raise ProblemError(
            Problem(type=UNAUTHORIZED, title="Unauthorized", status=401,
                    detail="this server needs an API key: X-API-Key or Authorization: Bearer"),
            headers={"WWW-Authenticate": 'Bearer realm="planner"'})
    request.state.api_key = found


def key_of(request: Request) -> ApiKey | None:
    found: Any = getattr(request.state, "api_key", None)
    return found if isinstance(found, ApiKey) else None
