"""The checker catches what a wrong plan gets wrong, whoever made it."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

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
    assert any(e.startswith("gpus[3].cost.lookup_s: plan says") for e in errs)
    d = _plan_dict()
    d["summary"]["mean_gpu_time_s"] *= 1.01
    assert any("mean_gpu_time_s" in e for e in _errors(d))


def test_cli_check_strict_fails_an_unverified_claim(tmp_path: Path) -> None:
    """A CP-SAT bound the checker cannot re-prove in its budget: exit 0 with a warning;
    exit 1 with --strict. A forged optimal: exit 1 naming the field."""
    # criteo_dcnv2 x 1 closes at the analytic bound since the bound counts the all-to-all
    # calls' latency; criteo_mlperf_v1 x 1 still needs CP-SAT's bound, which the checker
    # re-proves in 8 deterministic seconds (measured: not within the default 4). CP-SAT
    # proves it above the analytic one with 2 deterministic seconds of its own (half of 4;
    # with 1, the default's half, it did not).
    p = plan({**fixture_request("criteo_mlperf_v1", 1), "options": {"time_limit_s": 4.0}})
    assert p.summary.bound_certificate.kind == "cp-sat"  # not re-proven in 0.01 det s
    path = tmp_path / "plan.json"
    path.write_text(p.model_dump_json())
    ok = _cli(["check", str(path), "--proof-budget", "8"])
    assert ok.returncode == 0 and "bound re-proven" in ok.stdout, ok.stderr
    lax = _cli(["check", str(path), "--proof-budget", "0.01"])
    assert lax.returncode == 0 and "warning:" in lax.stderr and "not verified" in lax.stderr
    strict = _cli(["check", str(path), "--proof-budget", "0.01", "--strict"])
    assert strict.returncode == 1 and "fail:" in strict.stderr and "not verified" in strict.stderr
    d = p.model_dump(mode="json")
    d["summary"]["bound_certificate"]["claimed_s"] = d["summary"]["step_time_s"] * 1.5
    d["plan_hash"] = plan_hash_of(d)
    path.write_text(json.dumps(d))
    forged = _cli(["check", str(path)])
    assert forged.returncode == 1 and "summary.lower_bound_s" in forged.stderr


def _cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_phase_start_terms_are_recomputed_on_every_gpu() -> None:
    """A profile's lookup_start_s and backward_start_s (calibrate fits them) are charged
    once per GPU and step; the checker counts them from the constants on its own, so a
    plan that left them out, or counted them twice, fails."""
    req = fixture_request("deeprecsys_rm2", 2)
    req["hardware"]["overrides"] = {"constants": {"lookup_start_s": 2e-4,
                                                  "backward_start_s": 3e-4}}
    d = plan(req).model_dump(mode="json")
    base = plan(fixture_request("deeprecsys_rm2", 2)).model_dump(mode="json")
    assert _errors(d, rehash=False) == []
    for g in d["gpus"]:
        assert g["cost"]["lookup_s"] >= 2e-4 and g["cost"]["backward_s"] >= 3e-4
    if [t["pieces"] for t in d["tables"]] == [t["pieces"] for t in base["tables"]]:
        # The same layout: every GPU's lookup is the preset's plus the start, exactly.
        for g, h in zip(d["gpus"], base["gpus"], strict=True):
            assert g["cost"]["lookup_s"] - h["cost"]["lookup_s"] == pytest.approx(2e-4)
    d["gpus"][0]["cost"]["lookup_s"] -= 2e-4  # as if the start were left out on GPU 0
    assert any(e.startswith("gpus[0].cost.lookup_s: plan says") for e in _errors(d))
