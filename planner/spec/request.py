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
    solver: Literal["auto", "greedy", "ilp"] = Field(
        "auto", description=(
            "auto: the heuristic, then CP-SAT when the plan is more than 1% above the lower "
            "bound and the model is small enough; greedy: the heuristic only; ilp: the "
            "heuristic, then CP-SAT always."))
    # CP-SAT's budget in deterministic seconds (its work counters; about a second each on
    # one core), so the same request gives the same plan whatever the machine's load.
    time_limit_s: Annotated[float, Field(gt=0.0, le=3600.0, allow_inf_nan=False)] = Field(
        2.0, description=(
            "CP-SAT's budget in deterministic seconds (its work counters, about one second "
            "each on one core), so the plan does not depend on the machine or its load."))
    seed: Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)] = Field(
        0, description=(
            "CP-SAT's random seed; the same request and seed give the same plan."))


class PlanRequest(StrictModel):
    model: ModelSpec = Field(
        description=(
            "The model's sparse part: its tables and training settings."))
    hardware: HardwareInput = Field(
        description=(
            'The cluster: a preset reference ({"preset": NAME, "hosts": N, "overrides": '
            "{...}}) or a full hardware spec."))
    options: PlanOptions = Field(PlanOptions(), description="How the planner searches.")


class ResolvedRequest(StrictModel):
    """A request with its hardware preset expanded: what a plan records and is checked against."""

    model: ModelSpec = Field(
        description=(
            "The model's sparse part: its tables and training settings."))
    hardware: HardwareSpec = Field(
        description=(
            "The full hardware spec (a preset reference expanded)."))
    options: PlanOptions = Field(PlanOptions(), description="How the planner searches.")
