"""The request's estimator (PlanOptions.estimator), built once with its problem, and the one
way a table's pieces are priced outside the candidates (plan building, explain, the checker)."""

from typing import TYPE_CHECKING

from cost_models import (
    AnalyticEstimator,
    CostBreakdown,
    Estimator,
    HardwareProfile,
    ShardingType,
    Tier,
    piece_traffic,
)
from planner.spec import ResolvedRequest

if TYPE_CHECKING:  # planner.problem builds its estimator here
    from planner.problem import Problem, TableInfo


def estimator_for(request: ResolvedRequest, hw: HardwareProfile) -> Estimator:
    """`hw` is the problem's profile (its HBM cap after the step reserve)."""
    if request.options.estimator == "torchrec":
        # TorchRec (and torch) load only when asked for.
        from planner.interop.estimator import TorchRecEstimator

        return TorchRecEstimator.of(request)
    return AnalyticEstimator(hw)


def table_prices(problem: "Problem", info: "TableInfo", kind: ShardingType, tier: Tier,
                 cache_ratio: float | None, shapes: list[tuple[int, int]]
                 ) -> dict[tuple[int, int], CostBreakdown]:
    """Each distinct (rows, cols) of one table's pieces (`shapes`: all of them, in plan
    order), priced by the problem's estimator: by shape, or the table's pieces together."""
    est, hw = problem.estimator, problem.hw
    ratio = cache_ratio if cache_ratio is not None else 1.0
    bytes_of = {(rows, cols): piece_traffic(info.geom, kind, tier, ratio, rows, cols, hw,
                                            problem.model) for rows, cols in shapes}
    wanted = list(bytes_of) if est.per_shape else shapes
    return dict(zip(wanted, est.pieces(info.index, kind, tier, ratio, wanted,
                                       [bytes_of[s] for s in wanted]), strict=True))
