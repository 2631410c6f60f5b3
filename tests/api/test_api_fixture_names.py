"""The service accepts the CLI's names (issue 18): `"model": NAME` for a bundled fixture
wherever a model object goes (a plan request, the request inside a layout), resolved by the
same lookup as `planner plan NAME` (planner/presets.py); an unknown name is a one-line 422
naming the field and listing the fixtures, never a 500. Preset names and their aliases are
the same set in the CLI, the service's validation and its OpenAPI schema.

In-process (FastAPI's TestClient around create_app): no server to start."""

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from starlette.exceptions import StarletteDeprecationWarning

from api.app import create_app
from api.body import prepare_plan_request
from api.settings import ServiceSettings
from planner.cli_common import hardware_input, read_input
from planner.errors import BadInputError
from planner.planning import resolve
from planner.presets import fixture_names, fixture_text, preset_aliases, preset_choices
from planner.spec import ModelSpec
from tests.api.conftest import fixture_model

with warnings.catch_warnings():  # starlette would rather have httpx2, which is not installed
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

SETTINGS = ServiceSettings(max_concurrent_solves=1, sync_wait_s=60)
PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = tmp_path_factory.mktemp("names") / "plans.sqlite3"
    app = create_app(ServiceSettings(**{**SETTINGS.__dict__, "db_path": db}))
    with TestClient(app) as c:
        yield c


def _request(model: Any, preset: str = "h100") -> dict[str, Any]:
    return {"model": model, "hardware": {"preset": preset, "hosts": 1},
            "options": {"solver": "greedy"}}


def _says_unknown_fixture(r: Any, field: str) -> None:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == PROBLEM
    body = r.json()
    assert body["field"] == field
    detail = body["detail"]
    assert "\n" not in detail and "criteo_kagle" in detail
    assert "did you mean the fixture 'criteo_kaggle'" in detail
    assert all(name in detail for name in fixture_names())


@pytest.mark.timeout(120)
def test_a_fixture_name_plans_as_its_model(client: TestClient) -> None:
    r = client.post("/v1/plans", json=_request("criteo_kaggle"))
    assert r.status_code == 201, r.text
    plan = r.json()
    assert plan["request"]["model"] == ModelSpec.model_validate(
        fixture_model("criteo_kaggle")).model_dump(mode="json")
    # The name and the spread-out model are one request: same job, same plan.
    again = client.post("/v1/plans", json=_request(fixture_model("criteo_kaggle")))
    assert again.status_code == 200, again.text
    assert again.json()["plan_hash"] == plan["plan_hash"]


@pytest.mark.timeout(120)
def test_an_unknown_fixture_name_is_a_422_naming_the_field(client: TestClient) -> None:
    _says_unknown_fixture(client.post("/v1/plans", json=_request("criteo_kagle")), "model")
    layout = {"request": _request("criteo_kagle"), "tables": []}
    layout["request"]["hardware"] = resolve(_request("criteo_kaggle")).hardware.model_dump(
        mode="json")
    del layout["request"]["options"]
    _says_unknown_fixture(client.post("/v1/evaluate", json=layout), "request.model")
    # A name several megabytes long is quoted only in part.
    r = client.post("/v1/plans", json=_request("x" * 3_000_000))
    assert r.status_code == 422 and len(r.json()["detail"]) < 1000


@pytest.mark.timeout(120)
def test_a_layout_may_name_its_model(client: TestClient) -> None:
    full = json.loads(client.get("/openapi.json").text)
    value = full["paths"]["/v1/evaluate"]["post"]["requestBody"]["content"][
        "application/json"]["examples"]["criteo_kaggle_layout"]["value"]
    by_name = json.loads(json.dumps(value))
    by_name["request"]["model"] = "criteo_kaggle"
    a = client.post("/v1/evaluate", json=value)
    b = client.post("/v1/evaluate", json=by_name)
    assert a.status_code == 200 and b.status_code == 200, (a.text, b.text)
    assert a.json() == b.json()


def test_the_schema_offers_the_fixture_names_and_every_alias(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    components = doc["components"]["schemas"]
    assert {"enum": fixture_names(), "type": "string"}.items() <= next(
        b for b in components["PlanRequest"]["properties"]["model"]["anyOf"]
        if b.get("type") == "string").items()
    enum = components["HardwareRef"]["properties"]["preset"]["enum"]
    assert enum == preset_choices() and set(preset_aliases()) <= set(enum)
    # The examples (one names its fixture) are valid under the schema and accepted.
    validator = jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/PlanRequest", "components": doc["components"]})
    examples = doc["paths"]["/v1/plans"]["post"]["requestBody"]["content"][
        "application/json"]["examples"]
    assert any(isinstance(e["value"]["model"], str) for e in examples.values())
    for example in examples.values():
        validator.validate(example["value"])
        prepare_plan_request(json.dumps(example["value"]).encode(), SETTINGS)
    assert not validator.is_valid(_request("criteo_kagle"))


def test_cli_and_service_accept_the_same_names(tmp_path: Path) -> None:
    """Every preset name and alias, and a fixture name, give the CLI's request and the
    service's the same job id; an unknown preset is refused by both in the same words."""
    for preset in preset_choices():
        cli = {"model": json.loads(read_input("deeprecsys_rm1", "model")),
               "hardware": hardware_input(None, preset, 1)}
        service = prepare_plan_request(json.dumps(
            {"model": "deeprecsys_rm1", "hardware": {"preset": preset, "hosts": 1}}).encode(),
            SETTINGS)
        canonical = preset_aliases().get(preset, preset)
        direct = prepare_plan_request(json.dumps(
            {"model": fixture_model("deeprecsys_rm1"),
             "hardware": {"preset": canonical, "hosts": 1}}).encode(), SETTINGS)
        assert service.job_id == direct.job_id == prepare_plan_request(
            json.dumps(cli).encode(), SETTINGS).job_id, preset
    with pytest.raises(BadInputError) as cli_err:
        resolve({"model": "deeprecsys_rm1", "hardware": hardware_input(None, "tpu9000", 1)})
    with pytest.raises(BadInputError) as service_err:
        prepare_plan_request(b'{"model": "deeprecsys_rm1", "hardware": {"preset": "tpu9000"}}',
                             SETTINGS)
    assert str(cli_err.value) == str(service_err.value)
    assert all(name in str(cli_err.value) for name in preset_choices())
    # The CLI's own refusal of a name that is neither a file nor a fixture says the same.
    with pytest.raises(BadInputError) as missing:
        read_input(str(tmp_path / "criteo_kagle"), "model")
    assert "no such file" in str(missing.value) and "(fixtures: " in str(missing.value)
    assert read_input("criteo_kaggle", "model") == fixture_text("criteo_kaggle")
