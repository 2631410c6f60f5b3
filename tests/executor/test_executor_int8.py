"""int8 tables are planned but not executed: `planner execute` refuses the plan before any
rank starts, one line naming the table and the reason, exit 2, whatever the kernels."""

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")


@pytest.mark.parametrize("kernels", ["torch", "auto"])
def test_an_int8_plan_is_refused_in_one_line_before_any_rank(tmp_path: Path, kernels: str):
    from typer.testing import CliRunner

    from planner.cli import app
    from planner.executor.demo import small_plan

    body = json.loads(small_plan().model_dump_json())
    for t in body["request"]["model"]["tables"]:
        if t["name"] == "tw_sgd":
            t["data_type"] = "int8"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(body))
    got = CliRunner().invoke(app, ["execute", str(plan), "--kernels", kernels, "--run-dir",
                                   str(tmp_path / "run")])
    assert got.exit_code == 2, got.output
    lines = [ln for ln in got.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: table 'tw_sgd' has data_type int8")
    assert "inference-only" in lines[0]
    assert not (tmp_path / "run" / "rank0.json").exists()
