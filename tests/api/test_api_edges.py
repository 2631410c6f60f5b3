"""Bounded edges and strict input on a real server.

Strict input (the shared live server): JSON nested past the limit and integers of thousands
of digits are 422 problems (they were 500s), NaN is not a number, booleans are not numbers
(only `pipelined` takes one), and a body that is not JSON by its content type is 415.

Slow clients (a server of their own, with short timeouts so the test stays short): 1,000
connections that send half a header and stop: /healthz answers in < 50 ms typically and
never waits for their header timeout, the
server's memory grows by little, connections past the cap are closed at once, and the
half-open ones are closed when the header timeout passes; a body that stops arriving is 408;
bodies held open just short of the limit share a byte budget (503 beyond it)."""

import contextlib
import json
import selectors
import signal
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import small_request, start_server

PROBLEM = "application/problem+json"


@pytest.mark.timeout(60)
def test_strict_json(client: httpx.Client) -> None:
    json_header = {"Content-Type": "application/json"}
    deep = b'{"model": ' + b"[" * 5000 + b"]" * 5000 + b', "hardware": {"preset": "h100"}}'
    nested = b'{"model": ' + b'{"a": ' * 100 + b"1" + b"}" * 100 + b', "hardware": {}}'
    huge_int = json.dumps(small_request()).replace('"hosts": 1', '"hosts": ' + "9" * 5000)
    for path in ("/v1/plans", "/v1/check", "/v1/evaluate"):
        for body, says in ((deep, "nested deeper than"), (nested, "nested deeper than"),
                           (huge_int.encode(), "5,000 digits")):
            r = client.post(path, content=body, headers=json_header)
            assert r.status_code == 422, (path, r.status_code, r.text[:200])
            assert r.headers["content-type"] == PROBLEM and says in r.json()["detail"], r.text
    nan = json.dumps(small_request()).replace('"hosts": 1', '"hosts": NaN')
    r = client.post("/v1/plans", content=nan, headers=json_header)
    assert r.status_code == 422 and "NaN" in r.json()["detail"]
    # Booleans are not numbers, anywhere (overrides included); `pipelined` is a boolean.
    req = small_request()
    req["model"]["tables"][2]["pooling_factor"] = True
    r = client.post("/v1/plans", json=req)
    assert r.status_code == 422 and r.json()["field"] == "model.tables[2].pooling_factor"
    req = small_request()
    req["hardware"]["overrides"] = {"gpu": {"hbm_bandwidth_gb_per_s": False}}
    r = client.post("/v1/plans", json=req)
    assert r.status_code == 422
    assert r.json()["field"] == "hardware.overrides.gpu.hbm_bandwidth_gb_per_s"
    req = small_request(seed=21)
    req["model"]["pipelined"] = True
    assert client.post("/v1/plans", json=req).status_code == 201


@pytest.mark.timeout(60)
def test_content_type_is_checked(client: httpx.Client) -> None:
    body = json.dumps(small_request()).encode()
    for content_type in (None, "text/plain", "application/x-www-form-urlencoded",
                         "application/json; charset=latin-1", "multipart/form-data"):
        headers = {"Content-Type": content_type} if content_type else {}
        for path in ("/v1/plans", "/v1/check", "/v1/evaluate"):
            r = client.post(path, content=body, headers=headers)
            assert r.status_code == 415, (path, content_type, r.status_code)
            assert r.headers["content-type"] == PROBLEM
    for content_type in ("application/json; charset=utf-8", "application/problem+json"):
        r = client.post("/v1/plans", content=body, headers={"Content-Type": content_type})
        assert r.status_code in (200, 201), (content_type, r.text)


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _closed_by_server(socks: list[socket.socket], within_s: float) -> int:
    """How many of `socks` the server closes (EOF or reset) within within_s."""
    closed = 0
    end = time.monotonic() + within_s
    with selectors.DefaultSelector() as sel:  # epoll: descriptors past 1,024
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        while closed < len(socks) and time.monotonic() < end:
            for key, _ in sel.select(0.05):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                if not data or data.startswith((b"HTTP/1.1 4", b"HTTP/1.1 5")):
                    closed += 1
                    sel.unregister(s)
    return closed


