"""`planner diff`: our plan against the same plan with one table moved shows exactly that
table and the two GPUs, with what it costs."""

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.diff import diff_plans
from planner.plan_model import Plan, PlanLayout
from planner.planning import evaluate, plan
from tests.conftest import fixture_request


@pytest.fixture(scope="module")
def ours() -> Plan:
    return plan(fixture_request("criteo_dcnv2", hosts=1) | {"options": {"solver": "greedy"}})


def _moved(p: Plan) -> tuple[PlanLayout, str, int, int]:
    tp = next(t for t in p.tables if t.sharding_type.value == "table_wise")
    src = tp.pieces[0].rank
    dst = (src + 3) % len(p.gpus)
    piece = tp.pieces[0].model_copy(update={"rank": dst, "host": dst // 8})
    moved = tp.model_copy(update={"pieces": [piece]})
    tables = [moved if t.name == tp.name else t for t in p.tables]
    return PlanLayout(request=p.request, tables=tables), tp.name, src, dst


def test_one_table_moved(ours: Plan) -> None:
    layout, name, src, dst = _moved(ours)
    theirs = evaluate(layout)
    d = diff_plans(ours, theirs)
    assert [(t.name, t.change, t.ranks_a, t.ranks_b) for t in d.tables] == [
        (name, "moved", [src], [dst])]
    assert sorted(g.rank for g in d.gpus) == sorted([src, dst])
    by = {g.rank: g for g in d.gpus}
    assert by[src].tables_out == [name] and by[dst].tables_in == [name]
    assert by[src].delta_s < 0 < by[dst].delta_s
    gpus_b = {g.rank: g for g in theirs.gpus}
    assert by[dst].total_b_s == gpus_b[dst].cost.total_s
    assert d.step_b_s - d.step_a_s == theirs.summary.step_time_s - ours.summary.step_time_s


def test_identical_plans(ours: Plan) -> None:
    d = diff_plans(ours, ours)
    assert d.tables == [] and d.gpus == []


def test_cli_with_a_layout(ours: Plan, tmp_path) -> None:
    layout, name, src, dst = _moved(ours)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(ours.model_dump_json())
    b.write_text(layout.model_dump_json())  # only request + tables: scored by evaluate
    r = CliRunner().invoke(app, ["diff", str(a), str(b)])
    assert r.exit_code == 0, r.output
    assert "1 table(s) differ" in r.output and "2 GPU(s) differ" in r.output
    assert name in r.output
    r = CliRunner().invoke(app, ["diff", str(a), str(b), "--format", "json"])
    d = json.loads(r.output)
    assert [t["name"] for t in d["tables"]] == [name]
    assert sorted(g["rank"] for g in d["gpus"]) == sorted([src, dst])
