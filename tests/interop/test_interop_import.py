"""TorchRec table configs and plans into ours; the CLI's export and import commands."""

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.errors import BadInputError
from planner.interop import layout_from_torchrec, model_from_torchrec_tables, to_torchrec
from tests.interop.interop_helpers import piece, table, tplan

runner = CliRunner()


def test_table_configs_become_a_model_spec():
    model = model_from_torchrec_tables([
        {"name": "t0", "num_embeddings": 1000, "embedding_dim": 64,
         "feature_names": ["f0", "f1"], "pooling_factors": [2.0, 3.5], "data_type": "FP16"},
        {"name": "t1", "num_embeddings": 10, "embedding_dim": 8, "feature_names": ["f2"],
         "pooling_factor": 1.0},
    ], batch_size_per_gpu=512)
    t0, t1 = model.tables
    # Several features: one FeatureSpec each (issue 18 item 5), no summed pooling factor.
    assert (t0.num_embeddings, t0.embedding_dim, t0.pooling_factor) == (1000, 64, None)
    assert [(f.name, f.pooling_factor) for f in t0.features] == [("f0", 2.0), ("f1", 3.5)]
    assert t0.data_type.value == "fp16"
    assert t1.pooling_factor == 1.0 and t1.features is None
    assert model.batch_size_per_gpu == 512


def test_feature_batch_sizes_and_mismatched_pooling_factors():
    model = model_from_torchrec_tables([
        {"name": "t0", "num_embeddings": 100, "embedding_dim": 8, "feature_names": ["a", "b"],
         "pooling_factors": [1.0, 2.0], "batch_sizes": [8, 4]}], batch_size_per_gpu=8)
    assert [f.batch_size_per_gpu for f in model.tables[0].features] == [8, 4]
    with pytest.raises(BadInputError, match="3 pooling factors for 2 features"):
        model_from_torchrec_tables([
            {"name": "t0", "num_embeddings": 100, "embedding_dim": 8,
             "feature_names": ["a", "b"], "pooling_factors": [1.0, 2.0, 3.0]}],
            batch_size_per_gpu=8)


@pytest.mark.parametrize("cfg,field", [
    ({"name": "t", "num_embeddings": 10, "embedding_dim": 8}, "pooling_factors"),
    ({"name": "t", "num_embeddings": 10, "embedding_dim": 8, "pooling_factors": [1.0],
      "data_type": "FP64"}, "data_type"),
    ({"name": "t", "num_embeddings": 0, "embedding_dim": 8, "pooling_factors": [1.0]},
     "num_embeddings"),
])
def test_bad_table_config_names_field_and_table(cfg, field):
    with pytest.raises(BadInputError) as exc:
        model_from_torchrec_tables([cfg], batch_size_per_gpu=8)
    assert field in exc.value.field and exc.value.table == "t"


def _layout(make_layout):
    return make_layout([
        (table("a", 100, 32), tplan("a", "table_wise", [piece(1, 0, 100, 0, 32)])),
        (table("b", 80, 16), tplan("b", "row_wise", [piece(r, 10 * r, 10, 0, 16)
                                                      for r in range(8)])),
    ])


def test_plan_missing_a_table_is_bad_input(make_layout):
    layout = _layout(make_layout)
    exp = to_torchrec(layout)
    partial = exp.model_copy(update={"tables": exp.tables[:1]})
    with pytest.raises(BadInputError) as exc:
        layout_from_torchrec(partial, layout.request)
    assert exc.value.table == "b"


def test_plan_with_a_rank_outside_the_cluster_is_bad_input(make_layout):
    layout = _layout(make_layout)
    raw = json.loads(to_torchrec(layout).model_dump_json())
    raw["tables"][0]["parameter_sharding"]["ranks"] = [8]
    exp = type(to_torchrec(layout)).model_validate(raw)
    with pytest.raises(BadInputError) as exc:
        layout_from_torchrec(exp, layout.request)
    assert exc.value.field == "ranks" and exc.value.table == "a"


def test_caching_kernel_without_load_factor_gets_torchrecs_default(make_layout):
    layout = _layout(make_layout)
    raw = json.loads(to_torchrec(layout).model_dump_json())
    raw["tables"][0]["parameter_sharding"]["compute_kernel"] = "fused_uvm_caching"
    exp = type(to_torchrec(layout)).model_validate(raw)
    back = layout_from_torchrec(exp, layout.request)
    assert (back.tables[0].tier.value, back.tables[0].cache_ratio) == ("hbm_cache", 0.2)


