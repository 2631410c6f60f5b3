"""`constraints.cache_load_factor` (TorchRec's CacheParams.load_factor): a cached table uses
that cache ratio and no other; the checker refuses a plan that does not; absent, it is left
out of the JSON (old hashes hold)."""

import copy

from planner import plan
from planner.check import check_plan
from planner.plan_model import Plan
from planner.spec.table import TableConstraints


def _request(factor: float | None) -> dict:
    c: dict = {"memory_tiers": ["hbm_cache"]}
    if factor is not None:
        c["cache_load_factor"] = factor
    return {"model": {"batch_size_per_gpu": 64, "tables": [
        {"name": "big", "num_embeddings": 2_000_000, "embedding_dim": 64, "pooling_factor": 8.0,
         "access_frequency": {"kind": "zipf", "alpha": 1.1}, "constraints": c},
        {"name": "small", "num_embeddings": 1000, "embedding_dim": 16, "pooling_factor": 2.0}]},
        "hardware": {"preset": "h100", "hosts": 1}, "options": {"solver": "greedy"}}


def test_a_cached_table_takes_its_load_factor_and_the_checker_holds_it_to_it() -> None:
    free = plan(_request(None))
    chosen = next(t for t in free.tables if t.name == "big").cache_ratio
    factor = 0.37 if chosen != 0.37 else 0.42  # not a grid ratio the planner would pick
    p = plan(_request(factor))
    big = next(t for t in p.tables if t.name == "big")
    assert big.tier.value == "hbm_cache" and big.cache_ratio == factor
    assert check_plan(p).errors == []
    d = copy.deepcopy(p.model_dump(mode="json"))
    for t in d["tables"]:
        if t["name"] == "big":
            t["cache_ratio"] = chosen
    errs = check_plan(Plan.model_validate(d)).errors
    assert any("cache_load_factor" in e for e in errs), errs


def test_absent_it_is_left_out_of_the_json() -> None:
    assert "cache_load_factor" not in TableConstraints(sharding_types=["table_wise"]).model_dump()
    assert TableConstraints(cache_load_factor=0.5).model_dump()["cache_load_factor"] == 0.5
