"""Prometheus metrics (prometheus-client), one registry per app, and the ASGI middleware that
times every request by its route template. With `--workers N` each worker process keeps its
own registry: scrape each, or run one worker per container."""

import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
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
        self.solves_running = Gauge("planner_solves_running", "Solves running now", registry=r)
        self.jobs_waiting = Gauge("planner_jobs_waiting",
                                  "Jobs waiting for a solver (the store's queue, all replicas)",
                                  registry=r)
        self.jobs_claimed = Counter("planner_jobs_claimed_total",
                                    "Jobs claimed by this instance (a lease taken)", registry=r)
        self.leases_lost = Counter("planner_leases_lost_total",
                                   "Leases lost while solving (cancelled, or taken over)",
                                   registry=r)
        self.fenced_writes_rejected = Counter(
            "planner_fenced_writes_rejected_total",
            "Results not written because the lease had passed to another holder", registry=r)


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
