"""Reading request bodies: the size limit (413), parsing through planner.validation (422 naming
the field and table, as the CLI does), the service's limits, and the job id."""

import asyncio
from dataclasses import dataclass
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel

from api.problems import TOO_LARGE, Problem, ProblemError, limit_exceeded
from api.settings import ServiceSettings
from planner.hashing import canonical_json, content_hash
from planner.planning import resolve
from planner.spec import PlanRequest, ResolvedRequest
from planner.validation import parse_json_model

M = TypeVar("M", bound=BaseModel)


def _too_large(limit: int) -> ProblemError:
    return ProblemError(Problem(type=TOO_LARGE, title="Request body too large", status=413,
                                detail=f"the body is over this server's limit of {limit:,} "
                                       "bytes (PLANNER_MAX_BODY_BYTES)"))


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it passes `limit` bytes (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def check_size(req: ResolvedRequest, settings: ServiceSettings) -> None:
    tables = len(req.model.tables)
    if tables > settings.max_tables:
        raise ProblemError(limit_exceeded(
            "model.tables", f"{tables:,} tables; this server plans at most "
                            f"{settings.max_tables:,} (PLANNER_MAX_TABLES)"))
    gpus = req.hardware.hosts * req.hardware.gpus_per_host
    if gpus > settings.max_gpus:
        raise ProblemError(limit_exceeded(
            "hardware.hosts", f"{gpus:,} GPUs; this server plans for at most "
                              f"{settings.max_gpus:,} (PLANNER_MAX_GPUS)"))


@dataclass(frozen=True)
class PreparedPlanRequest:
    job_id: str  # the content hash of the resolved request, hex
    request_json: str  # canonical JSON of the resolved request: what the solver gets
    tables: int
    time_limit_s: float


def prepare_plan_request(body: bytes, settings: ServiceSettings) -> PreparedPlanRequest:
    req = parse_json_model(PlanRequest, body, "request")
    if len(req.model.tables) > settings.max_tables:  # before expanding anything big
        raise ProblemError(limit_exceeded(
            "model.tables", f"{len(req.model.tables):,} tables; this server plans at most "
                            f"{settings.max_tables:,} (PLANNER_MAX_TABLES)"))
    if req.options.time_limit_s > settings.max_time_limit_s:
        raise ProblemError(limit_exceeded(
            "options.time_limit_s", f"{req.options.time_limit_s:g} s; this server allows at "
                                    f"most {settings.max_time_limit_s:g} s "
                                    "(PLANNER_MAX_TIME_LIMIT_S)"))
    resolved = resolve(req)
    check_size(resolved, settings)
    # Same resolved request, same id: a preset and its expansion share the job and the plan.
    return PreparedPlanRequest(job_id=content_hash(resolved).removeprefix("sha256:"),
                               request_json=canonical_json(resolved),
                               tables=len(resolved.model.tables),
                               time_limit_s=resolved.options.time_limit_s)


async def parse_in_thread(model: type[M], body: bytes, what: str) -> M:
    """Parsing a large body takes tens of ms: off the event loop."""
    return await asyncio.to_thread(parse_json_model, model, body, what)
