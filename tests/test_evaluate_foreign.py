"""evaluate() of a layout outside the planner's candidate grid: its bound covers the layout's
own shapes and cache ratios, so a better foreign layout is reported as better, never as
failing (issue 12)."""

from planner import plan
from planner.check import check_plan
from planner.plan_model import PlanLayout, PlanPiece, TablePlan
from planner.planning import evaluate

_ROWS, _DIM = 50_000_000, 128


def _request() -> dict:
    big = {"name": "big", "num_embeddings": _ROWS, "embedding_dim": _DIM,
           "pooling_factor": 20.0,
           "constraints": {"sharding_types": ["table_wise"], "memory_tiers": ["hbm_cache"]}}
    return {"model": {"batch_size_per_gpu": 4096, "tables": [big]},
            "hardware": {"preset": "h100", "hosts": 1, "overrides": {
                "gpus_per_host": 1,
                "gpu": {"hbm_capacity_bytes": "40GiB", "hbm_reserved_bytes": "8GiB"}}}}


def _layout(request, ratio: float) -> PlanLayout:
    return PlanLayout(request=request, tables=[TablePlan(
        name="big", sharding_type="table_wise", tier="hbm_cache", cache_ratio=ratio,
        pieces=[PlanPiece(rank=0, host=0, row_offset=0, row_count=_ROWS, col_offset=0,
                          col_count=_DIM)])])


def test_a_foreign_cache_ratio_gets_a_bound_valid_for_it() -> None:
    ours = plan(_request())
    assert check_plan(ours).ok
    grid_best = evaluate(_layout(ours.request, 0.5))  # the largest ratio of the fixed grid
    theirs = evaluate(_layout(ours.request, 0.9))  # outside the grid
    for p in (grid_best, theirs):
        assert p.summary.status == "evaluated" and check_plan(p).ok, p.summary.warnings
        assert p.summary.lower_bound_s <= p.summary.step_time_s * (1 + 1e-9)
    # Better than the grid's best, and reported as such; our plan, which also tries the
    # largest ratio that fits, is at least as good.
    assert theirs.summary.step_time_s < grid_best.summary.step_time_s
    assert ours.summary.step_time_s <= theirs.summary.step_time_s
    assert ours.summary.lower_bound_s <= theirs.summary.step_time_s
