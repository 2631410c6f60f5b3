"""Turning pydantic validation errors into one line that names the field and the table."""

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


def bad_input_from(exc: ValidationError, prefix: str = "", raw: Any = None) -> BadInputError:
    """The first error of a ValidationError as a BadInputError (field path, table name)."""
    err = exc.errors(include_url=False)[0]
    # Drop union/discriminator tags pydantic puts in the location.
    loc = tuple(p for p in err["loc"] if p not in ("preset", "spec"))
    field = _loc_text(loc) or "(root)"
    if prefix:
        field = f"{prefix}.{field}" if loc else prefix
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    more = len(exc.errors()) - 1
    if more:
        msg += f" (and {more} more error{'s' if more > 1 else ''})"
    return BadInputError(field=field, message=msg, table=_table_name(raw, loc))


def parse_json_model(model: type[M], text: str | bytes, what: str) -> M:
    """Parse JSON text into `model`, raising BadInputError instead of a traceback."""
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInputError(what, f"not valid JSON: {exc}") from None
    return validate_model(model, raw)


def validate_model(model: type[M], raw: Any) -> M:
    if not isinstance(raw, dict):
        raise BadInputError("(root)", f"expected a JSON object, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise bad_input_from(exc, raw=raw) from None
