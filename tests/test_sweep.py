"""`planner sweep`: one plan per host count in parallel processes; an infeasible host count is
shown as such, and the smallest that fits is named."""

import json

from typer.testing import CliRunner

from planner.cli import app
from planner.sweep import SweepPoint, fastest, run_sweep, smallest_feasible, sweep_page
from tests.conftest import small_model

# 3 x ~190 GiB of weights and state, HBM only: more than one 8 x H100 host's ~557 GiB of HBM
# for embeddings, less than two hosts'.
_ROWS = 400_000_000


def _model() -> dict:
    tables = [{"name": f"t{i}", "num_embeddings": _ROWS, "embedding_dim": 128,
               "pooling_factor": 2.0, "constraints": {"memory_tiers": ["hbm"]}}
              for i in range(3)]
    return small_model(tables, batch=256)


def test_sweep_cli(tmp_path) -> None:
    model = tmp_path / "m.json"
    model.write_text(json.dumps(_model()))
    out, page = tmp_path / "s.json", tmp_path / "s.html"
    r = CliRunner().invoke(app, ["sweep", str(model), "--preset", "h100", "--hosts", "1,2,4",
                                 "--solver", "greedy", "-o", str(out), "--html", str(page),
                                 "-q"])
    assert r.exit_code == 0, r.output
    assert "smallest host count that fits: 2" in r.output
    assert "infeasible" in r.output
    data = json.loads(out.read_text())
    assert data["smallest_feasible"] == {"h100": 2}
    status = {p["hosts"]: p["status"] for p in data["points"]}
    assert status == {1: "infeasible", 2: "ok", 4: "ok"}
    assert [p["gpus"] for p in data["points"]] == [8, 16, 32]
    ok = [p for p in data["points"] if p["status"] == "ok"]
    assert all(p["step_time_s"] >= p["lower_bound_s"] > 0 and p["hbm_headroom_bytes"] >= 0
               for p in ok)
    text = page.read_text()
    assert 'id="sweep-plot"' in text and "smallest host count that fits is 2" in text
    assert "<script src" not in text


def test_in_process_and_helpers() -> None:
    pts = run_sweep(_model(), ["h100"], [2], options={"solver": "greedy"}, workers=1)
    assert [p.status for p in pts] == ["ok"] and pts[0].gpus == 16
    bad = SweepPoint("h100", 1, 8, "infeasible", reason="short")
    allp = [bad, *pts]
    assert smallest_feasible(allp, "h100") is pts[0] and fastest(allp, "h100") is pts[0]
    assert "infeasible" in sweep_page(allp, "m")
