"""The allocator-measured memory peak: the CPU probe (torch.profiler memory events) sees real
allocations, not the memory model's shapes, and the peak check fails when the prediction is
too small, naming the rank and the phase."""

import json

import pytest

torch = pytest.importorskip("torch")

from planner.executor.demo import all_types_plan  # noqa: E402
from planner.executor.job import RunOptions, read_job, result_file  # noqa: E402
from planner.executor.memprobe import MemProbe  # noqa: E402
from planner.executor.run import ExecutionReport, _compare_peak, execute  # noqa: E402

PEAK_CHECK = "memory peak per rank, allocator-measured <= memory model"
MIB = 2**20


def test_cpu_probe_measures_what_a_phase_allocates_and_frees():
    probe = MemProbe(torch.device("cpu"))
    keep = torch.ones(MIB // 4)  # 1 MiB held from init on
    probe.mark_init()
    probe.start_measuring()
    with probe.phase("lookup"):
        big = torch.ones(4 * MIB // 4)  # 4 MiB, freed inside the phase
        small = big[:10].clone()
        del big
    with probe.phase("backward"):
        _ = small + 1
    got = probe.finish()
    assert got["init_bytes"] >= MIB
    assert got["phase_peak"]["lookup"] >= got["init_bytes"] + 4 * MIB
    assert got["phase_transient"]["lookup"] >= 4 * MIB
    # The 4 MiB were freed: the next phase's peak is back near what init held.
    assert got["phase_peak"]["backward"] < got["init_bytes"] + MIB
    assert got["step_peak"] == got["phase_peak"]["lookup"]
    del keep


def _peak_check(rep: ExecutionReport, run, measured, predicted: list[int] | None = None
                ) -> tuple[ExecutionReport, object]:
    out = ExecutionReport(rep.plan_hash, rep.world, rep.batch, rep.steps, 1.0, "cpu",
                          ranks=[{} for _ in measured])
    _compare_peak(out, run, measured, predicted)
    return out, next(c for c in out.checks if c.name == PEAK_CHECK)


def test_peak_check_fails_on_an_undersized_prediction_and_names_rank_and_phase(fp32_run):
    rep, run_dir = fp32_run
    run, _ = read_job(run_dir)
    measured = [json.loads(result_file(run_dir, r).read_text()) for r in range(rep.world)]
    # As run, every rank's prediction and measurement are reported, and the model's peak
    # is at most the plan's per-GPU bound.
    out, _ = _peak_check(rep, run, measured)
    for r in out.ranks:
        pm = r["peak_memory"]
        assert pm["measured_step_peak"] > 0 and 0 < pm["predicted"] <= pm["plan_bound"], pm
    # A prediction large enough passes; one byte short of a rank's peak fails, on that
    # rank alone, in the phase of the peak.
    top = max(m["peak_memory"]["step_peak"] for m in measured)
    out, check = _peak_check(rep, run, measured, [top] * rep.world)
    assert check.ok, check.detail
    assert all(r["peak_memory"]["ratio"] <= 1.0 for r in out.ranks)
    m1 = measured[1]["peak_memory"]
    phase = max(m1["phase_peak"], key=m1["phase_peak"].get)
    short = [m1["step_peak"] - 1 if r == 1 else top for r in range(rep.world)]
    _, check = _peak_check(rep, run, measured, short)
    assert not check.ok
    assert check.detail.startswith(f"rank 1: {m1['step_peak']:,} B in phase {phase}")
    assert "rank 0" not in check.detail


def test_a_rank_allocating_more_shows_in_its_measured_peak(fp32_run, tmp_path):
    """The fault hook alloc:RANK:BYTES makes one rank allocate 8 MiB more in its lookup
    phase: its measured lookup peak rises by that much, the other ranks' do not."""
    rep, _ = fp32_run
    extra = 8 * MIB
    got = execute(all_types_plan(batch=64), RunOptions(steps=2, warmup_steps=0,
                                                       fault=f"alloc:2:{extra}"),
                  run_dir=tmp_path, timeout_s=240, reference=False)
    peak = {r["rank"]: r["peak_memory"] for r in got.ranks}
    base = {r["rank"]: r["peak_memory"] for r in rep.ranks}
    assert peak[2]["phase_transient"]["lookup"] >= extra
    assert peak[2]["phase_peak"]["lookup"] >= base[2]["phase_peak"]["lookup"] + extra // 2
    for r in (0, 1, 3):
        assert peak[r]["phase_transient"]["lookup"] < extra // 4
    check = next(c for c in got.checks if c.name == PEAK_CHECK)
    assert not check.ok and "rank 2: " in check.detail and "in phase lookup" in check.detail
