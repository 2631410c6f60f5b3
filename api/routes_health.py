"""Liveness, readiness and Prometheus metrics."""

import asyncio

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.jobs import JobRunner
from api.openapi import json_content
from api.problems import NOT_READY, Problem, problem_response, responses
from api.schemas import Health, Readiness

health_router = APIRouter(tags=["health"])
metrics_router = APIRouter(tags=["health"])


@health_router.get("/healthz", summary="Liveness: the event loop answers",
                   responses={200: {"description": "alive", "content": json_content(Health)}})
async def healthz() -> Response:
    return JSONResponse({"status": "ok"})


@health_router.get("/readyz", summary="Readiness: the store answers and the solver pool runs",
                   responses={200: {"description": "ready", "content": json_content(Readiness)},
                              **responses(503)})
async def readyz(request: Request) -> Response:
    runner: JobRunner = request.app.state.runner
    try:
        await asyncio.to_thread(runner.store.ping)
        unfinished = await asyncio.to_thread(runner.store.count_unfinished)
    except Exception as exc:
        return problem_response(Problem(type=NOT_READY, title="Not ready", status=503,
                                        detail=f"store: {exc}"))
    if not runner.ready:
        return problem_response(Problem(type=NOT_READY, title="Not ready", status=503,
                                        detail="the solver pool is not running"))
    return JSONResponse(Readiness(status="ready", solvers=runner.settings.max_concurrent_solves,
                                  jobs_unfinished=unfinished).model_dump())


@metrics_router.get("/metrics", summary="Prometheus metrics",
                    responses={200: {"description": "Prometheus text format",
                                     "content": {"text/plain": {"schema": {"type": "string"}}}},
                               **responses(401)})
async def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry),
                    media_type=CONTENT_TYPE_LATEST)
