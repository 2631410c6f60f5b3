"""`planner report`: a self-contained page that a real headless Chromium opens with no console
error and no network request, one cost bar per GPU and the placement map present (issue 17)."""

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.plan_model import Plan
from planner.planning import plan
from planner.report_html import render_html
from tests.conftest import fixture_request

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def big_plan() -> Plan:
    """A multi-host plan of the 1,000-table fixture (the heuristic: seconds, not minutes)."""
    req = fixture_request("synthetic_1000", hosts=2)
    req["options"] = {"solver": "greedy"}
    return plan(req)


@pytest.fixture(scope="module")
def report_file(big_plan: Plan, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "plan.json"
    path.write_text(big_plan.model_dump_json())
    out = path.with_suffix(".html")
    res = CliRunner().invoke(app, ["report", str(path), "-o", str(out), "--explain", "5"])
    assert res.exit_code == 0, res.output
    return out


def _without_scripts(text: str) -> str:
    return re.sub(r"<script\b[^>]*>.*?</script>", "", text, flags=re.S)


def test_page_is_self_contained(report_file: Path) -> None:
    text = report_file.read_text()
    assert text.startswith("<!DOCTYPE html>")
    markup = _without_scripts(text)
    # no external script, style sheet, image, font or frame
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", markup, flags=re.I)
    assert not re.search(r"<script[^>]*\bsrc=", text, flags=re.I)
    assert "<link" not in markup.lower()
    for sid in ("cost-bars", "memory-bars", "network-bars", "placement-map", "mix"):
        assert f'id="{sid}"' in text


def test_memory_terms_add_up_to_the_plan(big_plan: Plan) -> None:
    from planner.report_html import _facts

    facts = _facts(big_plan)
    total = sum(facts.hbm_terms.values())
    assert [int(x) for x in total] == [g.hbm_bytes for g in big_plan.gpus]


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/setup.sh installs it)")
def test_opens_in_headless_chromium(report_file: Path, big_plan: Plan) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    errors: list[str] = []
    requests: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))

            def route(r: object) -> None:
                url = r.request.url  # type: ignore[attr-defined]
                if url.startswith(("file:", "data:", "blob:", "about:")):
                    r.continue_()  # type: ignore[attr-defined]
                else:  # anything else would be the network: record it and refuse it
                    requests.append(url)
                    r.abort()  # type: ignore[attr-defined]

            page.route("**/*", route)
            page.goto(report_file.as_uri(), wait_until="load")
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 5")
            n_gpus = len(big_plan.gpus)
            # one bar per GPU in each cost term's trace, drawn
            bars = page.evaluate("""() => {
                const plot = document.getElementById('cost-bars');
                return Array.from(plot.querySelectorAll('.barlayer .trace'))
                    .map(t => t.querySelectorAll('.point').length);
            }""")
            assert bars and bars[0] == n_gpus, bars
            xs = page.evaluate("() => document.getElementById('cost-bars').data[0].x.length")
            assert xs == n_gpus
            heat = page.evaluate("""() => {
                const m = document.getElementById('placement-map');
                return m.querySelectorAll('.hm, image, .heatmaplayer').length;
            }""")
            assert heat >= 1
            dims = page.evaluate("""() => {
                const d = document.getElementById('placement-map')._fullData[0];
                return [d.type, d.y.length, d.x.length, d.z.length];
            }""")
            assert dims == ["heatmap", n_gpus, len(big_plan.tables), n_gpus]
            assert page.locator("#sec-tables details").count() == 5
        finally:
            browser.close()
    assert not errors, errors
    assert not requests, requests


def test_solver_history_and_small_plan() -> None:
    p = plan(fixture_request("criteo_kaggle", hosts=1))
    text = render_html(p)
    assert "Solver: incumbent and bound" in text
    assert text.count("class=\"plotly-graph-div\"") >= 5


def test_measured_and_compare_sections(tmp_path: Path) -> None:
    """--measured (planner execute's JSON) and --compare (another plan, here a layout with
    one table moved) add their sections; `planner diff --html` writes the same diff."""
    import json

    p = plan(fixture_request("criteo_kaggle", hosts=1) | {"options": {"solver": "greedy"}})
    a = tmp_path / "a.json"
    a.write_text(p.model_dump_json())
    tp = next(t for t in p.tables if len(t.pieces) == 1)
    dst = (tp.pieces[0].rank + 1) % len(p.gpus)
    layout = json.loads(p.model_dump_json(include={"schema_version", "request", "tables"}))
    for t in layout["tables"]:
        if t["name"] == tp.name:
            t["pieces"][0]["rank"] = dst
    b = tmp_path / "b.json"
    b.write_text(json.dumps(layout))
    run = {"plan_hash": p.plan_hash, "world": 2, "batch": 64, "steps": 3, "scale_rows": 0.01,
           "device": "cpu", "checks": [{"name": "bytes", "ok": True, "detail": "equal"}],
           "ranks": [{"rank": r, "seconds_measured": {"lookup": 1e-3, "backward": 2e-3,
                                                      "loss": 1e-4},
                      "seconds_predicted": {"lookup": 1e-5, "backward": 2e-5, "total": 3e-5}}
                     for r in range(2)]}
    m = tmp_path / "run.json"
    m.write_text(json.dumps(run))
    out = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", str(a), "-o", str(out), "--measured", str(m),
                                   "--compare", str(b), "--explain", "-1"])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    for sid in ("measured-bars", "diff-bars", "sec-measured", "sec-diff"):
        assert f'id="{sid}"' in text
    assert "1 table(s) differ" in text and "2 GPU(s) differ" in text
    assert text.count("<details>") == len(p.tables)  # every table explained
    page_file = tmp_path / "d.html"
    res = CliRunner().invoke(app, ["diff", str(a), str(b), "--html", str(page_file)])
    assert res.exit_code == 0 and 'id="diff-bars"' in page_file.read_text()
