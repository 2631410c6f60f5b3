"""The estimator interface (cost_models/estimator.py): the request names one, the analytic one
leaves plans as they were, and whatever estimator the problem holds is what prices its
candidates and its plans' per-GPU figures (nothing else prices a piece)."""

import dataclasses
from collections.abc import Sequence

import numpy as np

import planner
from cost_models import (
    AnalyticEstimator,
    CostBreakdown,
    PieceTraffic,
    ShardingType,
    Tier,
    piece_cost,
)
from planner.candidates import enumerate_candidates
from planner.plan_build import gpu_totals
from planner.planning import resolve
from planner.problem import build_problem
from planner.spec import PlanOptions

REQUEST = {"model": "deeprecsys_rm3", "hardware": {"preset": "h100", "hosts": 2}}


def test_the_default_estimator_is_left_out_of_the_json():
    assert "estimator" not in PlanOptions().model_dump(mode="json")
    assert "estimator" not in PlanOptions(estimator="analytic").model_dump(mode="json")
    assert PlanOptions(estimator="torchrec").model_dump(mode="json")["estimator"] == "torchrec"


def test_naming_the_analytic_estimator_changes_nothing():
    a = planner.plan(REQUEST)
    b = planner.plan({**REQUEST, "options": {"estimator": "analytic"}})
    assert a.plan_hash == b.plan_hash


def test_analytic_prices_each_piece_as_the_cost_model():
    problem = build_problem(resolve(REQUEST))
    est = problem.estimator
    assert isinstance(est, AnalyticEstimator) and est.step_terms and est.per_shape
    t = problem.tables[0]
    from cost_models import piece_traffic

    shapes = [(t.geom.rows, t.geom.dim), (t.geom.rows // 2, t.geom.dim)]
    traffic = [piece_traffic(t.geom, ShardingType.TABLE_WISE, Tier.HBM, 1.0, r, c, problem.hw,
                             problem.model) for r, c in shapes]
    got = est.pieces(t.index, ShardingType.TABLE_WISE, Tier.HBM, 1.0, shapes, traffic)
    want = [piece_cost(t.geom, ShardingType.TABLE_WISE, Tier.HBM, 1.0, r, c, problem.hw,
                       problem.model) for r, c in shapes]
    assert got == want


class _Doubled:
    """Every term of every piece twice the analytic one (exact in floating point), the
    fixed step-wide seconds unchanged."""

    name = "doubled"
    per_shape = False  # asked per table, as TorchRec's estimator is
    step_terms = True

    def __init__(self, inner: AnalyticEstimator) -> None:
        self.inner = inner

    def pieces(self, table: int, kind: ShardingType, tier: Tier, cache_ratio: float,
               shapes: Sequence[tuple[int, int]], traffic: Sequence[PieceTraffic]
               ) -> list[CostBreakdown]:
        return [c + c for c in self.inner.pieces(table, kind, tier, cache_ratio, shapes,
                                                 traffic)]

    def fixed(self) -> CostBreakdown:
        return self.inner.fixed()


def test_the_problems_estimator_prices_candidates_and_plans():
    problem = build_problem(resolve(REQUEST))
    doubled = dataclasses.replace(problem, estimator=_Doubled(AnalyticEstimator(problem.hw)))
    compared = 0
    for t in problem.tables:
        base = enumerate_candidates(problem, t, slow_tiers=False)
        twice = enumerate_candidates(doubled, t, slow_tiers=False)
        by_key = {(c.kind, c.tier, c.cache_ratio, len(c.groups),
                   tuple(g.geometry.tobytes() for g in c.groups)): c for c in base}
        for c in twice:
            key = (c.kind, c.tier, c.cache_ratio, len(c.groups),
                   tuple(g.geometry.tobytes() for g in c.groups))
            if key not in by_key:  # the Pareto fronts may differ
                continue
            b = by_key[key]
            for gb, gt in zip(b.groups, c.groups, strict=True):
                assert np.array_equal(gt.comp, 2 * gb.comp)
                assert np.array_equal(gt.comm, 2 * gb.comm)
            compared += 1
    assert compared >= len(problem.tables)
    # A plan's per-GPU figures, from a layout without the candidates' figures.
    plan = planner.plan(REQUEST)
    from planner.plan_model import PlanLayout

    layout = PlanLayout(request=plan.request, tables=plan.tables)
    base_totals = gpu_totals(layout, problem)
    twice_totals = gpu_totals(layout, doubled)
    fixed = problem.estimator.fixed()
    for b, d in zip(base_totals, twice_totals, strict=True):
        for f in ("lookup", "backward", "cache_miss", "allreduce"):
            assert getattr(d.cost, f) == 2 * getattr(b.cost, f)
        assert np.isclose(d.cost.output_a2a - fixed.output_a2a,
                          2 * (b.cost.output_a2a - fixed.output_a2a), rtol=1e-12)
