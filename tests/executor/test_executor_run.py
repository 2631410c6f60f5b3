"""One plan holding every sharding type (table-, column-, row-wise, table-row-wise,
table-column-wise, grid, data-parallel) and every tier (hbm, hbm_cache, ddr, ssd), run on 4
gloo ranks (2 hosts x 2 ranks) for 5 training steps, checked against the cost model and an
unsharded reference."""

import pytest

torch = pytest.importorskip("torch")

from cost_models.sizes import comm_row_bytes  # noqa: E402
from cost_models.types import CommPrecision  # noqa: E402
from planner.executor.run import ERROR_GAIN, UNIT_ROUNDOFF  # noqa: E402

PEAK_CHECK = "memory peak per rank, allocator-measured <= memory model"
TYPES = {"table_wise", "column_wise", "row_wise", "table_row_wise", "table_column_wise",
         "grid", "data_parallel"}


def _check(rep, name_start):
    found = [c for c in rep.checks if c.name.startswith(name_start)]
    assert found, name_start
    return found[0]


def test_plan_covers_every_type_and_tier(fp32_run):
    rep, _ = fp32_run
    assert {p["kind"] for p in rep.pieces} == TYPES - {"data_parallel"}
    # The data-parallel table shows in the all-reduce, which only it uses.
    assert all(r["bytes"]["allreduce"]["measured"] > 0 for r in rep.ranks)
    assert {p["tier"] for p in rep.pieces} == {"hbm", "hbm_cache", "ddr", "ssd"}
    assert rep.world == 4


def test_fp32_outputs_weights_and_states_match_the_float64_reference(fp32_run):
    rep, _ = fp32_run
    for name in ("pooled outputs at step 0", "pooled outputs of steps", "weights after 5 steps",
                 "optimizer state after 5 steps"):
        assert _check(rep, name).ok, (name, _check(rep, name).detail)
    e = rep.errors
    # Within the per-element bound, and not identical: the reference is independent.
    assert 0 < max(e["outputs_step0_vs_bound"].values()) <= 1.0
    for t, tol in e["tolerance_rel"].items():
        assert e["weights_rel"][t] <= tol
        if t != "tw_fp16_ddr":  # fp32 storage: a tolerance far below a 1% error
            assert tol < 1e-4, (t, tol)


def test_bytes_per_collective_equal_the_cost_model(fp32_run):
    rep, _ = fp32_run
    for name in ("bytes: input all-to-all, bag lengths", "bytes: output all-to-all forward",
                 "bytes: output all-to-all backward", "bytes: data-parallel all-reduce",
                 "bytes: input all-to-all, ids of table-", "ids: every id of a row-split",
                 "bytes: input ids of row-split", "memory held"):
        c = _check(rep, name)
        assert c.ok, (name, c.detail)
    for r in rep.ranks:
        for k in ("input_lengths", "output_fwd", "output_bwd", "allreduce"):
            assert r["bytes"][k]["measured"] == r["bytes"][k]["predicted"], (r["rank"], k)
        # What the collectives carried, counted by the collective, is what the ranks report.
        assert r["collectives"]["input_lengths"]["recv"] == r["bytes"]["input_lengths"][
            "measured"]
    # Sums per collective are non-trivial: something really crossed the wire.
    assert sum(r["bytes"]["output_fwd"]["measured"] for r in rep.ranks) > 0
    assert sum(r["bytes"]["allreduce"]["measured"] for r in rep.ranks) > 0
    # Table-wise piece: (W-1) ranks x b samples x pooling ids of 8 bytes, and b int32 lengths
    # from each of them.
    tw = next(p for p in rep.pieces if p["table"] == "tw_hbm")
    assert tw["ids_bytes"]["measured"] == tw["ids_bytes"]["predicted"] == 3 * 64 * 3 * 8
    assert tw["lengths_bytes"]["measured"] == tw["lengths_bytes"]["predicted"] == 3 * 64 * 4
    # A row-wise piece gets a length for every sample, even those with no id in its rows.
    rw = [p for p in rep.pieces if p["kind"] == "row_wise"]
    assert rw and all(p["lengths_bytes"]["measured"] == 3 * 64 * 4 for p in rw)
    # Every rank's input-id bytes: exact on ranks holding no row-split piece.
    ranks_rs = {p["rank"] for p in rep.pieces if p["kind"] in ("row_wise", "table_row_wise",
                                                              "grid")}
    for r in rep.ranks:
        if r["rank"] not in ranks_rs:
            assert r["bytes"]["input_ids"]["measured"] == r["bytes"]["input_ids"]["predicted"]


def test_zipf_cache_hit_rate_within_two_points(fp32_run):
    rep, _ = fp32_run
    assert _check(rep, "cache hit rate").ok, _check(rep, "cache hit rate").detail
    zipf = [p for p in rep.pieces if p["table"] in ("zipf_cache", "zipf_ssd", "cw_cache")]
    assert len(zipf) == 4
    for p in zipf:
        h = p["hit_rate"]
        assert abs(h["measured"] - h["predicted"]) <= 0.02, p
        assert h["measured"] > 0.3  # a real cache, not a pass-through


