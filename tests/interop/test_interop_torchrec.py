"""With torchrec installed: the ShardingPlan objects, the round trip through them, TorchRec's
planner on our problem, and our re-use of its shard estimators."""

import json

import pytest

pytest.importorskip("torchrec")

from planner.errors import BadInputError
from planner.interop import (
    TorchRecProblem,
    build_sharding_plan,
    export_from_sharding_plan,
    layout_from_torchrec,
    score_with_torchrec,
    to_torchrec,
)
from planner.planning import evaluate, resolve
from tests.interop.interop_helpers import piece, table, tplan
from tests.interop.test_interop_export import _every_type

pytestmark = pytest.mark.usefixtures("quiet_torchrec")


def test_sharding_plan_objects_carry_every_field(make_layout):
    from torchrec.distributed.types import ShardingPlan

    exp = to_torchrec(make_layout(_every_type()), module_path="sparse.ebc")
    plan = build_sharding_plan(exp)
    assert isinstance(plan, ShardingPlan)
    ps = plan.plan["sparse.ebc"]
    assert ps["cw"].sharding_type == "column_wise" and ps["cw"].ranks == [6, 1]
    shard = ps["cw"].sharding_spec.shards[1]
    assert (shard.shard_offsets, shard.shard_sizes) == ([0, 32], [100, 32])
    assert str(shard.placement) == "rank:1/cuda:1"
    assert ps["grid"].sharding_type == "grid_shard"
    assert ps["dp"].sharding_spec is None and ps["dp"].compute_kernel == "dense"
    assert ps["cached"].cache_params.load_factor == 0.05


def test_round_trip_through_torchrec_objects(make_layout):
    """our plan -> TorchRec ShardingPlan -> our plan: the same, for every type TorchRec can
    express (table-, column-, row-, table-row-, table-column-wise, grid, data-parallel)."""
    layout = make_layout(_every_type())
    exp = to_torchrec(layout)
    back = export_from_sharding_plan(build_sharding_plan(exp), exp.world_size,
                                     exp.local_world_size)
    # TorchRec's ShardingPlan holds no features (they are the EBC's configs and the
    # planner's constraints): everything else comes back.
    assert all(t.feature_names for t in exp.tables)
    assert back == exp.model_copy(update={"tables": [
        t.model_copy(update={"feature_names": [], "pooling_factors": [], "batch_sizes": None})
        for t in exp.tables]})
    assert layout_from_torchrec(back, layout.request) == layout


def test_inexpressible_table_is_refused_not_silently_dropped(make_layout):
    layout = make_layout([(table("g", 40, 64), tplan(
        "g", "grid", [piece(4 + i, 10 * i, 10, 0, 32) for i in range(4)]
        + [piece(4 + i, 10 * i, 10, 32, 32) for i in range(4)]))])
    with pytest.raises(BadInputError) as exc:
        build_sharding_plan(to_torchrec(layout))
    assert exc.value.table == "g"


def _small_request():
    tables = [{"name": f"t{i}", "num_embeddings": 1000 * (i + 1), "embedding_dim": 64,
               "pooling_factor": 2.0 + i} for i in range(6)]
    return resolve({"model": {"batch_size_per_gpu": 256, "tables": tables},
                    "hardware": {"preset": "h100", "hosts": 1}})


def test_rescoring_reproduces_torchrecs_own_shard_estimates():
    """A table-wise shard costs the same whatever its rank, so our re-estimate of a plan
    must equal the perf TorchRec's enumerator gave its own table-wise option."""
    req = _small_request()
    problem = TorchRecProblem.of(req)
    options = problem.enumerator().enumerate(problem.module, problem.sharders)
    own = {o.name: o.shards[0].perf.total for o in options
           if o.sharding_type == "table_wise" and o.compute_kernel == "fused"}
    score = score_with_torchrec(problem, to_torchrec(_tw_plan(req)))
    for name, rank, ms in score.shards:
        assert ms == pytest.approx(own[name], rel=1e-12)
        assert rank == int(name[1:]) % 8
    assert score.step_ms == pytest.approx(max(own.values()))


def _tw_plan(req):
    from planner.plan_model import PlanLayout, PlanPiece, TablePlan

    return PlanLayout(request=req, tables=[
        TablePlan(name=t.name, sharding_type="table_wise", tier="hbm", pieces=[
            PlanPiece(rank=i % 8, host=0, row_offset=0, row_count=t.num_embeddings,
                      col_offset=0, col_count=t.embedding_dim)])
        for i, t in enumerate(req.model.tables)])


def test_torchrec_planner_plan_imports_and_scores():
    req = _small_request()
    problem = TorchRecProblem.of(req)
    exp = export_from_sharding_plan(problem.plan(), 8, 8)
    assert {t.name for t in exp.tables} == {t.name for t in req.model.tables}
    scored = evaluate(layout_from_torchrec(exp, req))
    assert scored.summary.status == "evaluated", scored.summary.warnings
    assert score_with_torchrec(problem, exp).step_ms > 0
    # The topology TorchRec planned on has our HBM left for embeddings, in bytes.
    assert problem.topology.devices[0].storage.hbm == req.hardware.profile().hbm_cap
    json.dumps(exp.model_dump(mode="json"))
