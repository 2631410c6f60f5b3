"""`planner execute --compare` and the data-parallel buckets: units, then one small run.

The run is a hand-made 3-rank plan (3, so that the ring's all-gather forwards a received
buffer) whose three data-parallel tables fill two DDP buckets
(the first closes at 1 MiB), beside a table-wise and a row-wise table: the reference check
must still pass with one ring per bucket, and the timing must count one all-reduce call
per bucket."""

import json
import random
import time
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cost_models import buckets  # noqa: E402
from planner.executor.comm import SETTLE_S, PhaseTime, Timer  # noqa: E402
from planner.executor.compare import (  # noqa: E402
    compare,
    hardware_note,
    measured_phases,
    predicted_phases,
    spearman,
)
from planner.executor.job import RunOptions  # noqa: E402
from planner.executor.run import execute  # noqa: E402
from planner.plan_model import Plan, PlanLayout  # noqa: E402
from planner.planning import evaluate  # noqa: E402
from planner.presets import preset_dict  # noqa: E402
from planner.problem import build_problem  # noqa: E402


def test_buckets_are_ddps():
    """Our assignment against torch's own reducer function, with DDP's default limits."""
    rng = random.Random(3)
    f = torch.distributed._compute_bucket_assignment_by_size
    for _ in range(200):
        sizes = [4 * rng.choice([1, 10, 1000, 2**17, 2**18, 2**20, 7 * 2**20])
                 for _ in range(rng.randint(1, 12))]
        ts = [torch.empty(n // 4) for n in sizes]
        want, _ = f(ts, [buckets.ALLREDUCE_FIRST_BUCKET_BYTES, buckets.ALLREDUCE_BUCKET_BYTES],
                    [False] * len(ts))
        assert buckets.bucket_assignment(sizes) == [list(b) for b in want], sizes
        assert buckets.allreduce_calls(sizes) == len(want)


def _busy(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_timer_takes_nested_and_collective_time_out_of_the_phase():
    timer = Timer(torch.device("cpu"), defaultdict(float))
    timer.new_step()
    with timer("lookup"):
        _busy(0.03)
        with timer("cache_miss"):
            _busy(0.02)
        with timer.excluded():
            _busy(0.02)
        with timer.collective():
            time.sleep(0.05)  # wall, not CPU
    rec = timer.steps[-1]
    assert 0.028 <= rec["lookup"].cpu <= 0.045
    assert 0.019 <= rec["cache_miss"].cpu <= 0.03
    assert rec["lookup"].coll_wall >= 0.05 and rec["lookup"].calls == 1
    assert rec["lookup"].wall >= 0.12  # inclusive
    assert rec["cache_miss"].calls == 0


def test_measured_phases_are_cpu_medians_and_collective_wall_quartiles():
    steps = [{"lookup": {"cpu": c, "wall": 9.0}, "input_a2a": {"cpu": 5.0, "coll_wall": w}}
             for c, w in ((1.0, 2.0), (3.0, 8.0), (2.0, 4.0))]
    meas, unmodelled = measured_phases(steps)
    # Collectives: the lower quartile of (2, 4, 8), interpolated as numpy's default does.
    assert meas["lookup"] == 2.0 and meas["input_a2a"] == pytest.approx(3.0)
    assert meas["input_a2a"] == pytest.approx(float(np.percentile([2.0, 8.0, 4.0], 25)))
    assert unmodelled["packing_cpu"] == 5.0


def test_spearman_matches_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(1)
    for _ in range(50):
        n = rng.randint(3, 12)
        x = [rng.choice([1.0, 2.0, 3.0, rng.random()]) for _ in range(n)]
        y = [rng.random() for _ in range(n)]
        want = stats.spearmanr(x, y).statistic
        got = spearman(x, y)
        assert (got is None) == (want != want) or got == pytest.approx(want)
    assert spearman([1.0, 1.0], [1.0, 2.0]) is None


def _layout() -> dict[str, Any]:
    hw = preset_dict("h100")
    hw.update(hosts=1, gpus_per_host=3)

    def table(name: str, rows: int, dim: int, opt: str) -> dict[str, Any]:
        return {"name": name, "num_embeddings": rows, "embedding_dim": dim,
                "pooling_factor": 4.0, "access_frequency": {"kind": "uniform"},
                "optimizer": opt}

    def piece(rank: int, row0: int, rows: int, dim: int) -> dict[str, int]:
        return {"rank": rank, "host": 0, "row_offset": row0, "row_count": rows,
                "col_offset": 0, "col_count": dim}

    # 5,000 x 64 fp32 = 1.28 MB each: DDP's first bucket takes the last table alone (past
    # 1 MiB), the second the other two.
    dp = [(f"dp{i}", 5000, 64, opt) for i, opt in enumerate(("sgd", "adagrad", "adam"))]
    tables = [table("tw", 400, 16, "rowwise_adagrad"), table("rw", 600, 16, "sgd"),
              *(table(*d) for d in dp)]
    layout = [
        {"name": "tw", "sharding_type": "table_wise", "tier": "hbm",
         "pieces": [piece(1, 0, 400, 16)]},
        {"name": "rw", "sharding_type": "row_wise", "tier": "hbm",
         "pieces": [piece(0, 0, 200, 16), piece(1, 200, 200, 16), piece(2, 400, 200, 16)]},
        *({"name": n, "sharding_type": "data_parallel", "tier": "hbm",
           "pieces": [piece(r, 0, rows, dim) for r in range(3)]} for n, rows, dim, _ in dp)]
    return {"request": {"model": {"batch_size_per_gpu": 32, "tables": tables}, "hardware": hw,
                        "options": {}},
            "tables": layout}


@pytest.fixture(scope="module")
def bucket_plan() -> Plan:
    return evaluate(PlanLayout.model_validate(_layout()))


def test_predicted_phases_add_up_to_the_plans_terms(bucket_plan):
    for g in bucket_plan.gpus:
        c = g.cost.model_dump()
        p = predicted_phases(c, 3.0, 1.0)
        assert sum(p.values()) == pytest.approx(c["compute_s"] + c["comm_s"])
        assert p["output_a2a_fwd"] == pytest.approx(3 * p["output_a2a_bwd"])


def test_a_gpu_preset_measured_on_cpu_is_said_to_be_another_machine(bucket_plan):
    same, note = hardware_note(bucket_plan, "cpu")
    assert not same and "not the one predicted" in note
    hw = bucket_plan.request.hardware.model_copy(update={
        "name": "this-cpu", "sources": ["planner calibrate on this host"]})
    calibrated = bucket_plan.model_copy(update={"request": bucket_plan.request.model_copy(
        update={"hardware": hw})})
    assert hardware_note(calibrated, "cpu")[0]


def test_buckets_run_one_ring_each_and_match_the_reference(bucket_plan, tmp_path):
    # Time from 4 steps of their own after the 3 checked ones (no memory probe): the byte,
    # memory and reference checks still see the 3 (they would fail on 7 steps' counts).
    rep = execute(bucket_plan, RunOptions(steps=3, timed_steps=4, warmup_steps=0,
                                          collective_timeout_s=60),
                  run_dir=tmp_path, timeout_s=240)
    failed = [(c.name, c.detail) for c in rep.checks if not c.ok]
    assert not failed, failed
    for r in rep.ranks:
        # Ready order is the reverse table order: dp2 (index 4) alone, then dp1 and dp0.
        assert r["buckets"] == [[4], [3, 2]]
        assert r["timed_steps"] == 4 and len(r["timing"]) == 4
        assert all(s["allreduce"]["calls"] == 2 for s in r["timing"])
        # A buffer still referenced makes _settle wait SETTLE_S per hop (it once did: 4 s).
        assert all(s["allreduce"]["wall"] < SETTLE_S for s in r["timing"]), r["timing"]
        assert all(s["lookup"]["cpu"] > 0 and s["input_a2a"]["coll_wall"] > 0
                   for s in r["timing"])
    c = rep.compare
    assert c["plan"]["same_machine"] is False
    for row in c["ranks"]:
        assert {"input_a2a", "lookup", "backward", "allreduce"} <= set(row["phases"])
        assert row["measured_total"] > 0
    again = compare(bucket_plan, rep.ranks, "cpu")
    assert again["plan"]["measured_step_s"] == c["plan"]["measured_step_s"]
    # The prediction compared is the executor's: two whole DDP calls, not the plan's shares
    # (3 x 1.28 MB of 25 MiB: 0.15 of a call).
    hw = build_problem(bucket_plan.request).hw
    k = hw.constants
    call = k.allreduce_call_latency_s + 2 * (hw.world_size - 1) * k.allreduce_hop_latency_s
    for row, g in zip(c["ranks"], bucket_plan.gpus, strict=True):
        shares = 3 * 5000 * 64 * 4 / k.allreduce_bucket_bytes
        assert row["phases"]["allreduce"]["predicted"] == pytest.approx(
            g.cost.allreduce_s + (2 - shares) * call)
        assert row["predicted_step_s"] == pytest.approx(g.cost.total_s + (2 - shares) * call)
    assert isinstance(PhaseTime(), PhaseTime)


def test_fidelity_slice_runs_one_stored_plan():
    """One plan of benchmarks/fidelity.py, run as the benchmark runs it: every check passes
    (bytes, memory, hit rates), both clocks give a measured step, the summary and the
    Markdown are made from it. The same executions reported against the layout priced
    under another profile (as the calibrated set reprices its runs under the sessions'
    median): the same measurements, that profile's prediction."""
    from benchmarks import fidelity
    from planner.planning import evaluate, resolve

    name = "rm3_1x2_cache"  # an hbm_cache plan: the warm-up and hit-rate path too
    path = fidelity.PLAN_DIR / "preset" / f"{name}.plan.json"
    p = Plan.model_validate_json(path.read_text())
    executed = fidelity.executed_rounds([(name, p, None)], "preset")
    r = fidelity.reported_runs([(name, p, None)], executed, "preset")[0]
    hw = json.loads((fidelity.RESULTS / "fidelity_profile.json").read_text())
    other = evaluate(PlanLayout(schema_version=p.schema_version,
                                request=resolve(fidelity.request(name, hw)), tables=p.tables))
    again = fidelity.reported_runs([(name, other, None)], executed, "preset")[0]
    for clock in fidelity.CLOCKS:
        a, b = (x["by_clock"][clock]["plan"] for x in (r, again))
        assert a["measured_step_s"] == b["measured_step_s"]
        assert a["predicted_step_s"] != pytest.approx(b["predicted_step_s"], rel=0.05)
    assert again["executions_step_s_by_clock"] == r["executions_step_s_by_clock"]
    assert not r["checks_failed"], r["checks_failed_detail"]
    assert r["checks_failed_detail"] == []
    assert r["hit_rate_check"]["ok"]
    for clock in fidelity.CLOCKS:
        pl = r["by_clock"][clock]["plan"]
        assert pl["measured_step_s"] > 0 and pl["predicted_step_s"] > 0
        assert pl["collective_clock"] == clock
    r.update(fixture="deeprecsys_rm3", hosts=1, gpus_per_host=2, solver="greedy",
             kinds=["table_wise/hbm_cache"])
    sm = fidelity.summarize({name: r}, "wall")
    assert sm["plans"] == 1 and sm["hit_rate_checks_passed"] == 1
    text = fidelity.markdown({"command": "c", "machine": "m", "load_before": [0],
                              "load_after": [0], "seconds": 1.0,
                              "preset": {"runs": [{"plans": {name: r}, "summary": {
                                  c: fidelity.summarize({name: r}, c)
                                  for c in fidelity.CLOCKS}}]},
                              "calibrated": None, "calibration_note": "not available"})
    assert name in text and "not available" in text


def test_figures_over_executions_are_each_phase_median_over_them() -> None:
    """measured_over: each phase's figure in each execution (median of compute over steps,
    lower quartile of collectives), then the median over executions; counted here from the
    step lists directly."""
    from planner.executor.compare import measured_over

    rng = random.Random(3)

    def execution(level: float) -> list[dict[str, dict[str, float]]]:
        return [{"lookup": {"cpu": level * rng.uniform(0.9, 1.1)},
                 "input_a2a": {"coll_wall": level * 2 * rng.uniform(1.0, 1.5)}}
                for _ in range(9)]

    runs = [execution(lv) for lv in (1e-3, 5e-3, 2e-3)]
    phases, _ = measured_over(runs)

    def lower_quartile(v: list[float]) -> float:
        v = sorted(v)
        return v[2]  # 9 values: the quartile falls on the third exactly

    looks = sorted(sorted(s["lookup"]["cpu"] for s in r)[4] for r in runs)
    a2as = sorted(lower_quartile([s["input_a2a"]["coll_wall"] for s in r]) for r in runs)
    assert phases["lookup"] == pytest.approx(looks[1])
    assert phases["input_a2a"] == pytest.approx(a2as[1])
    assert 1.8e-3 < phases["lookup"] < 2.2e-3  # the middle execution's level, not the mean
    one, _ = measured_over(runs[:1])
    assert one["lookup"] == pytest.approx(sorted(s["lookup"]["cpu"] for s in runs[0])[4])


def test_compare_prices_the_plan_it_is_given_whole_calls_included():
    """One execution of a plan with data-parallel tables compared against the same layout
    priced under another profile: each rank's all-reduce prediction is that profile's
    (its charged shares plus the executor's whole calls, predict.predict of that plan), not
    the figure the execution carried from the plan that ran."""
    from benchmarks import fidelity
    from planner.executor.compare import compare
    from planner.executor.predict import predict
    from planner.executor.scale import scaled_plan
    from planner.planning import evaluate, resolve

    name = "kaggle_1x2_dp"  # ten data-parallel tables: whole all-reduce calls
    p = Plan.model_validate_json((fidelity.PLAN_DIR / "preset" / f"{name}.plan.json")
                                 .read_text())
    scale, batch = fidelity.shape(name, "preset")
    r = fidelity.timed_execution(p, scale, batch, 0)
    hw = json.loads((fidelity.RESULTS / "fidelity_profile.json").read_text())
    other = scaled_plan(evaluate(PlanLayout(
        schema_version=p.schema_version, request=resolve(fidelity.request(name, hw)),
        tables=p.tables)), scale, batch)
    ran = {row["rank"]: row["seconds_predicted"]["allreduce"] for row in r.ranks}
    theirs = {rp.rank: rp.seconds["allreduce"] for rp in predict(other)[0]}
    got = compare(other, r.ranks, "cpu")
    for row in got["ranks"]:
        a = row["phases"]["allreduce"]["predicted"]
        assert a == pytest.approx(theirs[row["rank"]], rel=1e-9)
        assert a != pytest.approx(ran[row["rank"]], rel=0.05)  # the premise: profiles differ
