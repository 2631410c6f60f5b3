"""Prometheus metrics (prometheus-client) and the ASGI middleware that times every request by
its route template.

One worker: one registry per app, plus the standard process and platform collectors. Several
workers (`planner serve --workers N`, which sets PROMETHEUS_MULTIPROC_DIR): prometheus-client's
multiprocess mode, where every worker writes its samples to files in that directory and
/metrics, whichever worker answers, adds them all up, so counters and histograms are the
server's, not one worker's. Gauges say how they combine: solves running is the live sum over
workers, the store's queue figures are the most recent any worker read, and each worker's
process figures (memory, CPU, open files) are labelled with its pid."""

import contextlib
import os
import resource
import time
from dataclasses import dataclass, field

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    multiprocess,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = resource.getpagesize()


def multiprocess_dir() -> str | None:
    """The directory of multiprocess mode, when it is on."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.multiprocess = multiprocess_dir() is not None
        if not self.multiprocess:
            # What the default registry would have: this process's CPU, memory, files, GC.
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        self.requests = Counter("planner_http_requests_total", "HTTP requests answered",
                                ["method", "route", "status"], registry=r)
        self.latency = Histogram("planner_http_request_duration_seconds",
                                 "HTTP request latency", ["method", "route"], registry=r,
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1,
                                          2.5, 5, 10, 30))
        self.jobs = Counter("planner_jobs_finished_total", "Jobs finished, by final status",
                            ["status"], registry=r)
        self.solve_seconds = Histogram("planner_solve_duration_seconds",
                                       "Wall time of a solve in the process pool", registry=r,
                                       buckets=(.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300))
        self.solves_running = Gauge("planner_solves_running", "Solves running now", registry=r,
                                    multiprocess_mode="livesum")
        self.jobs_waiting = Gauge("planner_jobs_waiting",
                                  "Jobs waiting for a solver (the store's queue, all replicas)",
                                  registry=r, multiprocess_mode="mostrecent")
        self.jobs_running = Gauge("planner_jobs_running",
                                  "Jobs being solved (the store's, all replicas)", registry=r,
                                  multiprocess_mode="mostrecent")
        self.queue_age = Gauge("planner_queue_oldest_age_seconds",
                               "How long the oldest job waiting for a solver has waited (0: "
                               "none waits)", registry=r, multiprocess_mode="mostrecent")
        self.jobs_claimed = Counter("planner_jobs_claimed_total",
                                    "Jobs claimed by this instance (a lease taken)", registry=r)
        self.leases_lost = Counter("planner_leases_lost_total",
                                   "Leases lost while solving (cancelled, or taken over)",
                                   registry=r)
        self.fenced_writes_rejected = Counter(
            "planner_fenced_writes_rejected_total",
            "Results not written because the lease had passed to another holder", registry=r)
        # Each server worker's own process, by pid (in both modes; with one worker, the
        # standard process_* metrics say the same).
        self.worker_memory = Gauge("planner_worker_resident_memory_bytes",
                                   "Resident memory of a server worker process", ["worker"],
                                   registry=r, multiprocess_mode="liveall")
        self.worker_cpu = Gauge("planner_worker_cpu_seconds",
                                "CPU time (user + system) a server worker process has used",
                                ["worker"], registry=r, multiprocess_mode="liveall")
        self.worker_fds = Gauge("planner_worker_open_fds",
                                "Open file descriptors (connections included) of a server "
                                "worker process", ["worker"], registry=r,
                                multiprocess_mode="liveall")
        self.worker_start = Gauge("planner_worker_start_time_seconds",
                                  "When a server worker process started (Unix time)",
                                  ["worker"], registry=r, multiprocess_mode="liveall")
        self._pid = str(os.getpid())
        self.worker_start.labels(self._pid).set(time.time())
        self.sample_process()

    def sample_process(self) -> None:
        """This worker's memory, CPU and open files, from /proc (Linux; else left as is)."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{self._pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            self.worker_cpu.labels(self._pid).set(
                (int(fields[11]) + int(fields[12])) / _CLK_TCK)
            self.worker_memory.labels(self._pid).set(int(fields[21]) * _PAGE)
            self.worker_fds.labels(self._pid).set(len(os.listdir(f"/proc/{self._pid}/fd")))

    def exposition(self) -> bytes:
        """The text /metrics answers: every worker's samples in multiprocess mode."""
        self.sample_process()
        if not self.multiprocess:
            return generate_latest(self.registry)
        forget_dead_workers()
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)

    def close(self) -> None:
        """A worker stopping: its live gauges leave the sum (its counters stay)."""
        if self.multiprocess:
            with contextlib.suppress(OSError):
                multiprocess.mark_process_dead(os.getpid())


def forget_dead_workers() -> None:
    """Live gauges of worker processes that are gone (killed, or replaced by uvicorn): their
    files are removed, as a stopping worker does itself."""
    path = multiprocess_dir()
    if path is None:
        return
    with contextlib.suppress(OSError):
        for name in os.listdir(path):
            if not (name.startswith("gauge_live") and name.endswith(".db")):
                continue
            pid = name.rsplit("_", 1)[-1].removesuffix(".db")
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                with contextlib.suppress(OSError):
                    multiprocess.mark_process_dead(int(pid), path)


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "(unmatched)"
            method = scope.get("method", "")
            self.metrics.requests.labels(method, path, str(status)).inc()
            self.metrics.latency.labels(method, path).observe(time.perf_counter() - start)
