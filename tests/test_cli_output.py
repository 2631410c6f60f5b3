"""What the terminal shows: units that scale, `-o` as one line, `--detail` naming each GPU's
tables (checked against the plan JSON, not against the renderer's own helpers)."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.report import time_unit

runner = CliRunner()


@pytest.mark.parametrize(("step_s", "unit", "shown"), [
    (3.327e-6, "µs", "3.327"), (2.991e-3, "ms", "2.991"), (1.5, "s", "1.500"),
    (9.9999e-4, "µs", "999.990")])
def test_time_unit_scales(step_s: float, unit: str, shown: str) -> None:
    u = time_unit(step_s)
    assert (u.name, u.fmt(step_s)) == (unit, shown)


def test_dash_o_prints_one_line_and_writes_the_plan(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    res = runner.invoke(app, ["plan", "criteo_kaggle", "-q", "-o", str(path)])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 2 and lines[1] == f"written to {path}"
    data = json.loads(path.read_text())
    # A model this small steps in microseconds: the line says so instead of "0.003 ms".
    step_us = data["summary"]["step_time_s"] * 1e6
    assert f"step estimate {step_us:.3f} µs" in lines[0]
    assert data["plan_hash"][:23] in lines[0]


def test_detail_lists_every_piece_on_its_rank(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    res = runner.invoke(app, ["plan", "criteo_dcnv2", "--hosts", "1", "-q", "--detail", "-o",
                              str(path)])
    assert res.exit_code == 0, res.output
    data = json.loads(path.read_text())
    listed = {int(m.group(1)): m.group(3) for m in
              re.finditer(r"^rank (\d+) \((\d+) pieces\): (.*)$", res.output, re.M)}
    assert sorted(listed) == [g["rank"] for g in data["gpus"]]
    for t in data["tables"]:
        for pc in t["pieces"]:
            assert t["name"] in listed[pc["rank"]], (t["name"], pc["rank"])
    assert "step estimate" in res.output and "Per GPU" in res.output
