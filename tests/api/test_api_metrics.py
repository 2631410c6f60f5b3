"""Metrics with two uvicorn workers (`planner serve --workers 2`, Prometheus multiprocess
mode): whichever worker answers /metrics, the request counters are the server's total (they
used to jump between the workers' own counts), and each worker's process figures are there,
labelled by its pid."""

import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import start_server

REQUESTS = 40
SCRAPES = 8


def _samples(text: str, name: str) -> list[tuple[str, float]]:
    return [(m.group(1) or "", float(m.group(2))) for m in re.finditer(
        rf"^{name}(?:\{{(.*)\}})? (\S+)$", text, flags=re.M)]


@pytest.mark.timeout(150)
def test_two_workers_report_one_servers_metrics(tmp_path: Path) -> None:
    server = start_server(tmp_path, tmp_path / "m.sqlite3", workers=2)
    try:
        # Both workers up (the first /readyz may come from either): each reports its pid.
        deadline = time.monotonic() + 60
        while True:
            text = httpx.get(server.url + "/metrics", timeout=10).text
            pids = {re.search(r'worker="(\d+)"', labels).group(1)  # type: ignore[union-attr]
                    for labels, _ in _samples(text, "planner_worker_start_time_seconds")}
            if len(pids) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(pids) == 2, text
        for _ in range(REQUESTS):  # a new connection each: the kernel spreads them
            assert httpx.get(server.url + "/v1/presets", timeout=10).status_code == 200
        route = 'method="GET",route="/v1/presets",status="200"'
        seen = []
        for _ in range(SCRAPES):
            text = httpx.get(server.url + "/metrics", timeout=10).text
            counts = [v for labels, v in _samples(text, "planner_http_requests_total")
                      if route in labels]
            seen.append(sum(counts))
            memory = _samples(text, "planner_worker_resident_memory_bytes")
            assert len(memory) == 2 and all(v > 10e6 for _, v in memory), memory
            assert len(_samples(text, "planner_worker_open_fds")) == 2
            assert _samples(text, "planner_queue_oldest_age_seconds") == [("", 0.0)]
            assert _samples(text, "planner_solves_running") == [("", 0.0)]
        assert seen == [REQUESTS] * SCRAPES, seen
        print(f"\ntwo workers {sorted(pids)}: every scrape counts {REQUESTS} requests")
    finally:
        server.kill(signal.SIGTERM)
