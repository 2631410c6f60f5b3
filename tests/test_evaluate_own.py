"""`planner evaluate` of our own plan gives back the plan: same figures, bound and hash, since
the checker verifies all of them; a tampered plan is scored afresh, not believed."""

import json
from pathlib import Path

from typer.testing import CliRunner

from planner.cli import app
from planner.evaluation import evaluate_input
from planner.plan_model import EvaluateInput

runner = CliRunner()


def _plan(tmp_path: Path, hosts: int) -> Path:
    path = tmp_path / "plan.json"
    res = runner.invoke(app, ["plan", "criteo_kaggle", "--hosts", str(hosts), "-q", "-o",
                              str(path), "--format", "json"])
    assert res.exit_code == 0, res.output
    return path


def test_evaluate_own_plan_returns_it_unchanged(tmp_path: Path) -> None:
    path = _plan(tmp_path, 2)
    out = tmp_path / "evaluated.json"
    res = runner.invoke(app, ["evaluate", str(path), "--format", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes() == path.read_bytes()
    assert "verified by the checker" in res.output


def test_evaluate_tampered_plan_scores_afresh(tmp_path: Path) -> None:
    data = json.loads(_plan(tmp_path, 1).read_text())
    claimed = data["summary"]["step_time_s"]
    data["summary"]["step_time_s"] = claimed * 0.5
    got = evaluate_input(EvaluateInput.model_validate(data))
    assert not got.verified and "did not pass the checker" in got.note
    assert got.plan.summary.status == "evaluated"
    assert got.plan.summary.step_time_s == claimed  # recomputed, not the tampered figure
    assert got.plan.plan_hash != data["plan_hash"]


def test_evaluate_layout_is_scored(tmp_path: Path) -> None:
    data = json.loads(_plan(tmp_path, 1).read_text())
    layout = {k: data[k] for k in ("schema_version", "request", "tables")}
    got = evaluate_input(EvaluateInput.model_validate(layout))
    assert not got.verified and got.note.startswith("a layout")
    assert got.plan.summary.step_time_s == data["summary"]["step_time_s"]
