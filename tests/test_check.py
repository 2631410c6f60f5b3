"""The checker catches what a wrong plan gets wrong, whoever made it."""

from typing import Any

from planner import plan
from planner.check import check_plan
from planner.hashing import plan_hash_of
from planner.plan_model import Plan
from tests.conftest import fixture_request


def _plan_dict() -> dict[str, Any]:
    return plan(fixture_request("deeprecsys_rm2", 2)).model_dump(mode="json")


def _errors(d: dict[str, Any], rehash: bool = True) -> list[str]:
    if rehash:
        d["plan_hash"] = plan_hash_of(d)
    return check_plan(Plan.model_validate(d)).errors


def test_untouched_plan_passes() -> None:
    assert _errors(_plan_dict(), rehash=False) == []


def test_edited_content_breaks_the_hash() -> None:
    d = _plan_dict()
    d["summary"]["step_time_s"] *= 0.5
    assert any("plan_hash" in e for e in _errors(d, rehash=False))


def test_missing_rows_and_double_cover_are_found() -> None:
    d = _plan_dict()
    piece = d["tables"][0]["pieces"][0]
    piece["row_count"] -= 1
    assert any("missing" in e for e in _errors(d))
    d = _plan_dict()
    d["tables"][0]["pieces"].append(dict(d["tables"][0]["pieces"][0]))
    assert any("covered twice" in e or "table_wise" in e for e in _errors(d))


def test_missing_table_and_bad_rank_are_found() -> None:
    d = _plan_dict()
    gone = d["tables"].pop()["name"]
    assert any(f"'{gone}'" in e and "missing" in e for e in _errors(d))
    d = _plan_dict()
    d["tables"][0]["pieces"][0]["rank"] = 99
    assert any("does not exist" in e for e in _errors(d))


def test_memory_over_cap_is_found() -> None:
    d = _plan_dict()
    # Each GPU holds about 248 MiB of rm2's tables; shrink the free HBM to 64 MiB.
    d["request"]["hardware"]["gpu"]["hbm_capacity_bytes"] = 2**27
    d["request"]["hardware"]["gpu"]["hbm_reserved_bytes"] = 2**26
    assert any("over its cap" in e for e in _errors(d))


def test_figures_that_do_not_add_up_are_found() -> None:
    d = _plan_dict()
    d["gpus"][3]["cost"]["lookup_s"] += 1e-3
    errs = _errors(d)
    assert any("GPU 3" in e for e in errs)
    d = _plan_dict()
    d["summary"]["mean_gpu_time_s"] *= 1.01
    assert any("mean_gpu_time_s" in e for e in _errors(d))
