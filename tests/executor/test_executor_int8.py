"""int8 weight tables train in the executor (planner/executor/stored.py: FBGEMM's training
TBE's row layout and rounding, on the torch path whatever the kernels) and are checked like
every other table: bytes, memory held and the allocator-measured peak against the model, and
the outputs, weights and optimizer state against the float64 reference, which quantizes apart
(reference.py), within tolerances derived from the code step (run.py)."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cost_models.sizes import weight_row_bytes  # noqa: E402
from cost_models.types import DataType, Tier  # noqa: E402
from planner.executor import stored  # noqa: E402
from planner.executor.demo import small_plan  # noqa: E402
from planner.executor.store import make_store  # noqa: E402

# hbm table-wise (SGD), column-wise (Adagrad), ddr row-wise (row-wise Adagrad), an LFU-cached
# hbm_cache piece (row-wise Adagrad) and the data-parallel Adam table; cw_int8 is int8 in
# small_plan already.
INT8 = ("tw_sgd", "cw_adagrad", "rw_rowwise", "tw_cache", "dp_adam")


def int8_plan_json() -> str:
    body = json.loads(small_plan().model_dump_json())
    for t in body["request"]["model"]["tables"]:
        if t["name"] in INT8:
            t["data_type"] = "int8"
    return json.dumps(body)


def test_an_int8_plan_passes_every_check_from_the_cli(tmp_path: Path):
    from typer.testing import CliRunner

    from planner.cli import app

    plan = tmp_path / "plan.json"
    plan.write_text(int8_plan_json())
    out = tmp_path / "report.json"
    got = CliRunner().invoke(app, ["execute", str(plan), "--steps", "3", "--kernels", "auto",
                                   "--eps", "1e-2", "--run-dir", str(tmp_path / "run"),
                                   "-o", str(out)])
    rep = json.loads(out.read_text())
    bad = [(c["name"], c["detail"]) for c in rep["checks"] if not c["ok"]]
    assert got.exit_code == 0 and rep["ok"], (got.output[-3000:], bad)
    names = [c["name"] for c in rep["checks"]]
    assert any(n.startswith("memory peak per rank, allocator-measured") for n in names)
    assert any(n.startswith("weights after 3 steps vs reference") for n in names)
    int8_tables = {*INT8, "cw_int8"}
    assert {k.split(".")[0] for k in rep["errors"]["tolerance_rel_int8"]} == int8_tables
    # With fbgemm importable, int8 hbm pieces (which the TBE would otherwise serve) stay on
    # the torch path, and say why.
    if rep["kernels"] == "fbgemm":
        hbm = [p["key"] for p in rep["pieces"]
               if p["table"] in ("tw_sgd", "cw_adagrad", "cw_int8")]
        assert len(hbm) == 5
        for key in hbm:
            why = rep["piece_kernels"][key]
            assert why.startswith("torch: int8 weights"), (key, why)


def test_a_wrong_int8_rounding_is_caught(tmp_path: Path):
    from planner.executor.job import RunOptions
    from planner.executor.run import execute
    from planner.plan_model import Plan

    plan = Plan.model_validate_json(int8_plan_json())
    rep = execute(plan, RunOptions(steps=3, eps=1e-2, mutants=("w8_trunc",),
                                   collective_timeout_s=20), timeout_s=120)
    failed = {c.name.split(" vs")[0] for c in rep.checks if not c.ok}
    assert "pooled outputs at step 0" in failed
    assert any(n.startswith("weights after") for n in failed), failed


def _fbgemm_tbe_int8(rows: int, cols: int):
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            EmbeddingLocation,
            PoolingMode,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception:
        pytest.skip("fbgemm_gpu is not importable")
    return SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, cols, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=EmbOptimType.EXACT_SGD, weights_precision=SparseType.INT8,
        output_dtype=SparseType.FP32, stochastic_rounding=False, pooling_mode=PoolingMode.SUM,
        device=torch.device("cpu"))


def test_stored_int8_rows_are_fbgemms_rows_and_pool_as_its_tbe():
    """FBGEMM's training TBE with int8 weights holds rows of cols + 8 bytes; ours loaded into
    it pool to the same sums as our own lookup, and dequantize within half a step."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn((10, 8), generator=g) * torch.logspace(-2, 1, 10)[:, None]
    q = stored.quantize(x.clone())
    assert q.dtype == torch.uint8 and q.shape == (10, 8 + 8)
    back = stored.dequantize(q)
    step = (x.amax(1) - x.amin(1)) / 255
    assert bool(((back - x).abs() <= 0.5 * step[:, None] * (1 + 1e-5) + 1e-6).all())
    assert torch.equal(back.amin(1), x.amin(1))  # the bias is the row's minimum, code 0
    tbe = _fbgemm_tbe_int8(10, 8)
    assert tbe.weights_host.numel() == 10 * weight_row_bytes(DataType.INT8, 8)
    with torch.no_grad():
        tbe.split_embedding_weights()[0].copy_(q)
    ids, offsets = torch.tensor([1, 2, 3, 9, 9, 0]), torch.tensor([0, 2, 3, 5])
    ours = stored.pool(q, ids, offsets)
    assert torch.allclose(tbe(ids, torch.cat([offsets, torch.tensor([6])])).detach(), ours,
                          rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tier", [Tier.HBM, Tier.DDR, Tier.HBM_CACHE, Tier.SSD])
def test_int8_stores_hold_the_models_bytes_and_update_by_requantizing(tmp_path: Path,
                                                                      tier: Tier):
    rows, cols = 40, 6
    x = (torch.rand((rows, cols), generator=torch.Generator().manual_seed(1)) - 0.5) * 0.1
    w = stored.quantize(x.clone())
    st = make_store(w, torch.zeros((rows, 1)), tier, 0.25, torch.device("cpu"), "lfu",
                    tmp_path / "piece")
    held = st.memory()
    row = weight_row_bytes(DataType.INT8, cols)  # cols + 8
    want_bytes = rows * (row + 4)  # weights and the row-wise state
    if tier in (Tier.HBM_CACHE, Tier.SSD):  # cached int8 rows, 16 bytes of slot metadata
        want_bytes += st.slots * (row + 16 + (4 if tier is Tier.SSD else 0))
    assert held.hbm + held.ddr + held.ssd == want_bytes
    ids = torch.tensor([3, 5, 5, 7])
    before = stored.dequantize(w)
    assert torch.allclose(st.pool(ids, torch.tensor([0, 2])),
                          torch.stack([before[3] + before[5], before[5] + before[7]]))
    st.end_step()  # admits the rows looked up into a cache
    uniq = torch.tensor([3, 5, 7])
    st.update(uniq, lambda w_, s_: (w_ + 0.01, s_ + 1))
    got, state = st.dump()
    want = stored.dequantize(stored.quantize(before[uniq] + 0.01))
    assert torch.equal(got[uniq], want)
    assert torch.equal(got[[0, 1, 2]], before[[0, 1, 2]])
    assert state[uniq].eq(1).all() and state[[0, 1]].eq(0).all()
