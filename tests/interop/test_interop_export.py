"""Our plan -> TorchRec's ParameterSharding and back, without torchrec installed.

TorchRec's row split (torchrec/distributed/sharding_plan.py): blocks of ceil(rows/parts)
rows, then the rest, then zeros: 10 rows on 4 GPUs -> 3, 3, 3, 1; ours -> 3, 3, 2, 2.
"""

import json

import pytest

from planner.interop import layout_from_torchrec, to_torchrec
from planner.interop.export import ceil_row_split
from tests.interop.interop_helpers import piece, table, tplan


def test_ceil_row_split_matches_torchrec_examples():
    # The docstring examples of torchrec's _calculate_rw_shard_sizes_and_offsets.
    assert [n for _, n in ceil_row_split(10, 4)] == [3, 3, 3, 1]
    assert [n for _, n in ceil_row_split(5, 4)] == [2, 2, 1, 0]
    assert [o for o, _ in ceil_row_split(10, 4)] == [0, 3, 6, 9]


def _every_type() -> list:
    """One table of every expressible type, split so TorchRec reads it exactly."""
    tw = (table("tw", 100, 64), tplan("tw", "table_wise", [piece(5, 0, 100, 0, 64)]))
    cw = (table("cw", 100, 64), tplan("cw", "column_wise",
                                      [piece(6, 0, 100, 0, 32), piece(1, 0, 100, 32, 32)]))
    rw = (table("rw", 80, 16), tplan("rw", "row_wise",
                                     [piece(r, 10 * r, 10, 0, 16) for r in range(8)]))
    twrw = (table("twrw", 40, 16), tplan("twrw", "table_row_wise",
                                         [piece(4 + i, 10 * i, 10, 0, 16) for i in range(4)]))
    twcw = (table("twcw", 50, 64), tplan("twcw", "table_column_wise",
                                         [piece(3, 0, 50, 0, 32), piece(0, 0, 50, 32, 32)]))
    grid = (table("grid", 40, 64), tplan(
        "grid", "grid", [piece(4 + i, 10 * i, 10, 0, 32) for i in range(4)]
        + [piece(i, 10 * i, 10, 32, 32) for i in range(4)]))
    dp = (table("dp", 10, 8), tplan("dp", "data_parallel",
                                    [piece(r, 0, 10, 0, 8) for r in range(8)]))
    cached = (table("cached", 1000, 32), tplan("cached", "table_wise",
                                               [piece(2, 0, 1000, 0, 32)], "hbm_cache", 0.05))
    uvm = (table("uvm", 1000, 32), tplan("uvm", "table_wise", [piece(7, 0, 1000, 0, 32)], "ddr"))
    return [tw, cw, rw, twrw, twcw, grid, dp, cached, uvm]


def test_every_expressible_type_exports_exactly(make_layout):
    exp = to_torchrec(make_layout(_every_type()))
    by = {t.name: t for t in exp.tables}
    assert {t.status for t in exp.tables} == {"exact"}, [t.notes for t in exp.tables]
    assert by["grid"].parameter_sharding.sharding_type == "grid_shard"
    # Column-wise shards in column order, each on its own rank (ours: cols 0..31 on rank 6).
    cw = by["cw"].parameter_sharding
    assert cw.ranks == [6, 1]
    assert [s.shard_offsets for s in cw.sharding_spec] == [(0, 0), (0, 32)]
    assert cw.sharding_spec[0].placement == "rank:6/cuda:2"  # 4 GPUs per host
    # Grid: column block 0 on host 1, its rows over local GPUs 0..3 in order.
    assert by["grid"].parameter_sharding.ranks == [4, 5, 6, 7, 0, 1, 2, 3]
    # Tiers -> kernels; a cache tier carries its load factor.
    assert by["tw"].parameter_sharding.compute_kernel == "fused"
    assert by["dp"].parameter_sharding.compute_kernel == "dense"
    assert by["dp"].parameter_sharding.sharding_spec is None
    assert by["cached"].parameter_sharding.compute_kernel == "fused_uvm_caching"
    assert by["cached"].parameter_sharding.cache_params.load_factor == 0.05
    assert by["uvm"].parameter_sharding.compute_kernel == "fused_uvm"


def test_round_trip_gives_back_the_same_layout(make_layout):
    layout = make_layout(_every_type())
    exported = to_torchrec(layout)
    # Through JSON, as a file would carry it.
    again = type(exported).model_validate(json.loads(exported.model_dump_json()))
    back = layout_from_torchrec(again, layout.request)
    assert back.model_dump() == layout.model_dump()


def test_uneven_row_split_is_adjusted_to_torchrecs_and_says_so(make_layout):
    # 10 rows over 8 GPUs: ours 2,2,1,1,1,1,1,1; TorchRec can only run 2,2,2,2,2,0,0,0.
    ours = [(0, 2), (2, 2), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1), (9, 1)]
    layout = make_layout([(table("rw", 10, 16), tplan(
        "rw", "row_wise", [piece(r, o, n, 0, 16) for r, (o, n) in enumerate(ours)]))])
    t = to_torchrec(layout).tables[0]
    assert t.status == "adjusted"
    assert "ceil(10/8) = 2" in t.notes[0]
    assert [s.shard_sizes[0] for s in t.parameter_sharding.sharding_spec] == [2] * 5 + [0] * 3


def test_row_blocks_off_their_rank_order_are_adjusted(make_layout):
    # TWRW on host 1 with local GPUs in reverse row order: TorchRec routes block i to GPU i.
    layout = make_layout([(table("t", 40, 16), tplan(
        "t", "table_row_wise", [piece(7 - i, 10 * i, 10, 0, 16) for i in range(4)]))])
    t = to_torchrec(layout).tables[0]
    assert t.status == "adjusted"
    assert t.parameter_sharding.ranks == [4, 5, 6, 7]


def test_grid_with_two_blocks_on_one_host_is_inexpressible(make_layout):
    layout = make_layout([(table("g", 40, 64), tplan(
        "g", "grid", [piece(4 + i, 10 * i, 10, 0, 32) for i in range(4)]
        + [piece(4 + i, 10 * i, 10, 32, 32) for i in range(4)]))])
    t = to_torchrec(layout).tables[0]
    assert t.status == "inexpressible"
    assert t.parameter_sharding is None
    assert "one column block per host" in t.notes[0]


def test_ssd_tier_maps_to_key_value_with_a_note(make_layout):
    layout = make_layout([(table("s", 1000, 32), tplan(
        "s", "table_wise", [piece(0, 0, 1000, 0, 32)], "ssd", 0.1))])
    t = to_torchrec(layout).tables[0]
    assert t.parameter_sharding.compute_kernel == "key_value"
    assert t.parameter_sharding.cache_params.load_factor == 0.1
    assert any("key_value" in n for n in t.notes)


@pytest.mark.parametrize("fixture,hosts", [("criteo_dcnv2", 2), ("deeprecsys_rm2", 1)])
def test_planned_fixture_round_trips_and_scores_the_same(fixture, hosts):
    import planner
    from planner.planning import evaluate
    from planner.presets import fixture_text

    p = planner.plan({"model": json.loads(fixture_text(fixture)),
                      "hardware": {"preset": "h100", "hosts": hosts},
                      "options": {"solver": "greedy"}})
    exp = to_torchrec(p)
    exact = {t.name for t in exp.by_status("exact")}
    back = layout_from_torchrec(exp, p.request)
    for ours, again in zip(p.tables, back.tables, strict=True):
        if ours.name in exact:
            assert again == ours
    if len(exact) == len(p.tables):
        assert evaluate(back).summary.step_time_s == p.summary.step_time_s
