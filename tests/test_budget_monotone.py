"""A larger --time-limit never gives a worse plan, and the same request the same plan (the
CP-SAT stages run on deterministic time; the re-pack's rounds of a smaller budget are a
prefix of a larger one's)."""

import itertools
import json
from pathlib import Path

import pytest

from planner import plan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "models"


@pytest.mark.parametrize(("name", "hosts"), [("criteo_mlperf_v1", 2), ("criteo_dcnv2", 4)])
def test_more_budget_never_worse(name: str, hosts: int) -> None:
    model = json.loads((FIXTURES / f"{name}.json").read_text())
    steps, hashes = [], []
    for limit in (0.5, 1.0, 2.0):
        req = {"model": model, "hardware": {"preset": "h100", "hosts": hosts},
               "options": {"solver": "ilp", "time_limit_s": limit}}
        got = plan(req)
        steps.append(got.summary.step_time_s)
        hashes.append(got.plan_hash)
    assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(steps)), steps
    again = plan({"model": model, "hardware": {"preset": "h100", "hosts": hosts},
                  "options": {"solver": "ilp", "time_limit_s": 2.0}})
    assert again.plan_hash == hashes[-1]
