"""Named API keys on a real server: stored hashed, two valid at once for one name
(rotation), re-read without a restart, per-key quotas (unfinished jobs: 429 with
Retry-After) and a per-key cap on time_limit_s; the legacy PLANNER_API_KEY still works."""

import json
import signal
import time
from pathlib import Path

import httpx
import pytest

from api.security import digest, new_key
from tests.api.conftest import long_request, small_request, start_server, wait_job

LONG_REQUEST = long_request()
# The solve team-c cancels: not team-b's request (its job's state would decide the answer).
SLOW_REQUEST = long_request(seed=7)


def _write(path: Path, entries: list[dict[str, object]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"keys": entries}))
    tmp.replace(path)  # atomic: the server never reads half a file


@pytest.mark.timeout(120)
def test_named_keys_rotation_reload_and_quotas(tmp_path: Path) -> None:
    old_a, new_a, b, c_key = new_key(), new_key(), new_key(), new_key()
    keys = tmp_path / "keys.json"
    entries: list[dict[str, object]] = [
        {"name": "team-a", "sha256": digest(old_a)},
        {"name": "team-a", "sha256": digest(new_a)},
        {"name": "team-b", "sha256": digest(b), "max_unfinished_jobs": 1,
         "max_time_limit_s": 5},
        {"name": "team-c", "sha256": digest(c_key), "max_solver_seconds": 1.0,
         "solver_seconds_window_s": 6}]
    _write(keys, entries)
    assert old_a not in keys.read_text()  # only digests at rest
    server = start_server(tmp_path, tmp_path / "keys.sqlite3", api_keys_file=keys,
                          api_key="legacy-key-1234")
    try:
        def get(key: str | None) -> int:
            headers = {"X-API-Key": key} if key else {}
            return httpx.get(server.url + "/v1/presets", headers=headers, timeout=10).status_code

        assert [get(k) for k in (old_a, new_a, b, "legacy-key-1234")] == [200] * 4
        assert get("pk_wrong") == 401 and get(None) == 401
        assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
        # Rotation done: the old key's entry is deleted; refused within ~1 s, no restart.
        _write(keys, entries[1:])
        deadline = time.monotonic() + 5
        while get(old_a) != 401 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert get(old_a) == 401 and get(new_a) == 200
        # A broken file keeps the keys in force.
        keys.write_text("{not json")
        time.sleep(1.2)
        assert get(new_a) == 200 and get(old_a) == 401

        with httpx.Client(base_url=server.url, headers={"X-API-Key": b}, timeout=30) as c:
            capped = c.post("/v1/plans", json=small_request(time_limit_s=10))
            assert capped.status_code == 422, capped.text
            assert capped.json()["field"] == "options.time_limit_s"
            assert "team-b" in capped.json()["detail"]
            first = c.post("/v1/plans", params={"mode": "async"}, json=LONG_REQUEST)
            assert first.status_code == 202, first.text
            over = c.post("/v1/plans", json=small_request(seed=31))
            assert over.status_code == 429 and over.headers["Retry-After"]
            assert over.json()["type"].endswith("quota-exceeded")
            # Another key is not held by team-b's quota.
            other = httpx.post(server.url + "/v1/plans", json=small_request(seed=31),
                               headers={"X-API-Key": new_a}, timeout=30)
            assert other.status_code == 202 or other.status_code == 201, other.text
            # Its job finished (or cancelled): room again.
            assert c.delete(f"/v1/jobs/{first.json()['id']}").status_code == 200
            again = c.post("/v1/plans", params={"mode": "async"}, json=small_request(seed=32))
            assert again.status_code == 202, again.text
            assert wait_job(c, again.json()["id"], 60)["status"] == "succeeded"

        # team-c may use 1 solver second per 6 s: a solve cancelled after ~1.5 s uses it up.
        with httpx.Client(base_url=server.url, headers={"X-API-Key": c_key}, timeout=30) as c:
            long = c.post("/v1/plans", params={"mode": "async"}, json=SLOW_REQUEST).json()
            assert wait_job(c, long["id"], 30, until=("running",))["status"] == "running"
            time.sleep(1.5)
            assert c.delete(f"/v1/jobs/{long['id']}").json()["status"] == "cancelled"
            refused = c.post("/v1/plans", json=small_request(seed=41))
            assert refused.status_code == 429, refused.text
            assert "solver seconds" in refused.json()["detail"]
            retry = int(refused.headers["Retry-After"])
            assert 1 <= retry <= 6
            # Another key is not charged for team-c's use.
            other = httpx.post(server.url + "/v1/plans", json=small_request(seed=41),
                               headers={"X-API-Key": new_a}, timeout=30)
            assert other.status_code in (200, 201), other.text
            time.sleep(retry + 0.2)
            later = c.post("/v1/plans", json=small_request(seed=42))
            assert later.status_code in (200, 201), later.text
    finally:
        server.kill(signal.SIGTERM)
