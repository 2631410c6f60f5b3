"""What runs in the solver processes: `plan()`, `evaluate()` and `check_plan()`, JSON in and
JSON out, so nothing but strings crosses the process boundary. Planner errors come back as
outcomes, not exceptions; anything else is a bug and propagates to the job as `failed`."""

import json
import signal
from typing import Any

from planner.check import check_plan
from planner.errors import BadInputError, InfeasibleError, NoPlanFoundError, PlannerError
from planner.evaluation import evaluate_input
from planner.plan_model import EvaluateInput, Plan
from planner.planning import plan
from planner.validation import validate_model

Outcome = dict[str, Any]


def warm_up() -> None:
    """Pool initializer (the imports above are the slow part). Ctrl+C reaches the whole
    process group: the server stops its workers itself, so a worker ignores SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _error(exc: PlannerError) -> Outcome:
    if isinstance(exc, BadInputError):
        return {"status": "bad_input", "field": exc.field, "table": exc.table,
                "message": str(exc)}
    if isinstance(exc, NoPlanFoundError):
        return {"status": "no_plan_found", "reason": exc.reason}
    assert isinstance(exc, InfeasibleError)
    return {"status": "infeasible", "reason": exc.reason, "table": exc.table, "cap": exc.cap,
            "short_bytes": exc.short_bytes, "certificate": exc.certificate}


def solve(request_json: str) -> Outcome:
    try:
        result = plan(json.loads(request_json))
    except (BadInputError, InfeasibleError, NoPlanFoundError) as exc:
        return _error(exc)
    return {"status": "succeeded", "plan": result.model_dump_json(), "plan_hash": result.plan_hash}


def _loads(text: str) -> Any:
    """JSON as the service read it (api/body.py): integral numbers (62.0) are integers."""

    def parse_float(t: str) -> float | int:
        value = float(t)
        return int(value) if value.is_integer() and abs(value) < 1e300 else value

    return json.loads(text, parse_float=parse_float)


def evaluate_layout(layout_json: str) -> Outcome:
    try:
        given = validate_model(EvaluateInput, _loads(layout_json))
        # One of our plans the checker verifies comes back unchanged (planner/evaluation.py).
        result = evaluate_input(given).plan
    except (BadInputError, InfeasibleError, NoPlanFoundError) as exc:
        return _error(exc)
    return {"status": "succeeded", "plan": result.model_dump_json()}


def check(plan_json: str) -> Outcome:
    # Planner errors are outcomes: an exception object crossing the process boundary would
    # need to unpickle, and BadInputError's does not (pebble then gives up on the pool).
    try:
        report = check_plan(validate_model(Plan, _loads(plan_json)))
    except (BadInputError, InfeasibleError, NoPlanFoundError) as exc:
        return _error(exc)
    return {"status": "succeeded", "ok": report.ok, "errors": report.errors,
            "warnings": report.warnings}
