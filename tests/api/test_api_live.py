"""The service over real HTTP (uvicorn on loopback): plans, jobs, errors, limits, auth."""

import copy
import json

import httpx
import pytest

from planner import plan
from tests.api.conftest import API_KEY, LiveServer, fixture_model, small_request, wait_job

pytestmark = pytest.mark.timeout(120)
PROBLEM = "application/problem+json"


def test_health_is_open_and_v1_needs_the_key(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url, timeout=10) as bare:
        assert bare.get("/healthz").json() == {"status": "ok"}
        assert bare.get("/readyz").json()["status"] == "ready"
        for path in ("/v1/presets", "/metrics", "/v1/schemas/request"):
            r = bare.get(path)
            assert r.status_code == 401, path
            assert r.headers["content-type"] == PROBLEM
        assert bare.get("/v1/presets", headers={"X-API-Key": "wrong"}).status_code == 401
        ok = bare.get("/v1/presets", headers={"Authorization": f"Bearer {API_KEY}"})
        assert ok.status_code == 200
        assert {p["name"] for p in ok.json()["hardware"]} >= {"h100", "h200", "zionex_a100"}
        assert "criteo_kaggle" in ok.json()["models"]


def test_small_plan_is_synchronous_and_the_same_as_plan(client: httpx.Client) -> None:
    req = small_request()
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201), r.text
    body = r.json()
    # The service adds nothing: its plan is planner.plan()'s, byte for byte in content.
    assert body == json.loads(plan(req).model_dump_json())
    job_id = r.headers["X-Job-Id"]
    assert r.headers["Location"] == f"/v1/plans/{job_id}"
    again = client.post("/v1/plans", json=req)
    assert again.status_code == 200 and again.headers["X-Job-Id"] == job_id
    assert again.content == r.content
    assert client.get(f"/v1/plans/{job_id}").json() == body
    page = client.get(f"/v1/plans/{job_id}/report")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<html" in page.text and '<script src="http' not in page.text
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded" and job["plan_url"] == f"/v1/plans/{job_id}"
    # A preset and its expansion are the same request: same job.
    expanded = {"model": req["model"], "hardware": body["request"]["hardware"]}
    assert client.post("/v1/plans", json=expanded).headers["X-Job-Id"] == job_id


def test_async_mode_answers_202_and_the_job_finishes(client: httpx.Client) -> None:
    req = small_request(hosts=2, seed=7)
    r = client.post("/v1/plans", params={"mode": "async"}, json=req)
    assert r.status_code == 202, r.text
    job = r.json()
    assert r.headers["Location"] == f"/v1/jobs/{job['id']}"
    assert job["status"] in ("queued", "running")
    done = wait_job(client, job["id"], 60)
    assert done["status"] == "succeeded", done
    assert client.get(done["plan_url"]).json()["request"]["hardware"]["hosts"] == 2
    header = client.post("/v1/plans", json=small_request(hosts=3),
                         headers={"Prefer": "respond-async"})
    assert header.status_code == 202


def test_bad_input_names_field_and_table(client: httpx.Client) -> None:
    req = small_request()
    req["model"]["tables"][3]["embedding_dim"] = -4
    r = client.post("/v1/plans", json=req)
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM
    p = r.json()
    name = req["model"]["tables"][3]["name"]
    assert p["field"] == "model.tables[3].embedding_dim" and p["table"] == name
    assert p["type"].endswith("bad-input") and name in p["detail"]
    for bad in (b"{not json", b"[1, 2]", b'{"model": 1, "hardware": {"preset": "h100"}}'):
        r = client.post("/v1/plans", content=bad,
                        headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and "field" in r.json(), bad
    unknown = client.post("/v1/plans", json={**small_request(), "extra": 1})
    assert unknown.json()["field"] == "extra"
    preset = client.post("/v1/plans", json={**small_request(), "hardware": {"preset": "nope"}})
    assert preset.json()["field"] == "hardware.preset"


def test_infeasible_is_an_answer_with_the_reason(client: httpx.Client) -> None:
    # 80 GiB of fp32 rows, only allowed in HBM on one table-wise GPU: cannot fit.
    table = {"name": "huge", "num_embeddings": 160_000_000, "embedding_dim": 128,
             "pooling_factor": 1.0, "constraints": {"sharding_types": ["table_wise"],
                                                    "memory_tiers": ["hbm"]}}
    req = {"model": {"batch_size_per_gpu": 512, "tables": [table]},
           "hardware": {"preset": "h100", "hosts": 1}}
    r = client.post("/v1/plans", json=req)
    assert r.status_code == 422, r.text
    p = r.json()
    assert p["type"].endswith("infeasible") and p["table"] == "huge"
    assert p["short_bytes"] > 0 and "huge" in p["detail"]
    assert p["certificate"]["kind"] == "table" and p["certificate"]["table"] == "huge"
    job = client.get(f"/v1/jobs/{p['job_id']}").json()
    assert job["status"] == "infeasible" and job["error"]["short_bytes"] == p["short_bytes"]
    assert client.get(f"/v1/plans/{p['job_id']}").status_code == 404


def test_limits(client: httpx.Client) -> None:
    big = client.post("/v1/plans", content=b"{" + b" " * (3 * 2**20) + b"}",
                      headers={"Content-Type": "application/json"})
    assert big.status_code == 413 and big.headers["content-type"] == PROBLEM
    many = small_request()
    template = many["model"]["tables"][0]
    many["model"]["tables"] = [{**template, "name": f"t{i}"} for i in range(301)]
    r = client.post("/v1/plans", json=many)
    assert r.status_code == 422 and r.json()["field"] == "model.tables"
    slow = client.post("/v1/plans", json=small_request(time_limit_s=121))
    assert slow.status_code == 422 and slow.json()["field"] == "options.time_limit_s"
    wide = client.post("/v1/plans", json=small_request(hosts=33))
    assert wide.status_code == 422 and wide.json()["field"] == "hardware.hosts"
    assert client.get("/v1/jobs/" + "0" * 64).status_code == 404
    assert client.get("/v1/jobs/not-a-hash").status_code == 422


def test_check_and_evaluate(client: httpx.Client) -> None:
    good = client.post("/v1/plans", json=small_request()).json()
    assert client.post("/v1/check", json=good).json() == {"ok": True, "errors": [],
                                                             "warnings": []}
    tampered = copy.deepcopy(good)
    tampered["tables"][0]["pieces"][0]["rank"] = (good["tables"][0]["pieces"][0]["rank"] + 1) % 8
    result = client.post("/v1/check", json=tampered).json()
    assert result["ok"] is False and result["errors"]
    scored = client.post("/v1/evaluate", json={"request": good["request"],
                                               "tables": good["tables"]})
    assert scored.status_code == 200
    assert scored.json()["summary"]["step_time_s"] == pytest.approx(
        good["summary"]["step_time_s"])
    assert client.post("/v1/check", json={"request": good["request"]}).status_code == 422


def test_schemas_openapi_and_metrics(client: httpx.Client) -> None:
    schema = client.get("/v1/schemas/request").json()
    assert "model" in schema["properties"]
    openapi = client.get("/openapi.json").json()
    body = openapi["paths"]["/v1/plans"]["post"]["requestBody"]["content"]["application/json"]
    assert body["examples"]["criteo_kaggle_1_host"]["value"]["model"] == fixture_model(
        "criteo_kaggle")
    assert "422" in openapi["paths"]["/v1/plans"]["post"]["responses"]
    text = client.get("/metrics").text
    assert 'planner_http_requests_total{method="POST",route="/v1/plans"' in text
    assert "planner_solve_duration_seconds_count" in text
