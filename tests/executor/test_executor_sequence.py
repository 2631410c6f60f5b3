"""Sequence (unpooled) tables run on 2 gloo ranks (issue 18 item 5): every id returns its own
vector, sent back to its sample's owner (a row-wise piece: the vectors of the ids in its
range, re-assembled by the owner in id order); targets and row gradients per id. Every check
of the run passes: bytes and memory as the cost model's, outputs, weights and state equal to
the unsharded float64 reference's (torch.nn.functional.embedding on the whole table)."""

import pytest

torch = pytest.importorskip("torch")

from planner import plan  # noqa: E402
from planner.executor.job import RunOptions  # noqa: E402
from planner.executor.run import execute  # noqa: E402
from tests.conftest import TWO_CPU_RANKS  # noqa: E402

B = 4
HARDWARE = TWO_CPU_RANKS


def _t(name, kind, rows=64, dim=8, pinned=None, **more):
    c = {"sharding_types": [kind]}
    if pinned is not None:
        c["pinned_ranks"] = [pinned]
    return {"name": name, "num_embeddings": rows, "embedding_dim": dim, "optimizer": "sgd",
            "constraints": c, **more}


SEQ = {"pooling_mode": "none"}
TABLES = [
    _t("seq_tw", "table_wise", pinned=0, pooling_factor=3.0, **SEQ),
    _t("pooled_tw", "table_wise", pinned=1, pooling_factor=3.0),
    _t("seq_rw", "row_wise", optimizer="rowwise_adagrad", pooling_factor=2.5, **SEQ),
    _t("seq_cw", "column_wise", dim=16, optimizer="adam",
       constraints={"sharding_types": ["column_wise"], "min_column_shard_width": 8},
       features=[{"name": "c_a", "pooling_factor": 1.0},
                 {"name": "c_b", "pooling_factor": 2.0, "batch_size_per_gpu": 2}], **SEQ),
    _t("seq_dp", "data_parallel", pooling_factor=2.0, **SEQ),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    p = plan({"model": {"batch_size_per_gpu": B, "tables": TABLES}, "hardware": HARDWARE,
              "options": {"solver": "greedy"}})
    rep = execute(p, RunOptions(steps=2, warmup_steps=0, collective_timeout_s=60),
                  run_dir=tmp_path_factory.mktemp("sequence"), timeout_s=180)
    return p, rep


def test_plan_kinds(run):
    p, _ = run
    kinds = {t.name: t.sharding_type.value for t in p.tables}
    assert kinds == {"seq_tw": "table_wise", "pooled_tw": "table_wise", "seq_rw": "row_wise",
                     "seq_cw": "column_wise", "seq_dp": "data_parallel"}


def test_every_check_passes(run):
    _, rep = run
    bad = [(c.name, c.detail) for c in rep.checks if not c.ok]
    assert bad == []
    names = " | ".join(c.name for c in rep.checks)
    for part in ("bytes: output all-to-all forward", "bytes: output all-to-all backward",
                 "memory peak per rank", "pooled outputs at step 0", "weights after 2 steps",
                 "optimizer state after 2 steps"):
        assert part in names, part


def test_one_vector_per_id_on_the_wire(run):
    """seq_tw on rank 0 and pooled_tw on rank 1, same shape and 3 ids per sample: seq_tw's
    piece sends rank 1 3 x 4 vectors where pooled_tw's sends rank 0 4 (8 fp32 columns each).
    seq_cw's two pieces send alike; seq_rw's piece sends one vector per id it got from the
    other rank. So the ranks' forward bytes differ by exactly that."""
    p, rep = run
    ranks = {t.name: {q.rank for q in t.pieces} for t in p.tables}
    assert ranks["seq_tw"] == {0} and ranks["pooled_tw"] == {1}
    assert ranks["seq_cw"] == ranks["seq_rw"] == {0, 1}
    out = {r["rank"]: r["bytes"]["output_fwd"]["measured"] for r in rep.ranks}
    bwd = {r["rank"]: r["bytes"]["output_bwd"]["measured"] for r in rep.ranks}
    rw = {q["rank"]: q["ids_bytes"]["measured"] / 8 for q in rep.pieces
          if q["table"] == "seq_rw"}
    assert rw[0] > 0 and rw[1] > 0
    row = 8 * 4
    want = (3 * B - B) * row + (rw[0] - rw[1]) * row
    assert out[0] - out[1] == pytest.approx(want)
    assert bwd[0] - bwd[1] == pytest.approx(want)
    tw = {q["table"]: q for q in rep.pieces if q["table"] in ("seq_tw", "pooled_tw")}
    assert tw["seq_tw"]["ids_bytes"]["measured"] == tw["pooled_tw"]["ids_bytes"]["measured"]
