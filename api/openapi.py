"""The OpenAPI document: FastAPI's paths plus the planner's own pydantic models as components
(generated from the models, so schema changes flow through), and request examples built
from the bundled fixtures."""

import json
from functools import cache
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from api.problems import Problem
from api.schemas import CheckResult, Health, Job, Presets, Readiness
from planner.plan_model import EvaluateInput, Plan
from planner.presets import fixture_text
from planner.spec import PlanRequest

COMPONENT_MODELS: tuple[type[BaseModel], ...] = (
    PlanRequest, EvaluateInput, Plan, Job, CheckResult, Presets, Problem, Health, Readiness)
_REF = "#/components/schemas/{model}"


def ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def json_content(model: type[BaseModel]) -> dict[str, Any]:
    return {"application/json": {"schema": ref(model)}}


def _fixture_model(name: str) -> dict[str, Any]:
    model: dict[str, Any] = json.loads(fixture_text(name))
    return model


@cache
def plan_request_examples() -> dict[str, Any]:
    return {
        "criteo_kaggle_1_host": {
            "summary": "Criteo Kaggle (26 tables) on one 8x H100 host",
            "value": {"model": _fixture_model("criteo_kaggle"),
                      "hardware": {"preset": "h100", "hosts": 1}},
        },
        "criteo_dcnv2_2_hosts": {
            "summary": "MLPerf DLRM-DCNv2 tables on two 8x H100 hosts, HBM reserve overridden",
            "value": {"model": _fixture_model("criteo_dcnv2"),
                      "hardware": {"preset": "h100", "hosts": 2,
                                   "overrides": {"gpu": {"hbm_reserved_bytes": "16GiB"}}},
                      "options": {"solver": "greedy", "seed": 0}},
        },
    }


@cache
def example_plan() -> dict[str, Any]:
    """A real plan of the criteo_kaggle fixture: the example for /v1/check and /v1/evaluate."""
    from planner.planning import plan

    request = {"model": _fixture_model("criteo_kaggle"), "hardware": {"preset": "h100",
               "hosts": 1}, "options": {"solver": "greedy"}}
    result: dict[str, Any] = plan(request).model_dump(mode="json")
    return result


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` of a route that parses its body itself (see api/body.py)."""
    return {"requestBody": {"required": True, "content": json_content(model)}}


def plan_examples() -> dict[str, Any]:
    return {"criteo_kaggle_plan": {"summary": "a plan of criteo_kaggle on one H100 host",
                                   "value": example_plan()}}


def layout_examples() -> dict[str, Any]:
    p = example_plan()
    return {"criteo_kaggle_layout": {"summary": "only the request and the tables of a plan",
                                     "value": {"request": p["request"], "tables": p["tables"]}}}


def build_openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description,
                         routes=app.routes)
    _, defs = models_json_schema([(m, "validation") for m in COMPONENT_MODELS],
                                 ref_template=_REF)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, body in defs.get("$defs", {}).items():
        components.setdefault(name, body)
    examples = {("/v1/plans", "post"): plan_request_examples,
                ("/v1/evaluate", "post"): layout_examples, ("/v1/check", "post"): plan_examples}
    for (path, method), make in examples.items():
        op = schema["paths"].get(path, {}).get(method)
        if op is not None:
            op["requestBody"]["content"]["application/json"]["examples"] = make()
    app.openapi_schema = schema
    return schema
