"""The plan: what the planner returns, `planner check` verifies and `planner evaluate` scores.

A layout (request + per-table pieces) is all a hand-made or foreign plan needs; the per-GPU
and per-host reports and the summary are derived from it by `planner.plan_build`.
"""

from collections.abc import Iterable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from cost_models import ShardingType, Tier
from planner.spec.request import ResolvedRequest
from planner.spec.table import StrictModel, drop_absent

SCHEMA_VERSION = "1"
# At most 2**62: numpy and CP-SAT read these as 64-bit integers.
NonNeg = Annotated[int, Field(strict=True, ge=0, le=2**62)]

M = TypeVar("M", bound=BaseModel)
_new = object.__new__
_set = object.__setattr__


def trusted(cls: type[M], values: dict[str, Any]) -> M:
    """`cls.model_construct(**values)` for values the planner made itself and that name every
    field in declaration order: what model_construct does, without its per-field loop over
    defaults and aliases (a third of the time of building a million pieces). The models are
    frozen, and every field is set, so the field set is shared."""
    m = _new(cls)
    _set(m, "__dict__", values)
    _set(m, "__pydantic_fields_set__", _all_fields(cls))
    _set(m, "__pydantic_extra__", None)
    _set(m, "__pydantic_private__", None)
    return m


def trusted_pieces(rows: Iterable[tuple[int, int, int, int, int, int]]) -> list["PlanPiece"]:
    """`trusted(PlanPiece, ...)` for each (rank, host, row_offset, row_count, col_offset,
    col_count), in one loop: a million pieces at 10,000 tables x 1,024 GPUs."""
    fields_set = _all_fields(PlanPiece)
    out = []
    append = out.append
    for rank, host, row_offset, row_count, col_offset, col_count in rows:
        m = _new(PlanPiece)
        _set(m, "__dict__", {"rank": rank, "host": host, "row_offset": row_offset,
                             "row_count": row_count, "col_offset": col_offset,
                             "col_count": col_count})
        _set(m, "__pydantic_fields_set__", fields_set)
        _set(m, "__pydantic_extra__", None)
        _set(m, "__pydantic_private__", None)
        append(m)
    return out


_FIELD_SETS: dict[type[BaseModel], set[str]] = {}


def _all_fields(cls: type[BaseModel]) -> set[str]:
    found = _FIELD_SETS.get(cls)
    if found is None:
        found = _FIELD_SETS[cls] = set(cls.model_fields)
    return found


class PlanPiece(StrictModel):
    rank: NonNeg
    host: NonNeg
    row_offset: NonNeg
    row_count: NonNeg
    col_offset: NonNeg
    col_count: NonNeg


class TablePlan(StrictModel):
    name: str
    sharding_type: ShardingType
    tier: Tier
    cache_ratio: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    pieces: Annotated[list[PlanPiece], Field(min_length=1)]


class CostTerms(StrictModel):
    """Seconds per training step on one GPU."""

    lookup_s: float
    backward_s: float
    cache_miss_s: float
    input_a2a_s: float
    output_a2a_s: float
    allreduce_s: float
    owner_a2a_s: float = 0.0  # sample owners' NIC side beyond the pieces' (placement-dependent)
    compute_s: float
    comm_s: float
    total_s: float


class GpuReport(StrictModel):
    rank: int
    host: int
    pieces: int
    hbm_bytes: int  # weights, state, caches and step buffers
    hbm_cap_bytes: int
    # Of hbm_bytes, the step buffers (cost_models.memory.StepBuffers): the pieces' ids, pooled
    # vectors, gradients and all-to-all staging, and the sample owner's, counted as a peak bound
    hbm_buffer_bytes: int = 0
    ddr_bytes: int  # this GPU's pieces' share of its host's DDR
    ssd_bytes: int
    cost: CostTerms


class HostReport(StrictModel):
    host: int
    ddr_bytes: int
    ddr_cap_bytes: int
    ssd_bytes: int
    ssd_cap_bytes: int


class SolverPoint(StrictModel):
    """The solver's incumbent and bound at a point of its deterministic-time budget."""

    det_time: float  # CP-SAT deterministic seconds (its work counters, not the clock)
    incumbent_s: float
    bound_s: float | None


class BoundCertificate(StrictModel):
    """What `planner check` needs to re-derive the plan's lower bound from the request alone.

    `analytic`: the bound is planner.bounds.lower_bound over a candidate set rebuilt
    deterministically from the request (`candidates`). `cp-sat`: the bound is `claimed_s`,
    proven by CP-SAT on `model` over that candidate set (the plan's bound is then
    max(analytic_s, claimed_s)); the checker re-proves it by asking CP-SAT for a plan under
    claimed_s x (1 - 1e-4) and accepting the claim only on INFEASIBLE."""

    kind: Literal["analytic", "cp-sat"]
    # planner: planning.candidates_for(problem); all-tiers: candidates_for(problem, slow=True);
    # planner+layout: the planner's plus the layout's own (planning.evaluate). None: the
    # checker tries them in that order.
    candidates: Literal["planner", "all-tiers", "planner+layout"] | None = None
    analytic_s: float
    claimed_s: float | None = None
    # exact: the flat model (planner.partition.cpsat.solve_exact); hierarchical: its level 1
    # (planner.partition.hierarchical.HostModel), a relaxation of the flat one.
    model: Literal["exact", "hierarchical"] | None = None


class Summary(StrictModel):
    step_time_s: float  # the slowest GPU's estimate: the sparse part's step time
    mean_gpu_time_s: float
    imbalance: float  # slowest / mean
    lower_bound_s: float
    gap: float  # step_time / lower_bound - 1
    lower_bound_note: str
    solver: str
    status: str  # optimal | feasible (stopped at the limit) | local optimum | ...
    # The search's deterministic seconds after the heuristic (CP-SAT's work counters and ruin
    # and recreate's charged placements), so the plan stays byte-identical.
    solver_det_time: float = 0.0
    solver_history: list[SolverPoint] = Field(default_factory=list)
    tables_per_type: dict[str, int]
    tables_per_tier: dict[str, int]
    warnings: list[str]
    decisions: list[str]
    # How the lower bound can be re-derived (planner/certificate.py). Absent (None) in plans
    # written before it existed; left out of the JSON then, so their hashes still hold.
    bound_certificate: BoundCertificate | None = None

    @model_serializer(mode="wrap")
    def _drop_absent_certificate(self, handler: SerializerFunctionWrapHandler) -> Any:
        return drop_absent(handler(self), ("bound_certificate",))


class PlanLayout(StrictModel):
    """What defines a plan: the request it answers and where every piece lives."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    request: ResolvedRequest
    tables: list[TablePlan]


class Plan(PlanLayout):
    gpus: list[GpuReport]
    hosts: list[HostReport]
    summary: Summary
    plan_hash: str


class EvaluateInput(PlanLayout):
    """A layout, or a whole plan whose derived parts are ignored and recomputed."""

    gpus: list[GpuReport] | None = None
    hosts: list[HostReport] | None = None
    summary: Summary | None = None
    plan_hash: str | None = None
