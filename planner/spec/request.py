"""The request `planner.plan()` takes: a model, the hardware (a preset or a full spec), options."""

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from planner.spec.hardware import HardwareRef, HardwareSpec
from planner.spec.model import ModelSpec
from planner.spec.table import StrictModel


def _hardware_kind(value: Any) -> str:
    if isinstance(value, HardwareRef):
        return "preset"
    if isinstance(value, dict) and "preset" in value:
        return "preset"
    return "spec"


HardwareInput = Annotated[
    Annotated[HardwareRef, Tag("preset")] | Annotated[HardwareSpec, Tag("spec")],
    Discriminator(_hardware_kind),
]


class PlanOptions(StrictModel):
    solver: Literal["auto", "greedy", "ilp"] = "auto"
    # CP-SAT's budget in deterministic seconds (its work counters; about a second each on
    # one core), so the same request gives the same plan whatever the machine's load.
    time_limit_s: Annotated[float, Field(gt=0.0, le=3600.0, allow_inf_nan=False)] = 2.0
    seed: Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)] = 0


class PlanRequest(StrictModel):
    model: ModelSpec
    hardware: HardwareInput
    options: PlanOptions = PlanOptions()


class ResolvedRequest(StrictModel):
    """A request with its hardware preset expanded: what a plan records and is checked against."""

    model: ModelSpec
    hardware: HardwareSpec
    options: PlanOptions = PlanOptions()
