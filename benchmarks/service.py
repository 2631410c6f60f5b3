"""Service load test: the real server (uvicorn, `planner serve`) on loopback, two phases.

1. Load: C concurrent clients (default 32) POST small plans for D seconds (default 60): the
   `criteo_kaggle` fixture on one `h100` host, each request with its own `options.seed`, so
   every request is a distinct job that is really solved (no answer from the job cache).
   Reported: throughput (answered requests per second), latency p50/p90/p99/max, statuses.
3. Replicas on PostgreSQL (a cluster started here, as tests/api/pg.py does): the same load
   at concurrency 1, 8 and 32 for one replica with 2 solvers and for two replicas with 1
   solver each (the same solver count on this 2-core machine: what sharing the queue
   through the database costs), R seconds each (default 15), a fresh database each.
4. Fuzzing: tests/api/test_api_schemathesis.py at PLANNER_FUZZ_SCALE (default 2.2: over
   2,000 generated requests over every operation); the test fails on any 5xx or any
   response outside the OpenAPI schema. `--only fuzz` re-runs this phase alone and keeps
   the other phases' stored results.
2. Health under a long solve: one request of N synthetic tables (`synthetic_1000` recipe,
   default 1,000 tables on one host, a solve of about 10 s here) is posted as a job; while it
   runs, one client GETs /healthz every 5 ms; reported: the solve's duration and
   /healthz p50/p99/max. Target: p99 under 50 ms (the solve runs in the process pool, not in
   the event loop).

The machine is shared: its load average is recorded before and after each phase.

Usage (from the repo root):
    PYTHONPATH=. python -m benchmarks.service                  # 60 s, 32 clients; writes results
    PYTHONPATH=. python -m benchmarks.service --duration 10 --no-write   # a quick look
"""

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from benchmarks import write_results
from fixtures.make_fixtures import synthetic_tables
from planner.presets import fixture_text

REPO_ROOT = Path(__file__).resolve().parent.parent
COMMAND = "PYTHONPATH=. python -m benchmarks.service"
HEALTH_TARGET_S = 0.050
HEALTH_PAUSE_S = 0.005  # between health calls: a probe, not a second CPU hog beside the solve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Server:
    """`planner serve` in its own process group; killed with the group on exit."""

    def __init__(self, tmp: Path, solvers: int, database_url: str | None = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
        env |= {"PLANNER_DB_PATH": str(tmp / "bench.sqlite3"),
                "PLANNER_MAX_CONCURRENT_SOLVES": str(solvers), "PLANNER_SYNC_WAIT_S": "60",
                "PLANNER_MAX_QUEUED_JOBS": "1024"}
        if database_url:
            env["PLANNER_DATABASE_URL"] = database_url
        self.log = (tmp / f"server-{self.port}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "planner.cli", "serve", "--host", "127.0.0.1", "--port",
             str(self.port), "--log-level", "warning"], cwd=REPO_ROOT, env=env,
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s: float = 60) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SystemExit("server did not become ready")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()


def small_request(seed: int) -> dict[str, Any]:
    return {"model": json.loads(fixture_text("criteo_kaggle")),
            "hardware": {"preset": "h100", "hosts": 1}, "options": {"seed": seed}}


async def load_phase(url: str | list[str], clients: int, duration_s: float) -> dict[str, Any]:
    """`clients` concurrent clients for duration_s; with several urls, client i posts to
    urls[i % len(urls)]."""
    urls = [url] if isinstance(url, str) else url
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    seeds = iter(range(1, 10**9))
    end = time.monotonic() + duration_s

    async def client(c: httpx.AsyncClient) -> None:
        while time.monotonic() < end:
            body = small_request(next(seeds))
            t0 = time.perf_counter()
            r = await c.post("/v1/plans", json=body)
            latencies.append(time.perf_counter() - t0)
            statuses[r.status_code] += 1

    load_before = os.getloadavg()
    limits = httpx.Limits(max_connections=clients)
    pools = [httpx.AsyncClient(base_url=u, timeout=120, limits=limits) for u in urls]
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(pools[i % len(pools)]) for i in range(clients)))
        wall = time.perf_counter() - t0
    finally:
        for pool in pools:
            await pool.aclose()
    return {"clients": clients, "duration_s": round(wall, 2), "requests": len(latencies),
            "throughput_rps": round(len(latencies) / wall, 2),
            "p50_s": round(_percentile(latencies, 0.50), 4),
            "p90_s": round(_percentile(latencies, 0.90), 4),
            "p95_s": round(_percentile(latencies, 0.95), 4),
            "p99_s": round(_percentile(latencies, 0.99), 4),
            "max_s": round(max(latencies), 4), "statuses": dict(sorted(statuses.items())),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()]}


