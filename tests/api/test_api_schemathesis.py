"""Schemathesis against the live server's own OpenAPI schema: over 1,000 generated requests
(valid and invalid, every operation, the fixture examples first), no 5xx and no response
outside the schema (status code, content type, body). PLANNER_FUZZ_SCALE=2.2 makes it over
2,000 (benchmarks/service.py runs it so and records the result)."""

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api.conftest import LiveServer, start_server

SCALE = float(os.environ.get("PLANNER_FUZZ_SCALE", "1"))
MIN_REQUESTS = int(1000 * SCALE)


@schemathesis.check
def no_server_error(ctx, response, case):  # type: ignore[no-untyped-def]
    """not_a_server_error, except /readyz's documented 503 while the queue is full (the fuzz
    server's queue holds 4 jobs: generated plans fill it)."""
    if (case.operation.path == "/readyz" and response.status_code == 503
            and "aturated" in response.text):
        return None
    return not_a_server_error(ctx, response, case)


CHECKS = [no_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
# Examples per generation mode (valid, invalid), by operation: generating a whole plan for
# /v1/check takes ~0.1 s, a request for /v1/plans ~0.03 s, so the cheap ones get more.
EXAMPLES = {"POST /v1/plans": (100, 80), "GET /v1/plans/{plan_id}": (230, 150),
            "GET /v1/jobs/{job_id}": (230, 150), "POST /v1/evaluate": (20, 15),
            "POST /v1/check": (12, 10), "GET /v1/schemas/{kind}": (4, 60),
            "DELETE /v1/jobs/{job_id}": (60, 40)}
# Operations without inputs have one valid request and no invalid one.
NO_INPUTS = (1, 0)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    # Small limits, short solves and a short synchronous wait, so generated requests that
    # happen to be valid cannot tie the run up: they answer 202, or 429 once the queue is full.
    server = start_server(tmp, tmp / "fuzz.sqlite3", max_tables=50, max_gpus=64,
                          max_time_limit_s=2, solve_overhead_s=1, job_timeout_s=3,
                          sync_wait_s=0.2, max_queued_jobs=4, max_body_bytes=2**20)
    try:
        yield server
    finally:
        server.kill(signal.SIGTERM)


@pytest.mark.timeout(150 * max(1.0, SCALE))
def test_generated_requests_get_no_5xx_and_conform(fuzz_server: LiveServer) -> None:
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    session = requests.Session()
    sent = 0
    start = time.monotonic()
    for result in schema.get_all_operations():
        operation = result.ok()
        base = EXAMPLES.get(f"{operation.method.upper()} {operation.path}", NO_INPUTS)
        counts = (base if base == NO_INPUTS
                  else (round(base[0] * SCALE), round(base[1] * SCALE)))
        for mode, examples in zip((GenerationMode.POSITIVE, GenerationMode.NEGATIVE), counts,
                                  strict=True):
            if not examples:
                continue

            cases = operation.as_strategy(generation_mode=mode)

            @given(case=cases)
            @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                      phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=list(HealthCheck))
            def run(case: schemathesis.Case) -> None:
                nonlocal sent
                sent += 1
                case.call_and_validate(session=session, checks=CHECKS, timeout=30)

            run()
    elapsed = time.monotonic() - start
    served = httpx.get(fuzz_server.url + "/metrics").text
    print(f"schemathesis: {sent} requests in {elapsed:.1f} s, operations "
          f"{len(list(schema.get_all_operations()))}", file=sys.stderr)
    assert sent >= MIN_REQUESTS, f"only {sent} requests generated"
    assert 'status="500"' not in served


@pytest.mark.timeout(60)
def test_subnormal_bandwidth_is_bad_input_not_a_server_error(fuzz_server: LiveServer) -> None:
    hardware = {"hosts": 1, "gpus_per_host": 2,
                "gpu": {"name": "g", "hbm_capacity_bytes": 2**20,
                        "hbm_bandwidth_gb_per_s": 5e-324},
                "host": {"ddr_capacity_bytes": 0, "ddr_bandwidth_gb_per_s": 100.0},
                "links": {"nic_gb_per_s": 10.0, "nvlink_gb_per_s": 100.0, "pcie_gb_per_s": 10.0}}
    layout = {"request": {"model": {"batch_size_per_gpu": 1, "tables": [
        {"name": "a", "num_embeddings": 1, "embedding_dim": 1, "pooling_factor": 1.0}]},
        "hardware": hardware},
        "tables": [{"name": "a", "sharding_type": "table_wise", "tier": "hbm", "pieces": [
            {"rank": 0, "host": 0, "row_offset": 0, "row_count": 1, "col_offset": 0,
             "col_count": 1}]}]}
    r = httpx.post(fuzz_server.url + "/v1/evaluate", json=layout, timeout=30)
    # Schemathesis found this one: 1/bandwidth overflowed to inf and the bound raised.
    assert r.status_code == 422, r.text
    assert "hbm_bandwidth_gb_per_s" in r.text
