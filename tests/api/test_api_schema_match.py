"""The OpenAPI request schema says what validation accepts: bodies sampled around real
requests (every leaf of a preset request and of a full-hardware request set to a boolean, a
negative, zero, a huge number, a string, null, or deleted; an unknown key added to every
object) get the same verdict from the schema (JSON Schema 2020-12, the served document's
components) and from the service's validation (api/body.py, as POST /v1/plans runs it).
The only differences allowed are the cross-field rules JSON Schema cannot state, which the
schema states in words (api/openapi.py CROSS_FIELD_RULES)."""

import copy
import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from api.body import prepare_plan_request
from api.openapi import CROSS_FIELD_RULES, build_openapi
from api.problems import ProblemError
from api.settings import ServiceSettings
from planner.errors import PlannerError
from planner.planning import resolve
from planner.spec import PlanRequest
from tests.api.conftest import small_request

SETTINGS = ServiceSettings(max_tables=10**6, max_gpus=10**6, max_time_limit_s=10**6)
# What validation says when a cross-field rule (stated in the schema's words) fails.
CROSS_FIELD_MESSAGES = ("must be smaller than", "duplicate table name", "strictly increase",
                        "must not decrease")
MUTATIONS: tuple[Any, ...] = (True, -1, 0, 1e30, "x", None)


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    from fastapi import FastAPI

    app = FastAPI()
    components = build_openapi(app)["components"]
    schema = {"$ref": "#/components/schemas/PlanRequest", "components": components}
    return jsonschema.Draft202012Validator(schema)


def _bases() -> list[dict[str, Any]]:
    preset = small_request()
    preset["model"]["tables"] = preset["model"]["tables"][:2]
    preset["model"]["tables"][1]["access_frequency"] = {"kind": "zipf", "alpha": 1.1}
    preset["hardware"]["overrides"] = {"gpu": {"hbm_reserved_bytes": "8GiB"}}
    preset["options"] = {"solver": "greedy", "time_limit_s": 2.0, "seed": 1}
    full = json.loads(resolve(PlanRequest.model_validate(preset)).model_dump_json())
    full["model"]["tables"][0]["access_frequency"] = {
        "kind": "curve", "points": [[0.1, 0.5], [1.0, 1.0]]}
    return [preset, full]


def _paths(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(node, dict):
        yield path  # the object itself: for an unknown key
        for k, v in node.items():
            yield from _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*path, i))
    else:
        yield path


def _samples() -> Iterator[tuple[str, Any]]:
    for base in _bases():
        yield "base", base
        for path in _paths(base):
            parent = base
            for p in path[:-1]:
                parent = parent[p]
            target = parent[path[-1]] if path else base
            if isinstance(target, dict):
                body = copy.deepcopy(base)
                node = body
                for p in path:
                    node = node[p]
                node["unknown_key"] = 1
                yield f"{path} + unknown key", body
                if not path:
                    continue
            for value in MUTATIONS:
                body = copy.deepcopy(base)
                node = body
                for p in path[:-1]:
                    node = node[p]
                node[path[-1]] = value
                yield f"{path} = {value!r}", body
            if path and isinstance(path[-1], str):
                body = copy.deepcopy(base)
                node = body
                for p in path[:-1]:
                    node = node[p]
                del node[path[-1]]
                yield f"{path} deleted", body


def _validation(body: Any) -> str | None:
    """None when the service accepts the body, else why not."""
    try:
        prepare_plan_request(json.dumps(body).encode(), SETTINGS)
    except PlannerError as exc:
        return str(exc)
    except ProblemError as exc:
        return str(exc.problem.detail)
    return None


def test_schema_and_validation_agree(validator: jsonschema.Draft202012Validator) -> None:
    disagree, cross_field, total = [], 0, 0
    for what, body in _samples():
        total += 1
        schema_ok = validator.is_valid(body)
        why = _validation(body)
        if schema_ok == (why is None):
            continue
        if schema_ok and why and any(m in why for m in CROSS_FIELD_MESSAGES):
            cross_field += 1
            continue
        disagree.append((what, "schema accepts" if schema_ok else "schema refuses", why))
    print(f"\n{total} bodies: schema and validation agree on all but {cross_field} "
          "cross-field cases")
    assert total > 300
    assert disagree == [], "\n".join(map(str, disagree[:20]))


def test_cross_field_rules_are_in_the_schema(validator: jsonschema.Draft202012Validator) -> None:
    components = validator.schema["components"]["schemas"]
    for name, rule in CROSS_FIELD_RULES.items():
        assert rule in components[name]["description"]
    # The cases the issue named: an empty preset is refused by both now.
    body = small_request()
    body["hardware"]["preset"] = ""
    assert not validator.is_valid(body) and _validation(body)