def long_request(tables: int) -> dict[str, Any]:
    model = {"name": f"synthetic_{tables}", "batch_size_per_gpu": 1024,
             "fwd_comm_precision": "fp16", "bwd_comm_precision": "bf16",
             "tables": synthetic_tables(tables)}
    return {"model": model, "hardware": {"preset": "h100", "hosts": 1}}


async def health_phase(url: str, tables: int) -> dict[str, Any]:
    load_before = os.getloadavg()
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        r = await c.post("/v1/plans", params={"mode": "async"}, json=long_request(tables))
        job_id = r.json()["id"]
        while (await c.get(f"/v1/jobs/{job_id}")).json()["status"] == "queued":
            await asyncio.sleep(0.01)
        started = time.perf_counter()
        latencies: list[float] = []
        checked = time.perf_counter()
        status = "running"
        while status == "running":
            t0 = time.perf_counter()
            h = await c.get("/healthz")
            latencies.append(time.perf_counter() - t0)
            assert h.status_code == 200
            await asyncio.sleep(HEALTH_PAUSE_S)
            if time.perf_counter() - checked > 0.25:
                status = (await c.get(f"/v1/jobs/{job_id}")).json()["status"]
                checked = time.perf_counter()
        solve_s = time.perf_counter() - started
    return {"tables": tables, "solve_s": round(solve_s, 2), "job_status": status,
            "healthz_requests": len(latencies),
            "healthz_p50_s": round(_percentile(latencies, 0.50), 4),
            "healthz_p99_s": round(_percentile(latencies, 0.99), 4),
            "healthz_max_s": round(max(latencies), 4),
            "target_p99_s": HEALTH_TARGET_S,
            "holds": _percentile(latencies, 0.99) < HEALTH_TARGET_S,
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()]}


def fuzz_phase(scale: float) -> dict[str, Any]:
    import re

    env = dict(os.environ) | {"PLANNER_FUZZ_SCALE": str(scale)}
    test = "tests/api/test_api_schemathesis.py::test_generated_requests_get_no_5xx_and_conform"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                           test], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=1800, check=False)
    out = proc.stdout + proc.stderr
    found = re.search(r"schemathesis: (\d+) requests in ([\d.]+) s, operations (\d+)", out)
    return {"scale": scale, "passed": proc.returncode == 0,
            "requests": int(found[1]) if found else None,
            "seconds": float(found[2]) if found else None,
            "operations": int(found[3]) if found else None,
            "failure": None if proc.returncode == 0 else out[-3000:]}


def fuzz_markdown(fuzz: dict[str, Any]) -> str:
    if not fuzz:
        return ""
    verdict = ("0 server errors and 0 responses outside the schema" if fuzz["passed"] else
               "FAILED:\n\n```\n" + str(fuzz["failure"]) + "\n```")
    if fuzz.get("requests") is None:  # the test failed before its summary line
        fuzz = fuzz | {"requests": 0, "operations": "?", "seconds": 0.0}
    return f"""
## Fuzzing: Schemathesis over every operation

`tests/api/test_api_schemathesis.py` with `PLANNER_FUZZ_SCALE={fuzz['scale']:g}`:
{fuzz['requests']:,} generated requests (valid and invalid) over {fuzz['operations']}
operations in {fuzz['seconds']:.1f} s against a live server; checks: no 5xx (the one
documented 503, /readyz while the queue is full, aside), status code, content type and body
conform to the OpenAPI schema. Result: {verdict}.
"""


def replicas_phase(tmp: Path, duration_s: float) -> list[dict[str, Any]]:
    from tests.api.pg import postgres_server

    rows = []
    with postgres_server() as pg:
        for replicas, solvers in ((1, 2), (2, 1)):
            for clients in (1, 8, 32):
                url = pg.new_database()
                servers = [Server(tmp, solvers, database_url=url) for _ in range(replicas)]
                try:
                    for s in servers:
                        s.wait_ready()
                    row = asyncio.run(load_phase([s.url for s in servers], clients,
                                                 duration_s))
                finally:
                    for s in servers:
                        s.stop()
                row |= {"replicas": replicas, "solvers_each": solvers}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def _statuses(row: dict[str, Any]) -> dict[int, int]:
    """Status counts with int keys (stored JSON has them as strings)."""
    return {int(k): v for k, v in row["statuses"].items()}


def replicas_markdown(rows: list[dict[str, Any]]) -> str:
    ms = 1000.0
    lines = ["| replicas x solvers | clients | requests | throughput | p50 | p95 | p99 | max | "
             "statuses | load before / after (1 min) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['replicas']} x {r['solvers_each']} | {r['clients']} | {r['requests']:,} | "
            f"{r['throughput_rps']:.1f} req/s | {r['p50_s'] * ms:.0f} ms | "
            f"{r['p95_s'] * ms:.0f} ms | {r['p99_s'] * ms:.0f} ms | {r['max_s'] * ms:.0f} ms | "
            f"{_statuses(r)} | {r['load_before'][0]} / {r['load_after'][0]} |")
    return "\n".join(lines)


