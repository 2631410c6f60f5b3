"""The OpenAPI document: FastAPI's paths plus the planner's own pydantic models as components
(generated from the models, so schema changes flow through), and request examples built
from the bundled fixtures."""

import copy
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
from planner.presets import fixture_text, preset_choices
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
        "fixture_by_name_fraction_reserved": {
            "summary": "A bundled fixture by name on one A100 host, 20% of HBM reserved",
            "value": {"model": "criteo_kaggle",
                      "hardware": {"preset": "a100", "hosts": 1,
                                   "overrides": {"gpu": {"hbm_reserved_fraction": 0.2}}},
                      "options": {"solver": "greedy"}},
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


# Rules validation enforces across fields, which JSON Schema cannot state: said in words.
CROSS_FIELD_RULES = {
    "ModelSpec": "Table names are unique, and so are feature names across the model (a table "
                 "without features is read by one feature named as the table); no feature's "
                 "batch_size_per_gpu is larger than the model's.",
    "TableSpec": "Its features' names are unique.",
    "GpuSpec": "hbm_reserved_bytes is smaller than hbm_capacity_bytes, and so is "
               "hbm_reserved_fraction of it (rounded up to a byte); hbm_reserved_fraction is "
               "not given with a non-zero hbm_reserved_bytes.",
    "HostSpec": "ddr_reserved_bytes is smaller than ddr_capacity_bytes (when DDR is given).",
    "CurveAccess": "Row fractions strictly increase and lookup fractions never decrease.",
}


def _partial(components: dict[str, Any], name: str) -> str:
    """A component like `name` with no required field (and its object members the same):
    the schema of overrides, which are merged deeply into a preset and then validated."""
    partial = name + "Overrides"
    if partial not in components:
        body = copy.deepcopy(components[name])
        body.pop("required", None)
        body["title"] = partial
        body["description"] = f"Any fields of {name}, merged deeply into the preset."
        components[partial] = body

        def visit(node: Any) -> None:
            if isinstance(node, dict):
                target = node.get("$ref", "")
                if isinstance(target, str) and target.startswith(_REF.format(model="")):
                    other = target.rsplit("/", 1)[-1]
                    if components.get(other, {}).get("type") == "object":
                        node["$ref"] = _partial(components, other)
                for v in node.values():
                    visit(v)
            elif isinstance(node, list):
                for v in node:
                    visit(v)

        visit(body.get("properties", {}))
    return _REF.format(model=partial)


def _bound_integers(node: Any, largest: int) -> None:
    """Integers beyond the server's digit limit are refused (api/body.py): say so."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            if node.get("maximum", largest + 1) > largest:
                node["maximum"] = largest
            if node.get("minimum", -largest - 1) < -largest:
                node["minimum"] = -largest
        for v in node.values():
            _bound_integers(v, largest)
    elif isinstance(node, list):
        for v in node:
            _bound_integers(v, largest)


def tighten(components: dict[str, Any], max_int_digits: int = 30) -> None:
    """Make the component schemas say what validation accepts where pydantic's schema is
    looser: a preset is one of the bundled names, its overrides are a hardware spec with every
    field optional (not any object), a table has exactly one of `pooling_factor` and
    `features`, the access-curve variants need their
    `kind` (validation picks the variant by it, so it is never optional), and integers stay
    within the server's digit limit. Cross-field rules go into the descriptions."""
    ref = components.get("HardwareRef")
    if ref is not None:
        ref["properties"]["preset"]["enum"] = preset_choices()
        if "HardwareSpec" in components:
            overrides = ref["properties"]["overrides"]
            ref["properties"]["overrides"] = {
                "$ref": _partial(components, "HardwareSpec"),
                "description": overrides.get("description", "")}
    table = components.get("TableSpec")
    if table is not None and {"pooling_factor", "features"} <= set(table.get("properties", {})):
        # A table gives exactly one of the two, not null (planner/spec/table.py).
        table["oneOf"] = [
            {"required": ["pooling_factor"], "properties": {"pooling_factor": {"type": "number"}}},
            {"required": ["features"], "properties": {"features": {"type": "array"}}}]
    for body in components.values():
        kind = body.get("properties", {}).get("kind")
        if isinstance(kind, dict) and "const" in kind:
            required = body.setdefault("required", [])
            if "kind" not in required:
                required.insert(0, "kind")
            kind.pop("default", None)
    _bound_integers(components, 10**max_int_digits - 1)
    for name, rule in CROSS_FIELD_RULES.items():
        if name in components:
            text = components[name].get("description", "")
            components[name]["description"] = (text + " " if text else "") + rule


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
    settings = getattr(app.state, "settings", None)
    tighten(components, settings.max_int_digits if settings is not None else 30)
    examples = {("/v1/plans", "post"): plan_request_examples,
                ("/v1/evaluate", "post"): layout_examples, ("/v1/check", "post"): plan_examples}
    for (path, method), make in examples.items():
        op = schema["paths"].get(path, {}).get(method)
        if op is not None:
            op["requestBody"]["content"]["application/json"]["examples"] = make()
    app.openapi_schema = schema
    return schema
