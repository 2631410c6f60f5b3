"""Liveness, readiness and Prometheus metrics."""

import asyncio
import contextlib

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from api.jobs import JobRunner
from api.metrics import Metrics
from api.openapi import json_content
from api.problems import NOT_READY, Problem, problem_response, responses
from api.schemas import Health, Readiness
from api.store import QueueCounts

health_router = APIRouter(tags=["health"])
metrics_router = APIRouter(tags=["health"])


def observe_queue(runner: JobRunner, counts: QueueCounts) -> None:
    runner.metrics.jobs_waiting.set(counts.queued)
    runner.metrics.jobs_running.set(counts.running)
    runner.metrics.queue_age.set(counts.oldest_queued_age_s)


@health_router.get("/healthz", summary="Liveness: the event loop answers",
                   responses={200: {"description": "alive", "content": json_content(Health)}})
async def healthz() -> Response:
    return JSONResponse({"status": "ok"})


@health_router.get("/readyz", summary="Readiness: the store answers, the solver pools run, and "
                                     "the queue has room",
                   description="503 while the store does not answer, the pools are starting, "
                               "or the queue is full (saturated: a POST would get 429).",
                   responses={200: {"description": "ready", "content": json_content(Readiness)},
                              **responses(503)})
async def readyz(request: Request) -> Response:
    runner: JobRunner = request.app.state.runner
    settings = runner.settings
    try:
        counts = await asyncio.to_thread(runner.store.counts)
    except Exception as exc:
        return problem_response(Problem(type=NOT_READY, title="Not ready", status=503,
                                        detail=f"store: {type(exc).__name__}: {exc}"))
    observe_queue(runner, counts)
    if not runner.ready:
        return problem_response(Problem(type=NOT_READY, title="Not ready", status=503,
                                        detail="the solver pool is not running"))
    if counts.queued >= settings.max_queued_jobs:
        return problem_response(
            Problem(type=NOT_READY, title="Saturated", status=503,
                    detail=f"saturated: {counts.queued} jobs queued, the limit is "
                           f"{settings.max_queued_jobs} (PLANNER_MAX_QUEUED_JOBS); "
                           f"{runner.solvers_busy} of {settings.max_concurrent_solves} "
                           "solver(s) here busy"),
            headers={"Retry-After": "5"})
    return JSONResponse(Readiness(
        status="ready", store=runner.store.kind, instance=runner.instance,
        solvers=settings.max_concurrent_solves, solvers_busy=runner.solvers_busy,
        jobs_queued=counts.queued, jobs_running=counts.running,
        max_queued_jobs=settings.max_queued_jobs,
        jobs_unfinished=counts.queued + counts.running).model_dump())


@metrics_router.get("/metrics", summary="Prometheus metrics",
                    responses={200: {"description": "Prometheus text format",
                                     "content": {"text/plain": {"schema": {"type": "string"}}}},
                               **responses(401)})
async def metrics(request: Request) -> Response:
    runner: JobRunner = request.app.state.runner
    with contextlib.suppress(Exception):  # the store down: the rest of the metrics still
        observe_queue(runner, await asyncio.to_thread(runner.store.counts))
    metrics: Metrics = request.app.state.metrics
    text = await asyncio.to_thread(metrics.exposition)
    return Response(text, media_type=CONTENT_TYPE_LATEST)