def markdown(meta: dict[str, Any], load: dict[str, Any], health: dict[str, Any],
             replicas: list[dict[str, Any]] | None = None,
             fuzz: dict[str, Any] | None = None) -> str:
    ms = 1000.0
    replica_text = "" if not replicas else f"""
## Replicas on PostgreSQL: concurrency 1, 8 and 32

The same requests against a PostgreSQL store (a local cluster, fsync off), for one replica
with 2 solver processes and for two replicas with 1 each (clients split between them): the
same solver count on this 2-core machine, so the difference is what sharing the queue
through the database costs (claims, polling for other replicas' results).
{replicas[0]['duration_s']:.0f} s per row, a fresh database each.

{replicas_markdown(replicas)}
"""
    return f"""# Service load test

The real server (`planner serve`, uvicorn, {meta['solvers']} solver process(es), SQLite store)
on loopback. Machine: {meta['cpus']} CPUs, shared with other work (load averages below),
Python {meta['python']}, {meta['platform']}.

## Load: {load['clients']} clients posting small plans for {load['duration_s']} s

Every request is `criteo_kaggle` on one `h100` host with its own seed: a distinct job,
really solved in the process pool and stored, answered synchronously (201).

| requests | throughput | p50 | p90 | p99 | max | statuses | load before / after (1 min) |
|---:|---:|---:|---:|---:|---:|---|---|
| {load['requests']:,} | {load['throughput_rps']:.1f} req/s | {load['p50_s'] * ms:.0f} ms | \
{load['p90_s'] * ms:.0f} ms | {load['p99_s'] * ms:.0f} ms | {load['max_s'] * ms:.0f} ms | \
{_statuses(load)} | {load['load_before'][0]} / {load['load_after'][0]} |

Latency here is mostly waiting for a solver: {load['clients']} clients over \
{meta['solvers']} solver(s) wait about clients / throughput = \
{load['clients'] / load['throughput_rps']:.2f} s each (Little's law).

## /healthz while a long solve runs

A job of {health['tables']:,} synthetic tables on one host solved for {health['solve_s']} s
({health['job_status']}); meanwhile one client called /healthz every 5 ms
({health['healthz_requests']:,} calls).

| p50 | p99 | max | target p99 | holds |
|---:|---:|---:|---:|---|
| {health['healthz_p50_s'] * ms:.1f} ms | {health['healthz_p99_s'] * ms:.1f} ms | \
{health['healthz_max_s'] * ms:.1f} ms | {health['target_p99_s'] * ms:.0f} ms | \
{'yes' if health['holds'] else 'no'} |

{replica_text}{fuzz_markdown(fuzz or {})}
Reproduce (from the repo root):

```
{meta['command']}
```
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=60.0, help="load phase, seconds")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--solvers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--long-tables", type=int, default=1000,
                    help="tables of the long solve of the health phase")
    ap.add_argument("--replica-duration", type=float, default=15.0,
                    help="seconds per row of the replicas phase (0: skip it)")
    ap.add_argument("--fuzz-scale", type=float, default=2.2,
                    help="PLANNER_FUZZ_SCALE of the fuzzing phase (0: skip it)")
    ap.add_argument("--only", choices=["fuzz"], help="re-run this phase alone; the others' "
                    "results are kept from benchmarks/results/service.json")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args(argv)
    meta = {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "solvers": args.solvers,
            "command": COMMAND + ("" if args.duration == 60 and args.clients == 32
                                  else f" --duration {args.duration:g} --clients {args.clients}")}
    if args.only == "fuzz":
        from benchmarks import RESULTS

        stored = json.loads((RESULTS / "service.json").read_text())
        stored["fuzz"] = fuzz_phase(args.fuzz_scale)
        print(json.dumps(stored["fuzz"]), flush=True)
        text = markdown(stored["meta"], stored["load"], stored["health"],
                        stored.get("replicas"), stored["fuzz"])
        print(text)
        if not args.no_write:
            write_results("service", stored, text)
        return 0 if stored["fuzz"]["passed"] else 1
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp), args.solvers)
        try:
            server.wait_ready()
            load = asyncio.run(load_phase(server.url, args.clients, args.duration))
            print(json.dumps(load), flush=True)
            health = asyncio.run(health_phase(server.url, args.long_tables))
            print(json.dumps(health), flush=True)
        finally:
            server.stop()
        replicas = (replicas_phase(Path(tmp), args.replica_duration)
                    if args.replica_duration > 0 else [])
    fuzz = fuzz_phase(args.fuzz_scale) if args.fuzz_scale > 0 else {}
    text = markdown(meta, load, health, replicas, fuzz)
    print(text)
    if not args.no_write:
        write_results("service", {"meta": meta, "load": load, "health": health,
                                  "replicas": replicas, "fuzz": fuzz}, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
