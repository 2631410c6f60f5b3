"""/v1/plans and /v1/jobs: create a plan (synchronously when small and quick, else a job),
get a plan, get a job."""

import asyncio
import math
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse

from api.body import prepare_plan_request, read_body
from api.jobs import Busy, JobRunner
from api.openapi import json_content, request_body
from api.problems import (
    NOT_FOUND,
    QUOTA,
    Problem,
    ProblemError,
    busy,
    limit_exceeded,
    problem_response,
    responses,
)
from api.schemas import Job, timestamp
from api.security import ApiKey, key_of
from api.settings import ServiceSettings
from api.store import UNFINISHED, JobRow, OverQuota
from planner.plan_model import Plan
from planner.spec import PlanRequest

router = APIRouter(prefix="/v1", tags=["plans"])
JobId = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$",
                            description="the request's content hash (SHA-256, hex)")]


def job_of(row: JobRow) -> Job:
    error = Problem.model_validate_json(row.error) if row.error else None
    return Job(id=row.id, status=row.status,  # type: ignore[arg-type]
               tables=row.tables, attempts=row.attempts, created_at=timestamp(row.created_at),
               updated_at=timestamp(row.updated_at),
               plan_url=f"/v1/plans/{row.id}" if row.status == "succeeded" else None,
               error=error, note=row.note)


def _plan_response(plan_json: str, job_id: str, status: int) -> Response:
    return Response(plan_json, status_code=status, media_type="application/json",
                    headers={"Location": f"/v1/plans/{job_id}", "X-Job-Id": job_id})


def _job_response(row: JobRow, status: int = 200) -> JSONResponse:
    headers = {"X-Job-Id": row.id}
    if status == 202:
        headers |= {"Location": f"/v1/jobs/{row.id}", "Retry-After": "1"}
    return JSONResponse(job_of(row).model_dump(mode="json"), status_code=status,
                        headers=headers)


async def _answer(runner: JobRunner, row: JobRow, created: bool) -> Response:
    if row.status in UNFINISHED:
        return _job_response(row, 202)
    if row.status == "succeeded":
        plan_json = await asyncio.to_thread(runner.store.get_plan, row.id)
        assert plan_json is not None  # written in the same transaction as the status
        return _plan_response(plan_json, row.id, 201 if created else 200)
    assert row.error is not None
    return problem_response(Problem.model_validate_json(row.error),
                            headers={"X-Job-Id": row.id})


def over_quota(exc: OverQuota, key: ApiKey | None) -> ProblemError:
    if exc.kind == "solver_seconds" and key is not None:
        detail = (f"the key {exc.client!r} used {exc.used_s:.1f} solver seconds over the last "
                  f"{key.solver_seconds_window_s:g} s, its quota of "
                  f"{key.max_solver_seconds:g}; retry after the Retry-After seconds")
    else:
        detail = (f"the key {exc.client!r} has {exc.unfinished} unfinished job(s), its quota; "
                  "retry when one finishes (or cancel one)")
    retry = max(1, math.ceil(exc.retry_after_s))
    return ProblemError(Problem(type=QUOTA, title="Quota exceeded", status=429, detail=detail),
                        headers={"Retry-After": str(retry)})


def not_found(detail: str, job_id: str | None = None) -> ProblemError:
    return ProblemError(Problem(type=NOT_FOUND, title="Not found", status=404, detail=detail,
                                job_id=job_id))


