"""/v1/evaluate, /v1/check, /v1/presets, /v1/schemas: the CLI's other commands over HTTP."""

from enum import StrEnum
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import JSONResponse

from api import worker
from api.body import check_size, parse_in_thread, read_body
from api.jobs import Busy, Interrupted, JobRunner, SolveFailed, problem_of
from api.openapi import json_content, request_body
from api.problems import NOT_READY, Problem, busy, problem_response, responses
from api.schemas import CheckResult, Preset, Presets
from api.settings import ServiceSettings
from planner.plan_model import EvaluateInput, Plan
from planner.presets import fixture_names, preset_dict, preset_names
from planner.spec import HardwareSpec, ModelSpec, PlanRequest

router = APIRouter(prefix="/v1", tags=["tools"])


async def _in_pool(request: Request, shape: type[EvaluateInput] | type[Plan],
                   fn: Any) -> worker.Outcome | Response:
    """Read and validate the body as `shape` (within the size limits), then run `fn` on it
    in the solver pool; a problem response where any of that fails."""
    settings: ServiceSettings = request.app.state.settings
    runner: JobRunner = request.app.state.runner
    body = await read_body(request, settings)
    given = await parse_in_thread(shape, body, "plan", settings)
    check_size(given.request, settings)
    try:
        outcome = await runner.call(fn, body.decode(), settings.job_timeout_s)
    except Busy:
        raise busy() from None
    except SolveFailed as exc:
        return problem_response(exc.problem)
    except Interrupted:
        return problem_response(Problem(type=NOT_READY, title="Stopping", status=503,
                                        detail="the server is stopping; retry"),
                                headers={"Retry-After": "5"})
    if outcome["status"] != "succeeded":
        return problem_response(problem_of(outcome))
    return outcome


@router.post("/evaluate", summary="Score a plan or a hand-made layout under the cost model",
             openapi_extra=request_body(EvaluateInput),
             responses={200: {"description": "the scored plan; checker failures are in its "
                                             "summary.warnings", "content": json_content(Plan)},
                        **responses(401, 408, 413, 415, 422, 429, 503)})
async def evaluate_plan(request: Request) -> Response:
    outcome = await _in_pool(request, EvaluateInput, worker.evaluate_layout)
    if isinstance(outcome, Response):
        return outcome
    return Response(outcome["plan"], media_type="application/json")


@router.post("/check", summary="Check a plan independently: coverage, structure, caps, figures",
             openapi_extra=request_body(Plan),
             responses={200: {"description": "ok, or the checker's failures",
                              "content": json_content(CheckResult)},
                        **responses(401, 408, 413, 415, 422, 429, 503)})
async def check(request: Request) -> Response:
    outcome = await _in_pool(request, Plan, worker.check)
    if isinstance(outcome, Response):
        return outcome
    return JSONResponse(CheckResult(ok=outcome["ok"], errors=outcome["errors"],
                                    warnings=outcome["warnings"]).model_dump())


@router.get("/presets", summary="Hardware presets (fully expanded) and model fixtures",
            responses={200: {"description": "presets", "content": json_content(Presets)},
                       **responses(401)})
async def presets() -> Response:
    body = Presets(hardware=[Preset(name=n, spec=HardwareSpec.model_validate(preset_dict(n)))
                             for n in preset_names()], models=fixture_names())
    return JSONResponse(body.model_dump(mode="json"))


class SchemaKind(StrEnum):
    request = "request"
    model = "model"
    hardware = "hardware"
    plan = "plan"


_SCHEMA_MODELS = {SchemaKind.request: PlanRequest, SchemaKind.model: ModelSpec,
                  SchemaKind.hardware: HardwareSpec, SchemaKind.plan: Plan}


@router.get("/schemas/{kind}", summary="JSON Schema of the input (request, model, hardware) "
                                       "or of the plan",
            responses={200: {"description": "a JSON Schema (draft 2020-12)",
                             "content": {"application/json": {"schema": {"type": "object"}}}},
                       **responses(401, 422)})
async def json_schema(kind: Annotated[SchemaKind, Path()]) -> Response:
    return JSONResponse(_SCHEMA_MODELS[kind].model_json_schema())
