"""Sequence (unpooled) tables (issue 18, item 5): TableSpec.pooling_mode "none", TorchRec's
EmbeddingConfig in an EmbeddingCollection, every id its own output vector. Allowed sharding
types, geometry, the cost and memory models' per-id output terms, plan and check; the
executor and the TorchRec export are tested in tests/executor and tests/interop."""

import pytest

from cost_models import ShardingType, Tier
from cost_models.memory import owner_buffers, placed_piece_buffers
from cost_models.traffic import piece_traffic
from planner import plan
from planner.check import check_plan
from planner.errors import BadInputError
from planner.planning import resolve
from planner.problem import build_problem, table_geom
from planner.spec import TableSpec
from planner.spec.table import SEQUENCE_SHARDING_TYPES
from tests.conftest import cpu_hardware

B = 8
HARDWARE = cpu_hardware("cpu2x2", 2, 2)
POOLED = {"name": "pooled", "num_embeddings": 1000, "embedding_dim": 16, "optimizer": "sgd",
          "pooling_factor": 5.0}
SEQ = {**POOLED, "name": "seq", "pooling_mode": "none"}


def request(*tables, batch=B) -> dict:
    return {"model": {"batch_size_per_gpu": batch, "tables": list(tables)},
            "hardware": HARDWARE, "options": {"solver": "greedy"}}


def test_absent_pooling_mode_left_out_of_the_json():
    assert "pooling_mode" not in TableSpec.model_validate(POOLED).model_dump(mode="json")
    dumped = TableSpec.model_validate(SEQ).model_dump(mode="json")
    assert dumped["pooling_mode"] == "none"
    assert TableSpec.model_validate(SEQ).sequence
    assert not TableSpec.model_validate({**POOLED, "pooling_mode": "mean"}).sequence


def test_geometry_outputs_per_sample():
    g = table_geom(TableSpec.model_validate(SEQ), B)
    assert (g.sequence, g.outputs, g.bags) == (True, 5.0, 1.0)
    g = table_geom(TableSpec.model_validate(POOLED), B)
    assert (g.sequence, g.outputs) == (False, 1.0)
    two = {**SEQ, "pooling_factor": None, "features": [
        {"name": "a", "pooling_factor": 2.0}, {"name": "b", "pooling_factor": 3.0,
                                               "batch_size_per_gpu": B // 2}]}
    del two["pooling_factor"]
    g = table_geom(TableSpec.model_validate(two), B)
    assert (g.outputs, g.bags) == (2.0 + 1.5, 1.5)


def test_sequence_table_gets_only_torchrecs_ec_sharding_types():
    prob = build_problem(resolve(request(SEQ, POOLED)))
    seq, pooled = prob.tables
    assert seq.constraints.sharding_types == list(SEQUENCE_SHARDING_TYPES)
    assert pooled.constraints.sharding_types is None
    ok = {**SEQ, "constraints": {"sharding_types": ["row_wise"]}}
    assert build_problem(resolve(request(ok))).tables[0].constraints.sharding_types == [
        ShardingType.ROW_WISE]
    bad = {**SEQ, "constraints": {"sharding_types": ["table_wise", "table_row_wise"]}}
    with pytest.raises(BadInputError, match="table_row_wise cannot shard a sequence") as e:
        build_problem(resolve(request(bad)))
    assert e.value.field == "model.tables[0].constraints.sharding_types"
    assert e.value.table == "seq"


@pytest.mark.parametrize("kind,rows", [(ShardingType.TABLE_WISE, 1000),
                                       (ShardingType.COLUMN_WISE, 1000),
                                       (ShardingType.ROW_WISE, 250)])
def test_output_all_to_all_one_vector_per_id(kind, rows):
    """A sequence piece sends pooling (5) x a pooled piece's vectors of the same shape, both
    directions and the owner's side; a row-wise piece only its own ids' (not a partial sum
    per bag): pooling x id_share x."""
    prob = build_problem(resolve(request(SEQ, POOLED)))
    seq, pooled = (t.geom for t in prob.tables)
    ts, tp = (piece_traffic(g, kind, Tier.HBM, 1.0, rows, 16, prob.hw, prob.model)
              for g in (seq, pooled))
    assert ts.lookups == tp.lookups > 0 and ts.ids_inter == tp.ids_inter
    assert ts.lengths == tp.lengths and ts.owner_ids == tp.owner_ids
    factor = 5.0 * rows / 1000
    for f in ("out_fwd_intra", "out_fwd_inter", "out_bwd_intra", "out_bwd_inter",
              "owner_out_fwd", "owner_out_bwd"):
        assert getattr(tp, f) > 0, f
        assert getattr(ts, f) == pytest.approx(factor * getattr(tp, f)), f


def test_memory_per_output_vector():
    prob = build_problem(resolve(request(SEQ, POOLED)))
    seq, pooled = (t.geom for t in prob.tables)
    hw, model = prob.hw, prob.model
    w = hw.world_size
    ms, mp = (placed_piece_buffers(g, ShardingType.TABLE_WISE, Tier.HBM, 1.0, 1000, 16, hw,
                                   model) for g in (seq, pooled))
    # All W x b x 5 ids come back as vectors (and gradients), W x b bags' pooled vectors.
    assert ms.pooled == 5 * mp.pooled == w * B * 5 * 16 * 4
    assert ms.grads == ms.pooled
    assert ms.send_fwd == 5 * mp.send_fwd and ms.recv_bwd == 5 * mp.recv_bwd
    os_, op = (owner_buffers([g], model) for g in (seq, pooled))
    assert os_.pooled == 5 * op.pooled and os_.recv_fwd == 5 * op.recv_fwd
    assert os_.send_bwd == 5 * op.send_bwd
    # A replica of a sequence table holds b x 5 vectors for its owner.
    od = owner_buffers([seq], model, [True])
    assert od.pooled == B * 5 * 16 * 4
    # A row-wise piece: vectors for the ids it may receive (a bound), never more than all.
    rw = placed_piece_buffers(seq, ShardingType.ROW_WISE, Tier.HBM, 1.0, 250, 16, hw, model)
    assert ms.pooled / 4 < rw.pooled <= ms.pooled


def test_a_sequence_table_plans_and_passes_the_checker():
    small = {**POOLED, "name": "small", "num_embeddings": 64, "pooling_factor": 1.0}
    p = plan(request(SEQ, POOLED, small))
    kinds = {t.name: t.sharding_type for t in p.tables}
    assert kinds["seq"] in SEQUENCE_SHARDING_TYPES
    rep = check_plan(p, prove=False)
    assert rep.ok, rep.errors
    # The plan's request keeps the mode; the checker refuses a type TorchRec's EC lacks.
    assert p.request.model.tables[0].pooling_mode == "none"
    forced = plan(request({**SEQ, "constraints": {"sharding_types": ["row_wise"]}}, POOLED))
    assert check_plan(forced, prove=False).ok