@router.post(
    "/plans",
    summary="Plan a model on a cluster",
    description="Answers with the plan (201, or 200 when this request was planned before) "
                "when the request is small and solves within the server's wait; otherwise "
                "202 with the job, whose Location to poll. The job id is the request's "
                "content hash, so the same request reuses its job and plan. No plan fits: 422 "
                "with type ...:infeasible, the table or cap, the bytes short and the "
                "certificate. No plan found within the budget and none proved impossible: 409 "
                "with type ...:no-plan-found.",
    openapi_extra=request_body(PlanRequest),
    responses={200: {"description": "the plan (planned before)", "content": json_content(Plan)},
               201: {"description": "the plan, solved now", "content": json_content(Plan)},
               202: {"description": "the job: poll its Location",
                     "content": json_content(Job)},
               **responses(401, 408, 409, 413, 415, 422, 429, 503)},
)
async def create_plan(
    request: Request,
    mode: Annotated[Literal["auto", "async"], Query(
        description="async: always answer 202 with the job")] = "auto",
    prefer: Annotated[str | None, Header(
        description="`respond-async` does what mode=async does")] = None,
) -> Response:
    settings: ServiceSettings = request.app.state.settings
    runner: JobRunner = request.app.state.runner
    body = await read_body(request, settings)
    prepared = await asyncio.to_thread(prepare_plan_request, body, settings)
    key = key_of(request)
    if key is not None and key.max_time_limit_s is not None and (
            prepared.time_limit_s > key.max_time_limit_s):
        raise ProblemError(limit_exceeded(
            "options.time_limit_s", f"{prepared.time_limit_s:g} s; the key {key.name!r} may "
                                    f"ask for at most {key.max_time_limit_s:g} s"))
    try:
        row, created = await runner.submit(
            prepared.job_id, prepared.request_json, prepared.tables, prepared.time_limit_s,
            client=key.name if key else None,
            client_max_unfinished=key.max_unfinished_jobs if key else None,
            client_solver_quota=key.solver_quota() if key else None)
    except Busy:
        raise busy() from None
    except OverQuota as exc:
        raise over_quota(exc, key) from None
    asked_async = mode == "async" or "respond-async" in (prefer or "").lower()
    if row.status in UNFINISHED and not asked_async and prepared.tables <= settings.sync_max_tables:
        row = await runner.wait(row.id, settings.sync_wait_s) or row
    return await _answer(runner, row, created)


@router.get("/plans/{plan_id}", summary="Get a plan by id (its request's content hash)",
            responses={200: {"description": "the plan", "content": json_content(Plan)},
                       **responses(401, 404, 422)})
async def get_plan(request: Request, plan_id: JobId) -> Response:
    runner: JobRunner = request.app.state.runner
    plan_json = await asyncio.to_thread(runner.store.get_plan, plan_id)
    if plan_json is not None:
        return _plan_response(plan_json, plan_id, 200)
    row = await asyncio.to_thread(runner.store.get_job, plan_id)
    detail = (f"no plan {plan_id}" if row is None else
              f"job {plan_id} is {row.status}; see /v1/jobs/{plan_id}")
    raise not_found(detail, row.id if row else None)


@router.get("/plans/{plan_id}/report",
            summary="The plan's self-contained HTML report (planner report)",
            description="One page, plots and scripts inline (no network needed): cost terms "
                        "and memory per GPU, the placement map, the sharding and tier mix, "
                        "the solver's progress, and explanations of the 50 costliest tables.",
            responses={200: {"description": "the report", "content": {"text/html": {}}},
                       **responses(401, 404, 422)})
async def get_plan_report(request: Request, plan_id: JobId) -> Response:
    runner: JobRunner = request.app.state.runner
    plan_json = await asyncio.to_thread(runner.store.get_plan, plan_id)
    if plan_json is None:
        raise not_found(f"no plan {plan_id}")
    page = await asyncio.to_thread(_report_page, plan_json)
    return Response(page, media_type="text/html; charset=utf-8")


def _report_page(plan_json: str) -> str:
    from planner.plan_model import Plan
    from planner.report_html import costliest_explained, render_html

    plan = Plan.model_validate_json(plan_json)
    return render_html(plan, costliest_explained(plan, 50))


@router.delete("/jobs/{job_id}", summary="Cancel a queued or running job",
               description="A queued job is dropped from the queue; a running one has its "
                           "solver process stopped (on whichever replica runs it, within its "
                           "lease renewal interval). Answers the job, now `cancelled`; a job "
                           "already finished is answered as it is (200, unchanged). POST the "
                           "request again to re-run a cancelled job.",
               responses={200: {"description": "the job", "content": json_content(Job)},
                          **responses(401, 404, 422)})
async def cancel_job(request: Request, job_id: JobId) -> Response:
    runner: JobRunner = request.app.state.runner
    row, _ = await runner.cancel(job_id)
    if row is None:
        raise not_found(f"no job {job_id}")
    return _job_response(row)


@router.get("/jobs/{job_id}", summary="Get a job: its status, and why when it has no plan",
            responses={200: {"description": "the job", "content": json_content(Job)},
                       **responses(401, 404, 422)})
async def get_job(request: Request, job_id: JobId) -> Response:
    runner: JobRunner = request.app.state.runner
    row = await asyncio.to_thread(runner.store.get_job, job_id)
    if row is None:
        raise not_found(f"no job {job_id}")
    return _job_response(row)

