"""Embedding-table sharding planner: `plan(request) -> Plan`."""

from planner.errors import BadInputError, InfeasibleError, NoPlanFoundError, PlannerError
from planner.plan_model import Plan, PlanLayout
from planner.planning import plan
from planner.spec import HardwareRef, HardwareSpec, ModelSpec, PlanOptions, PlanRequest, TableSpec

__all__ = [
    "BadInputError",
    "HardwareRef",
    "HardwareSpec",
    "InfeasibleError",
    "ModelSpec",
    "NoPlanFoundError",
    "Plan",
    "PlanLayout",
    "PlanOptions",
    "PlanRequest",
    "PlannerError",
    "TableSpec",
    "plan",
]
