"""Errors as RFC 9457 problem details (application/problem+json), and their OpenAPI entries."""

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from planner.errors import BadInputError, InfeasibleError, NoPlanFoundError

log = logging.getLogger("planner.service")

PROBLEM_MEDIA_TYPE = "application/problem+json"
_BASE = "urn:dlrm-planner:problem:"
BAD_INPUT = _BASE + "bad-input"
INFEASIBLE = _BASE + "infeasible"
NO_PLAN_FOUND = _BASE + "no-plan-found"
# Neither a plan nor a proof that none exists within the budget: a 4xx (the client can raise
# time_limit_s), distinct from 422's proven "infeasible"; retrying as is gives the same answer.
NO_PLAN_FOUND_STATUS = 409
LIMIT = _BASE + "limit-exceeded"
TOO_LARGE = _BASE + "body-too-large"
BUSY = _BASE + "too-many-jobs"
UNAUTHORIZED = _BASE + "unauthorized"
NOT_FOUND = _BASE + "not-found"
SOLVE_FAILED = _BASE + "solve-failed"
NOT_READY = _BASE + "not-ready"
CANCELLED = _BASE + "cancelled"
QUOTA = _BASE + "quota-exceeded"
UNSUPPORTED = _BASE + "unsupported-media-type"


class Problem(BaseModel):
    """RFC 9457 problem details, with the planner's extension members."""

    model_config = ConfigDict(extra="forbid")

    type: str = "about:blank"
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    field: str | None = None  # bad input: the field path, e.g. model.tables[3].embedding_dim
    table: str | None = None  # bad input or infeasible: the table it concerns
    cap: str | None = None  # infeasible: the memory cap that is short
    short_bytes: int | None = None  # infeasible: by how many bytes
    # infeasible: the certificate anyone can recompute (planner/infeasibility.py)
    certificate: dict[str, Any] | None = None
    job_id: str | None = None


class ProblemError(Exception):
    """Raised by routes to answer with a problem."""

    def __init__(self, problem: Problem, headers: dict[str, str] | None = None) -> None:
        super().__init__(problem.detail or problem.title)
        self.problem = problem
        self.headers = headers


def problem_response(problem: Problem, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(problem.model_dump(mode="json", exclude_none=True),
                        status_code=problem.status, media_type=PROBLEM_MEDIA_TYPE,
                        headers=headers)


def bad_input(exc: BadInputError, job_id: str | None = None) -> Problem:
    return Problem(type=BAD_INPUT, title="Bad input", status=422, detail=str(exc),
                   field=exc.field, table=exc.table, job_id=job_id)


def infeasible(exc: InfeasibleError, job_id: str | None = None) -> Problem:
    return Problem(type=INFEASIBLE, title="No plan fits", status=422, detail=exc.reason,
                   table=exc.table, cap=exc.cap, short_bytes=exc.short_bytes,
                   certificate=exc.certificate, job_id=job_id)


def no_plan_found(reason: str, job_id: str | None = None) -> Problem:
    return Problem(type=NO_PLAN_FOUND, title="No plan found within the budget",
                   status=NO_PLAN_FOUND_STATUS, detail=reason, job_id=job_id)


def limit_exceeded(field: str, detail: str) -> Problem:
    return Problem(type=LIMIT, title="Limit exceeded", status=422, detail=detail, field=field)


def busy() -> ProblemError:
    return ProblemError(Problem(type=BUSY, title="Too many jobs", status=429,
                                detail="too many jobs are waiting for a solver; retry later "
                                       "(PLANNER_MAX_QUEUED_JOBS)"),
                        headers={"Retry-After": "5"})


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for the problem statuses a route may answer."""
    titles = {401: "Missing or wrong API key", 404: "Not found", 413: "Request body too large",
              408: "The body did not arrive in time",
              409: "No plan found within the budget, and none proved impossible",
              422: "Bad input, a limit exceeded, or no plan fits",
              415: "Content type not application/json",
              429: "Too many jobs waiting, or the key's quota reached; retry later",
              503: "Not ready, saturated, or too many bodies being read; retry later"}
    ref = {"$ref": "#/components/schemas/Problem"}
    return {s: {"description": titles[s], "content": {PROBLEM_MEDIA_TYPE: {"schema": ref}}}
            for s in statuses}


def _loc_field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "(root)"


def install_handlers(app: FastAPI) -> None:
    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ProblemError)
        return problem_response(exc.problem.model_copy(update={"instance": request.url.path}),
                                exc.headers)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return problem_response(Problem(title=str(exc.detail), status=exc.status_code,
                                        instance=request.url.path), exc.headers)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        # Path and query parameters only: request bodies are parsed by planner.validation.
        assert isinstance(exc, RequestValidationError)
        err = exc.errors()[0]
        field = _loc_field(tuple(err.get("loc", ())))
        return problem_response(Problem(type=BAD_INPUT, title="Bad input", status=422,
                                        detail=f"{field}: {err.get('msg')}", field=field,
                                        instance=request.url.path))

    async def on_planner_error(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, BadInputError):
            problem = bad_input(exc)
        elif isinstance(exc, NoPlanFoundError):
            problem = no_plan_found(exc.reason)
        else:
            assert isinstance(exc, InfeasibleError)
            problem = infeasible(exc)
        return problem_response(problem.model_copy(update={"instance": request.url.path}))

    async def on_internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("internal error on %s %s", request.method, request.url.path,
                  exc_info=(type(exc), exc, exc.__traceback__))
        return problem_response(Problem(title="Internal Server Error", status=500,
                                        detail=f"internal error: {type(exc).__name__}",
                                        instance=request.url.path))

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(Exception, on_internal)
    app.add_exception_handler(BadInputError, on_planner_error)
    app.add_exception_handler(InfeasibleError, on_planner_error)
    app.add_exception_handler(NoPlanFoundError, on_planner_error)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
