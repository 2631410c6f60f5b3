"""Response models of the service that are not the planner's own (those are used directly)."""

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from api.problems import Problem
from planner.spec import HardwareSpec

JobStatus = Literal["queued", "running", "succeeded", "infeasible", "bad_input", "failed"]


class Job(BaseModel):
    """A plan request being solved, or solved. `id` is the request's content hash."""

    model_config = ConfigDict(extra="forbid")

    id: str
    status: JobStatus
    tables: int
    attempts: int  # how often a solver started it (a restart mid-job makes it 2)
    created_at: datetime
    updated_at: datetime
    plan_url: str | None = None  # when succeeded
    error: Problem | None = None  # when infeasible, bad_input or failed: why
    note: str | None = None  # e.g. re-run after a server restart


class CheckResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ok: bool
    errors: list[str]


class Preset(BaseModel):
    name: str
    spec: HardwareSpec


class Presets(BaseModel):
    hardware: list[Preset]
    models: list[str]


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready"]
    solvers: int
    jobs_unfinished: int


def timestamp(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)
