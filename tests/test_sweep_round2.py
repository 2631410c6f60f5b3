"""Answers a second adversarial sweep found untrue or unclean, each now held to the checker
(a plan it accepts where the planner had said "infeasible" or "optimal" over a narrower
grid) or to a clean error."""

import json
from typing import Any

import pytest

from planner import BadInputError, plan
from planner.check import check_plan
from planner.explain import explain_table
from planner.plan_model import Plan, PlanLayout
from planner.planning import evaluate

LINKS = {"nvlink_gb_per_s": 100, "nic_gb_per_s": 25, "pcie_gb_per_s": 32}
HOST = {"ddr_capacity_bytes": "64GiB", "ddr_reserved_bytes": 0, "ddr_bandwidth_gb_per_s": 100,
        "ssd_capacity_bytes": "1TB", "ssd_bandwidth_gb_per_s": 5}


def _hw(hosts: int, g: int, hbm: int | str, reserved: int | str) -> dict[str, Any]:
    return {"name": "t", "hosts": hosts, "gpus_per_host": g,
            "gpu": {"name": "g", "hbm_capacity_bytes": hbm, "hbm_reserved_bytes": reserved,
                    "hbm_bandwidth_gb_per_s": 1000}, "host": HOST, "links": LINKS}


def _one_table(hw: dict[str, Any]) -> dict[str, Any]:
    """A request of one small table on `hw`."""
    return {"model": {"batch_size_per_gpu": 64, "tables": [
        {"name": "c", "num_embeddings": 1000, "embedding_dim": 32, "pooling_factor": 1.0}]},
        "hardware": hw}


def _ok(p: Plan) -> None:
    assert check_plan(p).errors == []


def test_grid_pinned_to_one_host_of_two() -> None:
    """Its two column chunks both on the pinned host, as on one host: was "infeasible"."""
    req = {"model": {"batch_size_per_gpu": 512, "tables": [
        {"name": "a", "num_embeddings": 100_000, "embedding_dim": 64, "pooling_factor": 2.0,
         "constraints": {"sharding_types": ["grid"], "pinned_ranks": [0, 1]}},
        {"name": "c", "num_embeddings": 5000, "embedding_dim": 32, "pooling_factor": 1.0}]},
        "hardware": _hw(2, 2, "4GiB", "1GiB")}
    p = plan(req)
    _ok(p)
    a = next(t for t in p.tables if t.name == "a")
    assert a.sharding_type.value == "grid" and {x.rank for x in a.pieces} == {0, 1}


def test_more_column_chunks_than_gpus() -> None:
    """Three 32-column chunks on two GPUs fit where two 48-column ones do not: was answered
    "infeasible" by CP-SAT over a grid of at most one chunk per GPU."""
    req = {"model": {"batch_size_per_gpu": 64, "tables": [
        {"name": "x", "num_embeddings": 3_000_000, "embedding_dim": 96, "pooling_factor": 1.0,
         "optimizer": "sgd", "constraints": {"sharding_types": ["column_wise"],
                                             "memory_tiers": ["hbm"]}},
        {"name": "y", "num_embeddings": 781_250, "embedding_dim": 96, "pooling_factor": 1.0,
         "optimizer": "sgd", "constraints": {"sharding_types": ["table_wise"],
                                             "memory_tiers": ["hbm"]}}]},
        "hardware": _hw(1, 2, 900_000_000, 80_000_000)}
    p = plan(req)
    _ok(p)
    x = next(t for t in p.tables if t.name == "x")
    assert len(x.pieces) == 3 and {q.col_count for q in x.pieces} == {32}


def test_cache_ratio_below_the_grid() -> None:
    """hbm_cache forced on a GPU too small for the grid's least ratio (0.01): the largest
    ratio that fits, not "infeasible"."""
    req = {"model": {"batch_size_per_gpu": 64, "tables": [
        {"name": "big", "num_embeddings": 100_000_000, "embedding_dim": 32,
         "pooling_factor": 1.0, "optimizer": "sgd",
         "constraints": {"memory_tiers": ["hbm_cache"]}}]},
        "hardware": _hw(1, 1, 130_000_000, 80_000_000)}
    p = plan(req)
    _ok(p)
    assert 0 < p.tables[0].cache_ratio < 0.01


