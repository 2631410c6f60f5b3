"""Every field of the request's JSON Schema says what it is, and the unit where it has one
(issue 18, item 4): `planner schema request` and `GET /v1/schemas/request` serve these."""

from typing import Any

import pytest

from planner.spec import HardwareSpec, ModelSpec, PlanRequest, ResolvedRequest


def unit_of(field: str) -> str | None:
    """The unit a field's name carries, which its description must state."""
    if field.endswith("_gb_per_s"):
        return "GB/s"
    if field.endswith("_bytes") or "_bytes_" in field:
        return "bytes"
    if field.endswith("_s"):
        return "seconds"
    return None


def _properties(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(model, field, property schema) of the root model and every model under $defs."""
    out = []
    for name, node in [(schema.get("title", "(root)"), schema),
                       *schema.get("$defs", {}).items()]:
        out.extend((name, field, prop) for field, prop in node.get("properties", {}).items())
    return out


@pytest.mark.parametrize("model", [PlanRequest, ResolvedRequest, ModelSpec, HardwareSpec])
def test_every_field_has_a_description_with_its_unit(model):
    props = _properties(model.model_json_schema())
    assert len(props) > 10
    missing = [f"{m}.{f}" for m, f, p in props if not p.get("description", "").strip()]
    assert missing == []
    no_unit = [f"{m}.{f}" for m, f, p in props
               if unit_of(f) and unit_of(f).lower() not in p["description"].lower()]
    assert no_unit == []


def test_the_request_schema_reaches_every_input_model():
    defs = set(PlanRequest.model_json_schema()["$defs"])
    for name in ("ModelSpec", "TableSpec", "TableConstraints", "ZipfAccess", "CurveAccess",
                 "HardwareRef", "HardwareSpec", "GpuSpec", "HostSpec", "LinkSpec",
                 "ConstantsSpec", "PlanOptions"):
        assert name in defs


def test_unit_of():
    assert [unit_of(f) for f in ("nic_gb_per_s", "ssd_capacity_bytes", "id_bytes",
                                 "cache_metadata_bytes_per_row", "time_limit_s", "seed")] == \
        ["GB/s", "bytes", "bytes", "bytes", "seconds", None]


def test_the_checker_of_descriptions_sees_a_missing_one():
    schema = {"title": "M", "properties": {"a_bytes": {"type": "integer"}},
              "$defs": {"N": {"properties": {"b": {"description": "ok"}}}}}
    props = _properties(schema)
    assert [(m, f) for m, f, p in props if "description" not in p] == [("M", "a_bytes")]
