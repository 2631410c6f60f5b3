"""The CP-SAT partitioner: exact on tiny instances (against brute force), checked, deterministic,
never worse than the heuristic."""

import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.bound_falsify import every_placement
from planner import InfeasibleError, plan
from planner.check import check_plan
from planner.partition import cpsat
from planner.partition.state import LoadState
from planner.planning import candidates_for, resolve
from planner.presets import fixture_text
from planner.problem import build_problem

TINY_TYPES = ["table_wise", "column_wise", "row_wise", "table_row_wise",
              "table_column_wise", "data_parallel"]


@st.composite
def tiny_requests(draw: Any) -> dict[str, Any]:
    hosts, gpus = draw(st.sampled_from([(1, 2), (1, 3), (2, 2), (1, 4), (4, 1), (2, 1)]))
    n = draw(st.integers(1, 6 if hosts * gpus <= 3 else 4))
    tabs = []
    for i in range(n):
        types = draw(st.lists(st.sampled_from(TINY_TYPES), min_size=1, max_size=2, unique=True))
        tabs.append({
            "name": f"t{i}",
            "num_embeddings": draw(st.integers(1_000, 3_000_000)),
            "embedding_dim": draw(st.sampled_from([32, 64, 128])),
            "pooling_factor": draw(st.floats(1.0, 60.0)),
            "optimizer": draw(st.sampled_from(["sgd", "rowwise_adagrad"])),
            "constraints": {"sharding_types": sorted({*types, "table_wise"}),
                            "memory_tiers": draw(st.sampled_from([["hbm"], ["hbm", "ddr"]]))},
        })
    return {
        "model": {"batch_size_per_gpu": draw(st.sampled_from([256, 4096])),
                  "pipelined": draw(st.booleans()), "tables": tabs},
        "hardware": {"preset": "h100", "hosts": hosts,
                     "overrides": {"gpus_per_host": gpus,
                                   "gpu": {"hbm_capacity_bytes": draw(st.sampled_from(
                                       ["2GiB", "3GiB", "80GiB"])),
                                           "hbm_reserved_bytes": "1GiB"},
                                   "host": {"ddr_capacity_bytes": "16GiB",
                                            "ddr_reserved_bytes": "8GiB"}}},
        "options": {"solver": "ilp", "time_limit_s": 60.0},
    }


def brute_force(req: dict[str, Any]) -> float:
    """The smallest makespan over every candidate and every placement, caps respected:
    depth-first, pruned only by the best makespan found so far."""
    problem = build_problem(resolve(req))
    cands, _ = candidates_for(problem)
    hw = problem.hw
    g, w = hw.gpus_per_host, hw.world_size
    options = [[(c, p) for c in cs for p in every_placement(c, g, w)] for cs in cands]
    best = float("inf")

    def fits(s: LoadState) -> bool:
        return bool((s.hbm <= hw.hbm_cap).all() and (s.ddr <= hw.ddr_cap).all()
                    and (s.ssd <= hw.ssd_cap).all())

    def go(t: int, s: LoadState) -> None:
        nonlocal best
        if t == len(options):
            best = min(best, float(s.load().max()))
            return
        for cand, placement in options[t]:
            nxt = s.copy()
            for grp, ranks in zip(cand.groups, placement, strict=True):
                nxt.apply(grp, ranks)
            if fits(nxt) and float(nxt.load().max()) < best:
                go(t + 1, nxt)

    go(0, LoadState.empty(problem))
    return best


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_requests())
def test_ilp_optimum_equals_brute_force(req: dict[str, Any]) -> None:
    try:
        p = plan(req)
    except InfeasibleError:
        assert brute_force(req) == float("inf")
        return
    assert check_plan(p).ok, check_plan(p).errors
    assert p.summary.status == "optimal", p.summary.status
    best = brute_force(req)
    # CP-SAT works in integer units of 1e-7 of the start's makespan, rounded down.
    assert p.summary.step_time_s == pytest.approx(best, rel=1e-5)
    assert p.summary.lower_bound_s <= p.summary.step_time_s * (1 + 1e-9)


