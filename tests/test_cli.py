"""The CLI as a user runs it: exit codes, one-line errors naming field and table, no traceback."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from planner.presets import fixture_text
from tests.conftest import small_model

ROOT = Path(__file__).resolve().parent.parent


def run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_main_job_plans_dcnv2_on_one_h100_host_and_check_accepts(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    r = run(["plan", "fixtures/models/criteo_dcnv2.json", "--preset", "h100", "--hosts", "1",
             "-o", str(out)])
    assert r.returncode == 0, r.stderr
    assert "step estimate" in r.stdout and "lower bound" in r.stdout
    assert json.loads(out.read_text())["request"]["hardware"]["name"] == "h100"
    c = run(["check", str(out)])
    assert c.returncode == 0, c.stderr


def test_json_format_and_stdin() -> None:
    r = run(["plan", "-", "--format", "json"], stdin=fixture_text("deeprecsys_rm1"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["plan_hash"].startswith("sha256:")


def test_evaluate_scores_a_hand_made_plan(tmp_path: Path) -> None:
    """A hand-made layout: every table table-wise on GPU 0 of one host."""
    model = json.loads(fixture_text("deeprecsys_rm3"))
    r = run(["plan", "-", "--format", "json"], stdin=json.dumps(model))
    request = json.loads(r.stdout)["request"]
    tables = [{"name": t["name"], "sharding_type": "table_wise", "tier": "hbm",
               "pieces": [{"rank": 0, "host": 0, "row_offset": 0,
                           "row_count": t["num_embeddings"], "col_offset": 0,
                           "col_count": t["embedding_dim"]}]}
              for t in model["tables"]]
    layout = tmp_path / "hand.json"
    layout.write_text(json.dumps({"request": request, "tables": tables}))
    e = run(["evaluate", str(layout), "--format", "json"])
    assert e.returncode == 0, e.stderr
    hand = json.loads(e.stdout)
    ours = json.loads(r.stdout)
    # All ten tables on one GPU: that GPU carries everything, the others nothing but the
    # step's six all-to-all calls, which every GPU joins (cost_models/latency.py).
    hw = request["hardware"]
    k, w = hw["constants"], hw["hosts"] * hw["gpus_per_host"]
    calls = 6 * (k["a2a_call_latency_s"] + k["a2a_peer_latency_s"] * (w - 1))
    idle = hand["gpus"][1]["cost"]
    assert idle["compute_s"] == 0.0
    assert idle["total_s"] == pytest.approx(calls, rel=1e-12)
    assert hand["summary"]["step_time_s"] > ours["summary"]["step_time_s"]
    assert run(["check", str(layout)]).returncode == 2  # a layout is not a full plan


def _bad(mutate: Any) -> dict[str, Any]:
    model = small_model([
        {"name": "a", "num_embeddings": 1000, "embedding_dim": 64, "pooling_factor": 2.0},
        {"name": "b", "num_embeddings": 2000, "embedding_dim": 64, "pooling_factor": 1.0},
    ])
    mutate(model)
    return model


BAD_INPUTS = {
    "duplicate name": (lambda m: m["tables"][1].update(name="a"), "duplicate table name 'a'"),
    "zero rows": (lambda m: m["tables"][1].update(num_embeddings=0), "table 'b'"),
    "negative dim": (lambda m: m["tables"][0].update(embedding_dim=-4), "table 'a'"),
    "zero pooling": (lambda m: m["tables"][1].update(pooling_factor=0), "pooling_factor"),
    "unknown field": (lambda m: m["tables"][0].update(colour="red"), "unknown field"),
    "empty tables": (lambda m: m.update(tables=[]), "model.tables"),
    "1e15 rows": (lambda m: m["tables"][1].update(num_embeddings=10**15), "table 'b'"),
    "string number": (lambda m: m["tables"][0].update(num_embeddings="1000"), "table 'a'"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line(case: str) -> None:
    mutate, expected = BAD_INPUTS[case]
    r = run(["plan", "-"], stdin=json.dumps(_bad(mutate)))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    assert expected in lines[0]


def test_nan_is_bad_input() -> None:
    text = json.dumps(_bad(lambda m: None)).replace('"pooling_factor": 2.0',
                                                    '"pooling_factor": NaN')
    r = run(["plan", "-"], stdin=text)
    assert r.returncode == 2 and "table 'a'" in r.stderr and "Traceback" not in r.stderr


def test_unknown_preset_and_missing_file() -> None:
    r = run(["plan", "fixtures/models/criteo_kaggle.json", "--preset", "tpu9000"])
    assert r.returncode == 2 and "unknown preset 'tpu9000'" in r.stderr
    r = run(["plan", "no/such/model.json"])
    assert r.returncode == 2 and "no such file" in r.stderr


def test_infeasible_exits_3_naming_the_table() -> None:
    # 'big' may only be table-wise in HBM, and 200M x 128 fp32 rows (~100 GB with state)
    # exceed one H100's free HBM.
    model = small_model([
        {"name": "ok", "num_embeddings": 1000, "embedding_dim": 64, "pooling_factor": 1.0},
        {"name": "big", "num_embeddings": 200_000_000, "embedding_dim": 128,
         "pooling_factor": 1.0,
         "constraints": {"sharding_types": ["table_wise"], "memory_tiers": ["hbm"]}},
    ])
    r = run(["plan", "-"], stdin=json.dumps(model))
    assert r.returncode == 3, r.stderr
    assert "table 'big'" in r.stderr and "short by" in r.stderr
    assert "Traceback" not in r.stderr


def test_schema_and_presets() -> None:
    r = run(["schema"])
    assert r.returncode == 0 and "HardwareRef" in r.stdout
    p = run(["presets"])
    assert p.returncode == 0 and "zionex_a100" in p.stdout
