"""Reading request bodies: the content type (415), the size limit (413, enforced while
reading), the read timeout (408) and a byte budget shared by all bodies being read (503);
strict JSON (nesting depth, integer digits, no NaN, booleans only where the schema has a
boolean) and parsing through planner.validation (422 naming the field and table, as the CLI
does), the service's limits, and the job id."""

import asyncio
import json
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel

from api.problems import (
    NOT_READY,
    TOO_LARGE,
    UNSUPPORTED,
    Problem,
    ProblemError,
    limit_exceeded,
)
from api.settings import ServiceSettings
from planner.errors import BadInputError
from planner.hashing import canonical_json, content_hash
from planner.planning import resolve
from planner.spec import PlanRequest, ResolvedRequest
from planner.validation import validate_model

M = TypeVar("M", bound=BaseModel)


def _too_large(limit: int) -> ProblemError:
    return ProblemError(Problem(type=TOO_LARGE, title="Request body too large", status=413,
                                detail=f"the body is over this server's limit of {limit:,} "
                                       "bytes (PLANNER_MAX_BODY_BYTES)"))


class BodyBudget:
    """Bytes of request bodies being read now, across requests (one per app: one loop)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0


def check_content_type(request: Request) -> None:
    """JSON only: application/json or application/*+json, UTF-8 if a charset is given."""
    value = request.headers.get("content-type", "")
    media, _, params = value.partition(";")
    media = media.strip().lower()
    charset = ""
    for param in params.split(";"):
        key, _, v = param.partition("=")
        if key.strip().lower() == "charset":
            charset = v.strip().strip('"').lower()
    is_json = media == "application/json" or (media.startswith("application/")
                                              and media.endswith("+json"))
    if not is_json or charset not in ("", "utf-8", "utf8"):
        raise ProblemError(Problem(
            type=UNSUPPORTED, title="Unsupported Media Type", status=415,
            detail=f"the body must be JSON (Content-Type: application/json), not "
                   f"{value!r}" if value else "the body must be JSON: send Content-Type: "
                                              "application/json"),
            headers={"Accept-Post": "application/json"})


async def read_body(request: Request, settings: ServiceSettings) -> bytes:
    """The body, refused with 413 as soon as it passes max_body_bytes (declared or streamed),
    408 when it takes longer than body_timeout_s to arrive, and 503 while other bodies being
    read hold the whole max_body_bytes_in_flight."""
    check_content_type(request)
    limit = settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    budget: BodyBudget = request.app.state.body_budget
    chunks: list[bytes] = []
    size = reserved = 0
    try:
        async with asyncio.timeout(settings.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                budget.used += len(chunk)
                reserved += len(chunk)
                if budget.used > budget.limit:
                    raise ProblemError(Problem(
                        type=NOT_READY, title="Too many bodies being read", status=503,
                        detail="the server is reading too many request bodies at once "
                               "(PLANNER_MAX_BODY_BYTES_IN_FLIGHT); retry"),
                        headers={"Retry-After": "1", "Connection": "close"})
                chunks.append(chunk)
    except TimeoutError:
        raise ProblemError(Problem(
            title="Request Timeout", status=408,
            detail=f"the body did not arrive within {settings.body_timeout_s:g} s "
                   "(PLANNER_BODY_TIMEOUT_S)"), headers={"Connection": "close"}) from None
    finally:
        budget.used -= reserved
    return b"".join(chunks)


@cache
def _boolean_keys(model: type[BaseModel]) -> frozenset[str]:
    """Property names the model's JSON Schema types as boolean (anywhere in it)."""
    keys: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            for name, prop in (node.get("properties") or {}).items():
                if isinstance(prop, dict) and "boolean" in json.dumps(
                        {k: prop.get(k) for k in ("type", "anyOf", "oneOf")}):
                    keys.add(name)
            for v in node.values():
                visit(v)
        elif isinstance(node, list):
            for v in node:
                visit(v)

    visit(model.model_json_schema())
    return frozenset(keys)


class _TooManyDigits(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise BadInputError("(root)", f"not valid JSON: {name} is not a JSON number")


def _check_tree(raw: Any, max_depth: int, boolean_keys: frozenset[str]) -> None:
    """Nesting depth, and booleans only where the schema has a boolean."""
    stack: list[tuple[Any, int, str]] = [(raw, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if depth > max_depth:
            raise BadInputError(path or "(root)",
                                f"nested deeper than {max_depth} levels (this server's limit)")
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(value, bool):
                if not isinstance(key, str) or key not in boolean_keys:
                    raise BadInputError(_join(path, key), "expected a number or a string, got "
                                        f"{str(value).lower()} (booleans are not numbers)")
            elif isinstance(value, dict | list):
                stack.append((value, depth + 1, _join(path, key)))


def _join(path: str, key: str | int) -> str:
    """model.tables[3].embedding_dim, as planner.validation names fields."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def load_json_model(model: type[M], body: bytes, what: str, settings: ServiceSettings) -> M:
    """Strict JSON, then the model (BadInputError, a 422, for anything it refuses)."""
    digits = settings.max_int_digits

    def parse_int(text: str) -> int:
        if len(text.lstrip("-")) > digits:
            raise _TooManyDigits(text)
        return int(text)

    def parse_float(text: str) -> float | int:
        # JSON Schema's `integer` is any number with no fraction (62.0, 1e3): so here too,
        # within the integer digit limit; other numbers stay floats.
        value = float(text)
        if value.is_integer() and abs(value) < 10.0**digits:
            return int(value)
        return value

    try:
        raw = json.loads(body, parse_int=parse_int, parse_float=parse_float,
                         parse_constant=_reject_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInputError(what, f"not valid JSON: {exc}") from None
    except _TooManyDigits as exc:
        raise BadInputError("(root)", f"an integer of {len(str(exc).lstrip('-')):,} digits; "
                                      f"this server reads at most {digits}") from None
    except RecursionError:
        raise BadInputError("(root)", f"nested deeper than {settings.max_json_depth} levels "
                                      "(this server's limit)") from None
    if isinstance(raw, dict | list):
        _check_tree(raw, settings.max_json_depth, _boolean_keys(model))
    return validate_model(model, raw)


def check_size(req: ResolvedRequest, settings: ServiceSettings) -> None:
    tables = len(req.model.tables)
    if tables > settings.max_tables:
        raise ProblemError(limit_exceeded(
            "model.tables", f"{tables:,} tables; this server plans at most "
                            f"{settings.max_tables:,} (PLANNER_MAX_TABLES)"))
    gpus = req.hardware.hosts * req.hardware.gpus_per_host
    if gpus > settings.max_gpus:
        raise ProblemError(limit_exceeded(
            "hardware.hosts", f"{gpus:,} GPUs; this server plans for at most "
                              f"{settings.max_gpus:,} (PLANNER_MAX_GPUS)"))


@dataclass(frozen=True)
class PreparedPlanRequest:
    job_id: str  # the content hash of the resolved request, hex
    request_json: str  # canonical JSON of the resolved request: what the solver gets
    tables: int
    time_limit_s: float


def prepare_plan_request(body: bytes, settings: ServiceSettings) -> PreparedPlanRequest:
    req = load_json_model(PlanRequest, body, "request", settings)
    if len(req.model.tables) > settings.max_tables:  # before expanding anything big
        raise ProblemError(limit_exceeded(
            "model.tables", f"{len(req.model.tables):,} tables; this server plans at most "
                            f"{settings.max_tables:,} (PLANNER_MAX_TABLES)"))
    if req.options.time_limit_s > settings.max_time_limit_s:
        raise ProblemError(limit_exceeded(
            "options.time_limit_s", f"{req.options.time_limit_s:g} s; this server allows at "
                                    f"most {settings.max_time_limit_s:g} s "
                                    "(PLANNER_MAX_TIME_LIMIT_S)"))
    resolved = resolve(req)
    check_size(resolved, settings)
    # Same resolved request, same id: a preset and its expansion share the job and the plan.
    return PreparedPlanRequest(job_id=content_hash(resolved).removeprefix("sha256:"),
                               request_json=canonical_json(resolved),
                               tables=len(resolved.model.tables),
                               time_limit_s=resolved.options.time_limit_s)


async def parse_in_thread(model: type[M], body: bytes, what: str,
                          settings: ServiceSettings) -> M:
    """Parsing a large body takes tens of ms: off the event loop."""
    return await asyncio.to_thread(load_json_model, model, body, what, settings)