def test_cli_export_import_evaluate(tmp_path, make_layout):
    layout = _layout(make_layout)
    plan_file = tmp_path / "layout.json"
    plan_file.write_text(layout.model_dump_json())
    out = tmp_path / "tr.json"
    res = runner.invoke(app, ["export", str(plan_file), "--format", "torchrec", "-o", str(out)])
    assert res.exit_code == 0, res.output
    exported = json.loads(out.read_text())
    assert [t["status"] for t in exported["tables"]] == ["exact", "exact"]
    model = tmp_path / "model.json"
    model.write_text(layout.request.model.model_dump_json())
    hw = tmp_path / "hw.json"
    hw.write_text(layout.request.hardware.model_dump_json())
    back = tmp_path / "back.json"
    res = runner.invoke(app, ["import", "plan", str(out), "--model", str(model), "--hardware",
                              str(hw), "-o", str(back)])
    assert res.exit_code == 0, res.output
    assert json.loads(back.read_text())["tables"] == json.loads(layout.model_dump_json())["tables"]
    res = runner.invoke(app, ["evaluate", str(back), "--format", "json"])
    assert res.exit_code == 0, res.output


def test_cli_export_exits_1_on_an_inexpressible_table(tmp_path, make_layout):
    layout = make_layout([(table("g", 40, 64), tplan(
        "g", "grid", [piece(4 + i, 10 * i, 10, 0, 32) for i in range(4)]
        + [piece(4 + i, 10 * i, 10, 32, 32) for i in range(4)]))])
    f = tmp_path / "p.json"
    f.write_text(layout.model_dump_json())
    res = runner.invoke(app, ["export", str(f), "-o", str(tmp_path / "o.json")])
    assert res.exit_code == 1
    assert "inexpressible: table 'g'" in res.output


def test_cli_import_tables_bad_input_exits_2(tmp_path):
    f = tmp_path / "t.json"
    f.write_text(json.dumps([{"name": "t", "num_embeddings": 5, "embedding_dim": 8}]))
    res = runner.invoke(app, ["import", "tables", str(f), "--batch-size", "8"])
    assert res.exit_code == 2
    assert "table 't'" in res.output and "pooling_factors" in res.output
    f.write_text(json.dumps({"tables": [{"name": "t", "num_embeddings": 5, "embedding_dim": 8,
                                         "pooling_factors": [2]}]}))
    res = runner.invoke(app, ["import", "tables", str(f), "--batch-size", "8"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["tables"][0]["pooling_factor"] == 2.0


def test_empty_torchrec_shards_are_not_pieces(make_layout):
    # 10 rows on 8 GPUs: TorchRec runs 2, 2, 2, 2, 2, 0, 0, 0; the empty blocks hold nothing.
    layout = make_layout([(table("rw", 10, 16), tplan(
        "rw", "row_wise", [piece(r, o, n, 0, 16) for r, (o, n) in enumerate(
            [(0, 2), (2, 2), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1), (9, 1)])]))])
    back = layout_from_torchrec(to_torchrec(layout), layout.request)
    assert [(p.rank, p.row_offset, p.row_count) for p in back.tables[0].pieces] == [
        (r, 2 * r, 2) for r in range(5)]


def test_sequence_table_pooling_none_read_back():
    """TorchRec's PoolingType NONE (an EmbeddingConfig of an EmbeddingCollection) becomes a
    sequence table, pooling_mode none; SUM leaves the field absent."""
    model = model_from_torchrec_tables([
        {"name": "s", "num_embeddings": 100, "embedding_dim": 8, "pooling": "PoolingType.NONE",
         "pooling_factor": 3.0},
        {"name": "p", "num_embeddings": 100, "embedding_dim": 8, "pooling": "SUM",
         "pooling_factor": 1.0}], batch_size_per_gpu=8)
    assert model.tables[0].pooling_mode == "none" and model.tables[0].sequence
    assert model.tables[1].pooling_mode is None
    with pytest.raises(BadInputError, match="pooling"):
        model_from_torchrec_tables([{"name": "s", "num_embeddings": 100, "embedding_dim": 8,
                                     "pooling": "MAX", "pooling_factor": 1.0}],
                                   batch_size_per_gpu=8)
