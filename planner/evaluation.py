"""`evaluate` of what a user hands in: a layout, a foreign plan, or one of our own plans.

A whole plan that the checker verifies in full (every figure recomputed with its own
arithmetic, the claimed bound re-proven, the hash matching) comes back unchanged: the same
figures, the same bound and the same hash as when it was planned. Anything else (a layout,
a hand-edited or foreign plan, or a claim the checker cannot re-prove within its budget) is
scored afresh by `planning.evaluate`, whose bound covers the layout's own shapes.
"""

from dataclasses import dataclass

from pydantic import ValidationError

from planner.check import check_plan
from planner.plan_model import EvaluateInput, Plan, PlanLayout
from planner.planning import evaluate


@dataclass(frozen=True)
class Evaluated:
    plan: Plan
    verified: bool  # the input plan came back unchanged, verified by the checker
    note: str


def evaluate_input(given: EvaluateInput, estimator: str | None = None) -> Evaluated:
    """`estimator`: price the layout under this estimator (PlanOptions.estimator) instead of
    the one its request names."""
    if estimator is not None and estimator != given.request.options.estimator:
        options = given.request.options.model_copy(update={"estimator": estimator})
        request = given.request.model_copy(update={"options": options})
        layout = PlanLayout(schema_version=given.schema_version, request=request,
                            tables=given.tables)
        return Evaluated(evaluate(layout), False, f"the layout re-priced by the {estimator} "
                         "estimator (the request's options.estimator set to it)")
    whole = None not in (given.summary, given.gpus, given.hosts, given.plan_hash)
    if whole:
        try:
            as_plan = Plan.model_validate(given.model_dump())
        except ValidationError:
            as_plan = None
        if as_plan is not None:
            report = check_plan(as_plan, strict=True)
            if report.ok:
                return Evaluated(as_plan, True, "the plan's figures, bound and hash were "
                                 "verified by the checker: returned unchanged")
            why = "; ".join(report.errors[:2])
            note = f"the plan did not pass the checker ({why}): scored afresh"
        else:
            note = "the plan is not a complete plan: scored afresh"
    else:
        note = "a layout: scored afresh"
    layout = PlanLayout(schema_version=given.schema_version, request=given.request,
                        tables=given.tables)
    return Evaluated(evaluate(layout), False, note)