def _half_open(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"POST /v1/plans HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        socks.append(s)
    return socks


def _raw_response(s: socket.socket, timeout_s: float) -> bytes:
    s.settimeout(timeout_s)
    got = b""
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in got:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    return got


@pytest.mark.timeout(120)
def test_slow_clients(tmp_path: Path) -> None:
    header_s, body_s, cap = 2.0, 1.5, 1100
    server = start_server(tmp_path, tmp_path / "edge.sqlite3", header_timeout_s=header_s,
                          body_timeout_s=body_s, max_connections=cap,
                          max_body_bytes=2 * 2**20, max_body_bytes_in_flight=6 * 2**20)
    port = int(server.url.rsplit(":", 1)[1])
    socks: list[socket.socket] = []
    try:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            assert c.get("/healthz").status_code == 200
        rss_before = _rss_kib(server.proc.pid)
        t_open = time.monotonic()
        socks = _half_open(port, 1000)
        # Measured while they are held open (the accept burst itself takes the loop ~0.1 s).
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert _raw_response(s, 5).startswith(b"HTTP/1.1 200")
        # /healthz from fresh connections while the 1,000 hang: fast throughout.
        latencies: list[float] = []
        while time.monotonic() - t_open < header_s * 0.8:
            t0 = time.perf_counter()
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert _raw_response(s, 5).startswith(b"HTTP/1.1 200")
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.02)
        grown_kib = _rss_kib(server.proc.pid) - rss_before
        # Past the cap: closed at once, nothing read; "at once" is well before their own
        # header timeout (a loaded machine once closed none within 0.5 s).
        extra = _half_open(port, 150)
        refused = _closed_by_server(extra, header_s / 2)
        # The half-open ones: closed when the header timeout passes.
        closed = _closed_by_server(socks, header_s + 3)
        closed_s = time.monotonic() - t_open
        for s in extra:
            s.close()
        # A loop blocked by the hanging connections would answer only after their header
        # timeout (2 s); a loaded 2-CPU machine alone delays one request by ~0.1 s now and
        # then (106 ms seen once in a CI-equivalent run), so the bound is between the two,
        # and the typical request must stay fast.
        assert max(latencies) < header_s / 4, sorted(latencies)[-5:]
        assert statistics.median(latencies) < 0.050, sorted(latencies)
        assert grown_kib < 40 * 1024, f"server grew by {grown_kib} KiB"
        assert refused >= 150 - (cap - 1000), refused
        assert closed == 1000, closed
        print(f"\n1,000 half-open connections: /healthz max {max(latencies) * 1000:.1f} ms over "
              f"{len(latencies)} calls, server +{grown_kib / 1024:.1f} MiB, {refused}/150 past "
              f"the cap closed at once, all closed after {closed_s:.1f} s")

        # A body that stops arriving: 408.
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"POST /v1/plans HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n{\"model\": ")
        t0 = time.monotonic()
        answer = _raw_response(s, body_s + 5)
        s.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
        assert time.monotonic() - t0 < body_s + 2

        # Headers past the size limit: refused, not buffered.
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n")
        answer = _raw_response(s, 5)
        s.close()
        assert answer.startswith(b"HTTP/1.1 431"), answer[:100]

        # Ten bodies held 10 bytes short of 2 MiB: the 6 MiB budget lets some in and
        # answers the rest 503 at once; all are gone after the body timeout.
        results: list[Any] = []

        def short_body() -> None:
            size = 2 * 2**20 - 100
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(b"POST /v1/plans HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          b"application/json\r\nContent-Length: " + str(size).encode() +
                          b"\r\n\r\n")
                with contextlib.suppress(OSError):
                    s.sendall(b" " * (size - 10))
                results.append(_raw_response(s, body_s + 5)[:12])

        rss_before = _rss_kib(server.proc.pid)
        threads = [threading.Thread(target=short_body) for _ in range(10)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        grown_kib = _rss_kib(server.proc.pid) - rss_before
        for t in threads:
            t.join(timeout=20)
        statuses = sorted(r.decode() for r in results)
        assert len(statuses) == 10, statuses
        assert "HTTP/1.1 503" in statuses and "HTTP/1.1 408" in statuses, statuses
        assert grown_kib < 40 * 1024, f"server grew by {grown_kib} KiB"
        with httpx.Client(base_url=server.url, timeout=10) as c:
            assert c.get("/healthz").status_code == 200
    finally:
        for s in socks:
            s.close()
        server.kill(signal.SIGTERM)
