"""Response models of the service that are not the planner's own (those are used directly)."""

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from api.problems import Problem
from planner.spec import HardwareSpec

JobStatus = Literal["queued", "running", "succeeded", "infeasible", "no_plan_found", "bad_input",
                    "failed", "cancelled"]


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
    # Claims the checker could not re-prove within its budget (planner check's warnings)
    warnings: list[str] = []


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
    store: str  # sqlite or postgresql
    instance: str  # this replica's lease holder id
    solvers: int  # solver processes of this instance
    solvers_busy: int  # of them, solving a job now
    jobs_queued: int  # waiting for a solver, all replicas
    jobs_running: int  # all replicas
    max_queued_jobs: int
    jobs_unfinished: int  # queued + running


def timestamp(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)
