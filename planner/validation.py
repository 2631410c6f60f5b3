"""Turning pydantic validation errors into one line that names the field and the table."""

import difflib
import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from planner.errors import BadInputError

M = TypeVar("M", bound=BaseModel)


def _table_name(raw: Any, loc: tuple[int | str, ...]) -> str | None:
    """The `name` of the table a location points into, read from the raw input if present."""
    node = raw
    name = None
    for i, part in enumerate(loc):
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return name
        if i > 0 and loc[i - 1] == "tables" and isinstance(node, dict):
            value = node.get("name")
            name = value if isinstance(value, str) else f"#{part}"
    return name


def _loc_text(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def bad_input_from(exc: ValidationError, prefix: str = "", raw: Any = None,
                   model: type[BaseModel] | None = None) -> BadInputError:
    """One error of a ValidationError as a BadInputError (field path, table name): an unknown
    field first (a misspelling otherwise shows up only as the missing field it was meant to
    be), with the closest known field's name."""
    errors = exc.errors(include_url=False)
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    # Drop union/discriminator tags pydantic puts in the location.
    loc = tuple(p for p in err["loc"] if p not in ("preset", "spec"))
    field = _loc_text(loc) or "(root)"
    if prefix:
        field = f"{prefix}.{field}" if loc else prefix
    # A validator's own message, without pydantic's "Value error, " before it.
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
        near = _near_field(model, err["loc"]) if model is not None else None
        if near:
            msg += f" (did you mean '{near}'?)"
    more = len(errors) - 1
    if more:
        msg += f" (and {more} more error{'s' if more > 1 else ''})"
    return BadInputError(field=field, message=msg, table=_table_name(raw, loc))


def _near_field(model: type[BaseModel], loc: tuple[int | str, ...]) -> str | None:
    """The known field closest to the unknown key at `loc`, found by walking the schema."""
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    node: dict[str, Any] = schema
    for part in loc[:-1]:
        node = _resolve(node, defs)
        if isinstance(part, int):
            node = node.get("items", {})
        else:
            props = node.get("properties", {})
            if part not in props:
                return None
            node = props[part]
    names = list(_resolve(node, defs).get("properties", {}))
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    return close[0] if close else None


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Follow $ref, and into the first object branch of anyOf/oneOf (a field or null)."""
    for _ in range(8):
        if "$ref" in node:
            node = defs.get(node["$ref"].rsplit("/", 1)[-1], {})
        elif "anyOf" in node or "oneOf" in node:
            branches = [b for b in node.get("anyOf", node.get("oneOf", []))
                        if b.get("type") != "null"]
            if not branches:
                return node
            node = branches[0]
        else:
            return node
    return node


def _looks_like(raw: dict[str, Any]) -> str | None:
    """What a JSON object is, by its keys, for a hint when it was given as something else."""
    if "tables" in raw and "request" not in raw and isinstance(raw.get("tables"), list) and all(
            isinstance(t, dict) and "num_embeddings" in t for t in raw["tables"]):
        return "a model spec (planner plan takes it)"
    if "model" in raw and "hardware" in raw and "tables" not in raw:
        return "a plan request (planner plan, or POST /v1/plans, takes it)"
    if "gpus_per_host" in raw and "gpu" in raw:
        return "a hardware spec (planner plan --hardware takes it)"
    return None


def parse_json_model(model: type[M], text: str | bytes, what: str) -> M:
    """Parse JSON text into `model`, raising BadInputError instead of a traceback."""
    return validate_model(model, parse_json(text, what))


def parse_json(text: str | bytes, what: str) -> Any:
    """JSON text as Python values, raising BadInputError (naming `what`) instead of a
    traceback: bad syntax, bad bytes, and what Python's json refuses past the syntax (an
    integer of more than 4,300 digits, arrays and objects nested deeper than it
    recurses)."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInputError(what, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise BadInputError(what, "not valid JSON here: arrays or objects nested too "
                                  "deeply") from None
    except ValueError as exc:
        raise BadInputError(what, f"not valid JSON here: {exc}".split(
            "; use sys.set_int_max_str_digits")[0]) from None


def validate_model(model: type[M], raw: Any) -> M:
    if not isinstance(raw, dict):
        raise BadInputError("(root)", f"expected a JSON object, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = bad_input_from(exc, raw=raw, model=model)
        kind = _looks_like(raw)
        wanted = "plan" if "plan_hash" in model.model_fields else None
        if kind is not None and wanted is not None and len(exc.errors()) > 1:
            err = BadInputError("(root)", f"this is {kind}, not a plan")
        raise err from None
