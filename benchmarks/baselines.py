"""ZionEX-style greedy sharding baselines (table-wise, largest cost first, least-loaded GPU).

Source: Mudigere et al., "Software-Hardware Co-design for Fast and Scalable Training of Deep
Learning Recommendation Models", ISCA 2022, the section on embedding-table sharding. The paper
shards table-wise with a greedy heuristic: sort the tables by a cost, largest first, and put
each on the GPU with the smallest accumulated cost that still has memory for it. It compares
three cost functions, all of which are implemented here:

    size             = rows x dim
    lookup           = dim x pooling
    size_and_lookup  = dim x pooling x log10(rows)

This is the paper's heuristic as described, not a weakened version of it: every table is
placed whole in HBM on one GPU (table-wise sharding is what the paper's baseline does), the
memory check uses the same cost model's HBM footprint as the planner (weights plus optimizer
state, `cost_models.piece_memory` for `Tier.HBM`) against the same free HBM per GPU
(`problem.hw.hbm_cap`, the reserve for the dense model already subtracted). Ties on the
accumulated cost go to the lowest rank; tables of equal cost keep the request's order.

If some table fits no GPU's remaining HBM, the baseline has no answer for that case and is
reported infeasible: no fallback (row-wise splits, slower tiers) is invented, because the
paper's heuristic has none. A table whose own constraints forbid table-wise sharding or the
HBM tier is likewise out of the baseline's reach; pinned ranks restrict the GPUs it may use.

The resulting layout is scored by `planner.plan_build.build_plan`, i.e. by exactly the cost
model that scores the planner's own plans.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

from cost_models import ShardingType, Tier, piece_memory
from planner.bounds import LowerBound
from planner.plan_build import build_plan
from planner.plan_model import Plan, PlanLayout, PlanPiece, TablePlan
from planner.problem import Problem, TableInfo


def size_cost(t: TableInfo) -> float:
    """rows x dim: the number of parameters."""
    return float(t.geom.rows * t.geom.dim)


def lookup_cost(t: TableInfo) -> float:
    """dim x pooling: elements read per sample."""
    return float(t.geom.dim * t.geom.pooling)


def size_and_lookup_cost(t: TableInfo) -> float:
    """dim x pooling x log10(rows): lookups, weighted up for large (less cacheable) tables."""
    return float(t.geom.dim * t.geom.pooling * math.log10(t.geom.rows))


COSTS: dict[str, Callable[[TableInfo], float]] = {
    "size": size_cost,
    "lookup": lookup_cost,
    "size_and_lookup": size_and_lookup_cost,
}


class BaselineInfeasible(Exception):
    """The heuristic cannot place some table; `reason` says which and by how much."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class BaselineResult:
    name: str
    plan: Plan | None  # None when infeasible
    reason: str | None  # why it is infeasible

    @property
    def step_time_s(self) -> float | None:
        return self.plan.summary.step_time_s if self.plan is not None else None


def greedy_table_wise(problem: Problem, cost: Callable[[TableInfo], float]) -> PlanLayout:
    """Place every table whole in HBM: largest `cost` first, onto the least-loaded GPU that fits.

    Raises BaselineInfeasible when a table fits no GPU (or its constraints forbid TW in HBM).
    """
    hw = problem.hw
    w, g = hw.world_size, hw.gpus_per_host
    load = [0.0] * w  # accumulated baseline cost per GPU
    free = [hw.hbm_cap] * w  # free HBM bytes per GPU
    costs = [cost(t) for t in problem.tables]
    order = sorted(range(len(problem.tables)), key=lambda i: (-costs[i], i))
    placed: dict[int, int] = {}
    for i in order:
        t = problem.tables[i]
        c = t.constraints
        if c.sharding_types and ShardingType.TABLE_WISE not in c.sharding_types:
            raise BaselineInfeasible(f"table '{t.name}' does not allow table-wise sharding")
        if c.memory_tiers and Tier.HBM not in c.memory_tiers:
            raise BaselineInfeasible(f"table '{t.name}' does not allow the HBM tier")
        need = piece_memory(t.geom, Tier.HBM, 1.0, t.geom.rows, t.geom.dim, hw).hbm
        ranks = sorted(c.pinned_ranks) if c.pinned_ranks else range(w)
        fits = [r for r in ranks if free[r] >= need]
        if not fits:
            most = max(free[r] for r in ranks)
            raise BaselineInfeasible(
                f"table '{t.name}' needs {need:,} bytes of HBM; the most free on any GPU is "
                f"{most:,} (short by {need - most:,} bytes)"
            )
        # min() returns the first minimum, and `fits` is in rank order: ties go to the lowest.
        r = min(fits, key=lambda x: load[x])
        load[r] += costs[i]
        free[r] -= need
        placed[i] = r
    tables = [
        TablePlan(
            name=t.name, sharding_type=ShardingType.TABLE_WISE, tier=Tier.HBM, cache_ratio=None,
            pieces=[PlanPiece(rank=placed[t.index], host=placed[t.index] // g, row_offset=0,
                              row_count=t.geom.rows, col_offset=0, col_count=t.geom.dim)],
        )
        for t in problem.tables
    ]
    return PlanLayout(request=problem.request, tables=tables)


def run_baseline(name: str, problem: Problem, bound: LowerBound) -> BaselineResult:
    """One ZionEX baseline (`name` in COSTS), scored by the planner's cost model."""
    try:
        layout = greedy_table_wise(problem, COSTS[name])
    except BaselineInfeasible as err:
        return BaselineResult(name=name, plan=None, reason=err.reason)
    plan = build_plan(layout, problem, bound, solver=f"baseline-zionex-{name}",
                      status="feasible", warnings=[], decisions=[])
    return BaselineResult(name=name, plan=plan, reason=None)


def run_all(problem: Problem, bound: LowerBound) -> dict[str, BaselineResult]:
    return {name: run_baseline(name, problem, bound) for name in COSTS}