def test_two_runs_give_bit_identical_weights(fp32_run, fp32_rerun):
    (_, a), (_, b) = fp32_run, fp32_rerun
    for r in range(4):
        da, db = torch.load(a / f"rank{r}.pt"), torch.load(b / f"rank{r}.pt")
        assert da.keys() == db.keys()
        for k in da:
            assert torch.equal(da[k], db[k]), (r, k)


def test_quantized_communication_within_tolerance(quantized_run, fp32_run):
    rep, _, fwd, bwd = quantized_run
    for name in ("pooled outputs at step 0", "pooled outputs of steps", "weights after",
                 "optimizer state after"):
        assert _check(rep, name).ok, (name, _check(rep, name).detail)
    e = rep.errors
    # The rounding really happened, and used a good part of its bound.
    assert 0.3 < max(e["outputs_step0_vs_bound"].values()) <= 1.0
    u = max(UNIT_ROUNDOFF[CommPrecision(fwd)], UNIT_ROUNDOFF[CommPrecision(bwd)])
    for t, tol in e["tolerance_rel"].items():
        assert tol >= ERROR_GAIN * rep.steps * u
        assert 0 < e["weights_rel"][t] <= tol
    # Bytes still equal the model, and shrink as the precision says: a pooled vector of d
    # columns costs comm_row_bytes(precision, d) instead of 4*d.
    assert _check(rep, "bytes: output all-to-all forward").ok
    assert _check(rep, "bytes: output all-to-all backward").ok
    assert _check(rep, "bytes: data-parallel all-reduce").ok
    base, _ = fp32_run
    tw_rank0 = next(r for r in rep.ranks if r["rank"] == 0)["bytes"]["output_fwd"]["measured"]
    base0 = next(r for r in base.ranks if r["rank"] == 0)["bytes"]["output_fwd"]["measured"]
    assert tw_rank0 < base0
    assert comm_row_bytes(CommPrecision(fwd), 8) < 32


def test_cli_prepares_a_torchrun_job_and_collects_a_finished_run(fp32_run, tmp_path):
    import json

    from typer.testing import CliRunner

    from planner.cli import app
    from planner.executor.demo import all_types_plan

    rep, run_dir = fp32_run
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(all_types_plan(batch=64).model_dump_json())
    runner = CliRunner()
    got = runner.invoke(app, ["execute", str(plan_file), "--run-dir", str(run_dir),
                              "--collect", "--format", "json"])
    # Exit 0: every check passes on the collected run, the allocator-measured peak within
    # the memory model's on every rank among them.
    assert got.exit_code == 0, got.output
    body = json.loads(got.stdout)
    assert body["plan_hash"] == rep.plan_hash
    assert [c["name"] for c in body["checks"] if not c["ok"]] == []
    assert any(c["name"] == PEAK_CHECK for c in body["checks"])
    job_dir = tmp_path / "job"
    got = runner.invoke(app, ["execute", str(plan_file), "--run-dir", str(job_dir),
                              "--prepare-only", "--scale-rows", "0.5"])
    assert got.exit_code == 0, got.output
    assert "torchrun" in got.stdout and (job_dir / "job.json").is_file()
    got = runner.invoke(app, ["execute", str(tmp_path / "missing.json")])
    assert got.exit_code == 2


def test_byte_checks_catch_a_lost_id_and_a_lost_length(fp32_run):
    """The byte checks read what the ranks measured: one id a rank did not deliver to a
    row-split piece, or one bag length short, must fail them."""
    import json

    from planner.executor.job import read_job, result_file
    from planner.executor.layout import exec_layout
    from planner.executor.run import ExecutionReport, _compare_model

    rep, run_dir = fp32_run
    run, _ = read_job(run_dir)
    lay = exec_layout(run)
    measured = [json.loads(result_file(run_dir, r).read_text()) for r in range(rep.world)]
    rw = next(p for p in rep.pieces if p["kind"] == "row_wise")
    piece = measured[rw["rank"]]["pieces"][rw["key"]]
    piece["own_ids"] -= 1 / rep.steps  # one id, in one of the measured steps

    def checks(ms):
        out = ExecutionReport(rep.plan_hash, rep.world, rep.batch, rep.steps, 1.0, "cpu")
        _compare_model(out, run, lay, ms)
        return {c.name: c.ok for c in out.checks}

    got = checks(measured)
    assert not got["ids: every id of a row-split table served by exactly one piece per "
                   "column band"]
    piece["own_ids"] += 1 / rep.steps
    assert all(checks(measured).values())
    measured[0]["collectives"]["input_lengths"]["recv"] -= 4 / rep.steps
    assert not checks(measured)["bytes: input all-to-all, bag lengths, per rank"]