def test_a_mislabelled_layout_is_scored_and_explained_cleanly() -> None:
    """A table labelled row_wise on 2 of 4 GPUs: evaluate scores it with the checker's
    complaint (it raised ValueError: a 500 from the service); explain says what is wrong."""
    req = _one_table(_hw(2, 2, "4GiB", "1GiB"))
    p = plan(req)
    layout = json.loads(p.model_dump_json())
    layout["tables"][0]["sharding_type"] = "row_wise"
    layout["tables"][0]["pieces"] = [
        {"rank": r, "host": 0, "row_offset": 500 * r, "row_count": 500, "col_offset": 0,
         "col_count": 32} for r in (0, 1)]
    layout = {k: layout[k] for k in ("schema_version", "request", "tables")}
    scored = evaluate(PlanLayout.model_validate(layout))
    assert scored.summary.status == "evaluated (fails the checker)"
    assert any("row_wise" in w for w in scored.summary.warnings)
    with pytest.raises(BadInputError, match="do not make a row_wise layout"):
        explain_table(scored, "c")


@pytest.mark.parametrize("field", ["hbm_efficiency", "nic_efficiency"])
def test_subnormal_efficiency_is_refused(field: str) -> None:
    hw = _hw(2, 2, "4GiB", "1GiB")
    hw["constants"] = {field: 5e-324}
    req = _one_table(hw)
    with pytest.raises(BadInputError, match=field):
        plan(req)


def test_a_rank_past_64_bits_is_refused() -> None:
    req = _one_table(_hw(1, 2, "4GiB", "1GiB"))
    body = json.loads(plan(req).model_dump_json())
    body["tables"][0]["pieces"][0]["rank"] = 2**63
    with pytest.raises(ValueError, match="less than or equal"):
        Plan.model_validate(body)


@pytest.mark.parametrize(("value", "says"), [
    (-1, "must be at least 0 bytes"), (float("inf"), "finite"),
    (4.7000000001e9, "whole number"), (None, "number of bytes or a string"),
    (True, "number of bytes or a string")])
def test_byte_fields_say_what_is_wrong(value: Any, says: str) -> None:
    """Each was "could not parse value and unit from byte string" (and true was 1 byte)."""
    hw = _hw(1, 2, "4GiB", "1GiB")
    hw["gpu"]["hbm_capacity_bytes"] = value
    req = _one_table(hw)
    with pytest.raises(BadInputError, match=says) as info:
        plan(req)
    assert "hbm_capacity_bytes" in str(info.value) and "Value error" not in str(info.value)


def test_two_host_counts_are_refused() -> None:
    """hosts 1 with overrides.hosts 3 was 3 hosts, silently."""
    req = {"model": "criteo_kaggle",
           "hardware": {"preset": "h100", "hosts": 1, "overrides": {"hosts": 3}}}
    with pytest.raises(BadInputError, match=r"contradicts hardware\.hosts"):
        plan(req)


def test_a_cache_ratio_must_match_its_tier() -> None:
    """An hbm piece with a cache ratio, or an hbm_cache piece without one, was accepted."""
    req = _one_table(_hw(1, 2, "4GiB", "1GiB"))
    body = json.loads(plan(req).model_dump_json())
    layout = {k: body[k] for k in ("schema_version", "request", "tables")}
    layout["tables"][0]["cache_ratio"] = 0.5
    scored = evaluate(PlanLayout.model_validate(layout))
    assert any("which has no cache" in w for w in scored.summary.warnings)
    layout["tables"][0]["cache_ratio"] = None
    layout["tables"][0]["tier"] = "hbm_cache"
    scored = evaluate(PlanLayout.model_validate(layout))
    assert any("needs its cache_ratio" in w for w in scored.summary.warnings)
