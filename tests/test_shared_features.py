"""Tables read by several features (issue 18, item 5): each feature its own pooling factor,
batch and bag, so its own pooled vector in the output all-to-all; counted per bag in the
cost and memory models, the checker, and (tests/executor, tests/interop) the executor and
the TorchRec export."""

import pytest

from cost_models import ShardingType, Tier
from cost_models.memory import owner_buffers, placed_piece_buffers
from cost_models.traffic import piece_traffic
from planner import plan
from planner.check import check_plan
from planner.errors import BadInputError
from planner.problem import build_problem, table_geom
from planner.spec import ModelSpec, TableSpec
from planner.validation import validate_model
from tests.conftest import cpu_hardware

B = 8
HARDWARE = cpu_hardware("cpu2x2", 2, 2)

# One table read by 3 features (summed pooling 6 ids per sample of the model's batch), and
# the same table read by one feature with pooling 6.
SHARED = {"name": "shared", "num_embeddings": 1000, "embedding_dim": 16, "optimizer": "sgd",
          "features": [{"name": "f_a", "pooling_factor": 1.0},
                       {"name": "f_b", "pooling_factor": 3.0},
                       {"name": "f_c", "pooling_factor": 2.0}]}
SINGLE = {"name": "single", "num_embeddings": 1000, "embedding_dim": 16, "optimizer": "sgd",
          "pooling_factor": 6.0}


def model(*tables, batch=B) -> dict:
    return {"batch_size_per_gpu": batch, "tables": list(tables)}


def request(*tables, batch=B) -> dict:
    return {"model": model(*tables, batch=batch), "hardware": HARDWARE,
            "options": {"solver": "greedy"}}


# -- spec ----------------------------------------------------------------------------------

def test_pooling_factor_or_features_exactly_one():
    both = {**SHARED, "pooling_factor": 2.0}
    with pytest.raises(BadInputError, match="either pooling_factor or features"):
        validate_model(ModelSpec, model(both))
    neither = {k: v for k, v in SINGLE.items() if k != "pooling_factor"}
    with pytest.raises(BadInputError, match=r"give pooling_factor .* or features"):
        validate_model(ModelSpec, model(neither))
    bad = {**SHARED, "features": [{"name": "f", "pooling_factor": 0.0}]}
    with pytest.raises(BadInputError, match=r"features\[0\]\.pooling_factor"):
        validate_model(ModelSpec, model(bad))


def test_feature_names_unique_across_the_model_naming_both_tables():
    other = {**SINGLE, "name": "other", "pooling_factor": None}
    del other["pooling_factor"]
    other["features"] = [{"name": "f_b", "pooling_factor": 1.0}]
    with pytest.raises(BadInputError, match=r"'f_b' of table 'other'.*of table 'shared'"):
        validate_model(ModelSpec, model(SHARED, other))
    # A table without features is read by a feature named as the table.
    clash = {**SINGLE, "name": "f_a"}
    with pytest.raises(BadInputError, match="'f_a'"):
        validate_model(ModelSpec, model(SHARED, clash))


def test_feature_batch_at_most_the_models():
    big = {**SHARED, "features": [{"name": "f", "pooling_factor": 1.0,
                                   "batch_size_per_gpu": B + 1}]}
    with pytest.raises(BadInputError, match="batch_size_per_gpu"):
        validate_model(ModelSpec, model(big))


def test_single_feature_table_json_unchanged():
    """A table without features serializes as before (no `features` key), so old requests
    and plans keep their hashes; one with features has no `pooling_factor` key."""
    assert "features" not in TableSpec.model_validate(SINGLE).model_dump(mode="json")
    dumped = TableSpec.model_validate(SHARED).model_dump(mode="json")
    assert "pooling_factor" not in dumped and len(dumped["features"]) == 3
    schema = ModelSpec.model_json_schema()
    assert "FeatureSpec" in schema["$defs"]


# -- geometry, cost and memory ---------------------------------------------------------------

def test_geometry_pooling_and_bags_per_sample_of_the_models_batch():
    g = table_geom(TableSpec.model_validate(SHARED), B)
    assert (g.pooling, g.bags) == (6.0, 3.0)
    varied = {**SHARED, "features": [{"name": "x", "pooling_factor": 2.0},
                                     {"name": "y", "pooling_factor": 4.0,
                                      "batch_size_per_gpu": B // 2}]}
    g = table_geom(TableSpec.model_validate(varied), B)
    assert (g.pooling, g.bags) == (2.0 + 4.0 / 2, 1.5)
    g = table_geom(TableSpec.model_validate(SINGLE), B)
    assert (g.pooling, g.bags) == (6.0, 1.0)


@pytest.mark.parametrize("kind", [ShardingType.TABLE_WISE, ShardingType.ROW_WISE,
                                  ShardingType.TABLE_ROW_WISE])
def test_per_bag_terms_are_3x_a_single_feature_tables(kind):
    prob = build_problem(validate_model_request(SHARED, SINGLE))
    shared, single = (t.geom for t in prob.tables)
    rows = 1000 if kind is ShardingType.TABLE_WISE else 500
    t3, t1 = (piece_traffic(g, kind, Tier.HBM, 1.0, rows, 16, prob.hw, prob.model)
              for g in (shared, single))
    # Same ids: lookups and id bytes equal ...
    assert t3.lookups == t1.lookups > 0
    assert t3.hbm_fwd == t1.hbm_fwd
    # ... but 3 bags per sample: 3x the bag lengths and 3x the output all-to-all vectors.
    assert t3.lengths == pytest.approx(3 * t1.lengths) and t1.lengths > 0
    for f in ("out_fwd_intra", "out_fwd_inter", "out_bwd_intra", "out_bwd_inter",
              "owner_out_fwd", "owner_out_bwd"):
        assert getattr(t3, f) == pytest.approx(3 * getattr(t1, f)), f
        assert getattr(t1, f) > 0, f
    len_bytes = prob.hw.constants.length_bytes
    assert t3.owner_ids - t1.owner_ids == pytest.approx(2 * len_bytes)
    m3, m1 = (placed_piece_buffers(g, kind, Tier.HBM, 1.0, rows, 16, prob.hw, prob.model)
              for g in (shared, single))
    assert m3.pooled == 3 * m1.pooled
    assert m3.send_fwd == 3 * m1.send_fwd and m3.recv_bwd == 3 * m1.recv_bwd
    assert m3.ids - m1.ids == 2 * 2 * B * prob.hw.world_size * 8  # lengths and offsets
    o3, o1 = (owner_buffers([g], prob.model) for g in (shared, single))
    assert o3.pooled == 3 * o1.pooled and o3.recv_fwd == 3 * o1.recv_fwd


def validate_model_request(*tables, batch=B):
    from planner.planning import resolve
    return resolve(request(*tables, batch=batch))


# -- plan and check ------------------------------------------------------------------------

def test_a_table_read_by_3_features_plans_and_passes_the_checker():
    p = plan(request(SHARED, SINGLE, {**SINGLE, "name": "small", "pooling_factor": 1.0,
                                      "num_embeddings": 64}))
    rep = check_plan(p, prove=False)
    assert rep.ok, rep.errors