def _fixture_request(name: str, hosts: int, **options: Any) -> dict[str, Any]:
    return {"model": json.loads(fixture_text(name)),
            "hardware": {"preset": "h100", "hosts": hosts}, "options": options}


def test_same_request_same_plan_with_the_solver() -> None:
    """The exact model stopped by its deterministic budget, run here and in a fresh process."""
    req = _fixture_request("criteo_dcnv2", 1, solver="ilp", time_limit_s=0.5)
    first = plan(req)
    assert first.summary.solver_det_time > 0
    code = ("import json,sys; from planner import plan; "
            "sys.stdout.write(plan(json.load(sys.stdin)).model_dump_json(indent=1))")
    other = subprocess.run([sys.executable, "-c", code], input=json.dumps(req), text=True,
                           capture_output=True, check=True, timeout=120).stdout
    assert other == first.model_dump_json(indent=1)


def test_repack_is_deterministic_and_never_worse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpsat, "EXACT_MAX_VARS", 0)  # force the large-instance path
    req = _fixture_request("criteo_dcnv2", 2, solver="ilp", time_limit_s=1.0)
    a, b = plan(req), plan(req)
    assert a.model_dump_json() == b.model_dump_json()
    greedy = plan(_fixture_request("criteo_dcnv2", 2, solver="greedy"))
    assert a.summary.step_time_s <= greedy.summary.step_time_s
    assert check_plan(a).ok


@pytest.mark.parametrize(("name", "hosts"), [("criteo_kaggle", 16), ("deeprecsys_rm3", 1),
                                             ("criteo_mlperf_v1", 2)])
def test_auto_never_worse_than_greedy(name: str, hosts: int) -> None:
    auto = plan(_fixture_request(name, hosts))
    greedy = plan(_fixture_request(name, hosts, solver="greedy"))
    assert auto.summary.step_time_s <= greedy.summary.step_time_s
    assert greedy.summary.solver_det_time == 0 and not greedy.summary.solver_history
    assert check_plan(auto).ok


def test_proven_optimum_closes_the_gap() -> None:
    """deeprecsys_rm3 on one host: CP-SAT proves the plan optimal and its bound becomes the
    plan's. (criteo_kaggle x 1 served here until the all-to-all latency terms: its six calls a
    step now dominate every GPU alike, and 5 det s no longer close its last 0.7%.)"""
    p = plan(_fixture_request("deeprecsys_rm3", 1, solver="ilp", time_limit_s=5.0))
    assert p.summary.status == "optimal"
    assert p.summary.gap == pytest.approx(0.0, abs=1e-5)
    assert "CP-SAT" in p.summary.lower_bound_note
    assert p.summary.solver_history
    h = p.summary.solver_history[-1]
    assert h.bound_s is not None and h.bound_s <= h.incumbent_s


def test_progress_shows_incumbent_and_bound_on_a_terminal_only() -> None:
    import io

    from rich.console import Console

    from planner.progress import solver_progress

    buf = io.StringIO()
    term = Console(file=buf, force_terminal=True, width=120)
    with solver_progress(term, enabled=True) as update:
        assert update is not None
        update(cpsat.Progress(det_time=0.5, incumbent_s=0.002, bound_s=0.0019))
    assert "incumbent 2 ms" in buf.getvalue() and "bound 1.9 ms" in buf.getvalue()
    with solver_progress(term, enabled=False) as update:  # --quiet
        assert update is None
    pipe = Console(file=io.StringIO(), force_terminal=False)
    with solver_progress(pipe, enabled=True) as update:  # output not a terminal
        assert update is None


def test_small_exact_model_on_many_hosts_proves_optimal() -> None:
    """deeprecsys_rm3 on 4 hosts: the flat exact model is small (the policy's
    flat_any_hosts_vars), so it runs instead of the hierarchical one and proves the plan
    optimal; the checker re-proves the bound from the request alone."""
    p = plan({"model": "deeprecsys_rm3", "hardware": {"preset": "h100", "hosts": 4}})
    assert p.summary.status == "optimal"
    assert p.summary.lower_bound_s >= p.summary.step_time_s * (1 - 1e-4)
    report = check_plan(p, strict=True)
    assert report.ok, report.errors
