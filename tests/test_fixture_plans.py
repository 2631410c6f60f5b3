"""Every bundled fixture on 1, 2, 4 and 16 hosts: the plan passes the independent checker,
and (on 16 hosts, and on 1 and 2 below 500 tables, but for a few whose search path another
case covers) planning the same request twice gives byte-identical JSON."""

import pytest

from planner import InfeasibleError, plan
from planner.check import check_plan
from planner.presets import fixture_names
from tests.conftest import fixture_request

HOSTS = (1, 2, 4, 16)
# zionex_12t host counts left to the benchmarks (the suite's time budget, issue 18): 2 hosts
# (40 s for two plans) too; a slice of it on 2 ZionEX hosts is planned and checked below.
_SLOW_12T = (2, 4, 16)
# Planned twice, for byte identity (the suite's 15 minutes): on 1, 2 and 16 hosts the
# fixtures below _TWICE_TABLES tables (below _TWICE_TABLES_16 on 16 hosts: hugectr_510 there,
# one fixture of over 500 tables planned twice, 24 s), except _ONCE, 5-15 s each a second
# time: by benchmarks/results/plan_quality.md's solver column, the paths they took are taken
# by cases still planned twice (ruin and recreate: criteo_dcnv2 x 2, hugectr_510 x 16; flat
# CP-SAT: criteo_mlperf_v1 x 2; hierarchical CP-SAT: criteo_mlperf_v1 x 16; LP start:
# hugectr_200 x 2; greedy start: criteo_kaggle x 2). Elsewhere (4 hosts; synthetic_1000
# everywhere, hugectr_510 on 1 and 2) planned once and checked; tests/test_budget_monotone.py
# re-plans a 2- and a 4-host request with the ilp solver, and tests/test_random_instances.py
# plans each of its instances twice (in a worker process; no fresh interpreter in the suite:
# benchmarks/random_instances --fresh-every does that).
_TWICE = (1, 2, 16)
_TWICE_TABLES = 500
_TWICE_TABLES_16 = 1000
_ONCE = {("criteo_dcnv2", 1), ("criteo_dcnv2", 16), ("hugectr_200", 1), ("hugectr_200", 16),
         ("criteo_mlperf_v1", 1)}


def test_all_fixtures_are_listed() -> None:
    assert len(fixture_names()) == 10


@pytest.mark.parametrize("hosts", HOSTS)
@pytest.mark.parametrize("fixture", fixture_names())
def test_fixture_plan_checks_and_is_deterministic(fixture: str, hosts: int) -> None:
    if fixture == "zionex_12t" and hosts in _SLOW_12T:
        pytest.skip("zionex_12t plans take 20-40 CPU s each: checked here on 1 host (infeasible) "
                    "and a slice on 2 ZionEX hosts; 2, 4 and 16 h100 hosts are planned by "
                    "benchmarks/plan_quality")
    req = fixture_request(fixture, hosts)
    if fixture == "zionex_12t" and hosts == 1:
        # 48 TB of fp32 weights cannot fit one host's 0.6 TB HBM + 1.8 TB DDR + 30.7 TB SSD.
        with pytest.raises(InfeasibleError) as info:
            plan(req)
        assert "short by" in info.value.reason
        return
    first = plan(req)
    report = check_plan(first)
    assert report.ok, report.errors[:5]
    assert first.summary.step_time_s >= first.summary.lower_bound_s * (1 - 1e-9)
    limit = _TWICE_TABLES_16 if hosts == 16 else _TWICE_TABLES
    if hosts not in _TWICE or len(req["model"]["tables"]) >= limit or (fixture, hosts) in _ONCE:
        return
    second = plan(req)
    assert first.model_dump_json() == second.model_dump_json()


def test_12t_model_slice_needs_slower_tiers_on_2_zionex_hosts() -> None:
    """Every 12th table of the 12T model on 2 ZionEX hosts: its weights pass the hosts' HBM
    plus DDR (5.0 TB against 4.0; the whole model on 16 hosts: 48 TB against 33 TB), so SSD
    and a cached or DDR tier are needed. (The whole model on 16 hosts took 155 s of the
    suite; benchmarks/plan_quality plans and checks it.)"""
    req = fixture_request("zionex_12t", 2, preset="zionex_a100")
    req["model"]["tables"] = req["model"]["tables"][::12]
    p = plan(req)
    assert check_plan(p).ok
    assert p.summary.tables_per_tier.get("ssd", 0) > 0
    assert p.summary.tables_per_tier.get("ddr", 0) + p.summary.tables_per_tier.get(
        "hbm_cache", 0) > 0
    assert any("slower memory tiers" in w for w in p.summary.warnings)
    # The weights alone exceed the hosts' HBM plus DDR (fp32: 4 bytes a value).
    weights = sum(4 * t["num_embeddings"] * t["embedding_dim"] for t in req["model"]["tables"])
    hw = p.request.hardware
    hbm_plus_ddr = hw.hosts * (hw.gpus_per_host * hw.gpu.hbm_capacity_bytes
                               + hw.host.ddr_capacity_bytes)
    assert hbm_plus_ddr < weights
