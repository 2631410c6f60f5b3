"""A plan with tables read by several features (one with its own smaller batch) run on 2
gloo ranks: the bag lengths and output all-to-all blocks are per bag (3 per sample for a
table read by 3 features), and every check of the run passes: bytes and memory equal to
the cost model's, outputs, weights and state equal to the unsharded reference's."""

import pytest

torch = pytest.importorskip("torch")

from planner import plan  # noqa: E402
from planner.executor.job import RunOptions  # noqa: E402
from planner.executor.run import execute  # noqa: E402
from tests.conftest import TWO_CPU_RANKS  # noqa: E402

B = 4
HARDWARE = TWO_CPU_RANKS
THREE = [{"name": "f_a", "pooling_factor": 1.0}, {"name": "f_b", "pooling_factor": 3.0},
         {"name": "f_c", "pooling_factor": 2.0, "batch_size_per_gpu": 2}]


def _t(name, kind, rows=64, dim=8, **more):
    return {"name": name, "num_embeddings": rows, "embedding_dim": dim, "optimizer": "sgd",
            "constraints": {"sharding_types": [kind]}, **more}


TABLES = [
    _t("shared_tw", "table_wise", features=THREE),
    _t("shared_rw", "row_wise", optimizer="rowwise_adagrad",
       features=[{"name": "g_a", "pooling_factor": 2.0}, {"name": "g_b", "pooling_factor": 1.5}]),
    _t("shared_twrw", "table_row_wise",
       features=[{"name": "h_a", "pooling_factor": 1.0, "batch_size_per_gpu": 3},
                 {"name": "h_b", "pooling_factor": 2.0}]),
    _t("shared_dp", "data_parallel",
       features=[{"name": "d_a", "pooling_factor": 1.0}, {"name": "d_b", "pooling_factor": 1.0}]),
    _t("single_tw", "table_wise", pooling_factor=6.0),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    p = plan({"model": {"batch_size_per_gpu": B, "tables": TABLES}, "hardware": HARDWARE,
              "options": {"solver": "greedy"}})
    rep = execute(p, RunOptions(steps=2, warmup_steps=0, collective_timeout_s=60),
                  run_dir=tmp_path_factory.mktemp("shared"), timeout_s=180)
    return p, rep


def test_every_check_passes(run):
    _, rep = run
    bad = [(c.name, c.detail) for c in rep.checks if not c.ok]
    assert bad == []
    names = " | ".join(c.name for c in rep.checks)
    for part in ("bytes: input all-to-all, bag lengths", "bytes: output all-to-all forward",
                 "memory held", "pooled outputs at step 0", "weights after 2 steps"):
        assert part in names, part


def test_bags_per_feature_on_the_wire(run):
    _, rep = run
    by = {(p["table"], p["rank"]): p for p in rep.pieces}
    three = next(v for (t, _), v in by.items() if t == "shared_tw")
    one = next(v for (t, _), v in by.items() if t == "single_tw")
    # Per sending rank: 4 + 4 + 2 = 10 bags of shared_tw against 4 of single_tw (the same
    # 6 ids per sample of the model's batch each): lengths and vectors 10/4 of the other's.
    for k in ("lengths_bytes",):
        assert three[k]["measured"] == three[k]["predicted"] > 0
        assert three[k]["measured"] * 4 == one[k]["measured"] * 10


def test_output_blocks_per_bag(run):
    p, rep = run
    ranks = {t.name: t.pieces[0].rank for t in p.tables}
    assert ranks["shared_tw"] != ranks["single_tw"]
    out = {r["rank"]: r["bytes"]["output_fwd"] for r in rep.ranks}
    for v in out.values():
        assert v["measured"] == v["predicted"] > 0
    # The two ranks send the same row-split blocks; beyond them, shared_tw's owner sends
    # 10 vectors of 8 fp32 columns where single_tw's sends 4.
    diff = out[ranks["shared_tw"]]["measured"] - out[ranks["single_tw"]]["measured"]
    assert diff == (10 - 4) * 8 * 4
