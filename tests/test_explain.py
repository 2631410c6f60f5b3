"""`planner explain`: the best rejected alternative's loss is what forcing it really costs."""

import json

import pytest
from typer.testing import CliRunner

from planner.check import check_plan
from planner.cli import app
from planner.explain import explain_all, explain_table, force
from planner.plan_model import Plan
from planner.planning import evaluate, plan
from tests.conftest import fixture_request, small_model


def _tables(constraints: dict[str, dict] | None = None) -> list[dict]:
    specs = [("big", 20_000_000, 128, 8.0), ("mid", 4_000_000, 64, 4.0),
             ("hot", 1_000_000, 128, 20.0), ("tiny", 2_000, 64, 1.0), ("wide", 500_000, 256, 2.0)]
    out = []
    for name, rows, dim, pool in specs:
        t = {"name": name, "num_embeddings": rows, "embedding_dim": dim, "pooling_factor": pool}
        if constraints and name in constraints:
            t["constraints"] = constraints[name]
        out.append(t)
    return out


def _plan(constraints: dict[str, dict] | None = None, **model_kw: object) -> Plan:
    model = small_model(_tables(constraints), batch=1024) | model_kw
    return plan({"model": model, "hardware": {"preset": "h100", "hosts": 1},
                 "options": {"solver": "greedy"}})


@pytest.fixture(scope="module")
def small() -> Plan:
    return _plan()


@pytest.mark.parametrize("table", ["big", "mid", "hot", "tiny", "wide"])
def test_forcing_the_best_rejected_costs_what_it_says(small: Plan, table: str) -> None:
    estimate = explain_table(small, table, confirm=False)
    ex = explain_table(small, table)
    alt = ex.best_rejected
    assert alt is not None and alt.placement is not None and alt.evaluated
    # The incremental estimate and planning.evaluate agree ...
    assert estimate.best_rejected is not None
    assert estimate.best_rejected.label == alt.label
    assert estimate.best_rejected.makespan_s == pytest.approx(alt.makespan_s, rel=1e-9)
    # ... and forcing the named alternative into the plan really costs that.
    forced = evaluate(force(small, alt.placement))
    assert check_plan(forced).ok
    t = next(x for x in forced.tables if x.name == table)
    assert (t.sharding_type.value, t.tier.value) == (alt.sharding_type, alt.tier)
    assert forced.summary.step_time_s == pytest.approx(small.summary.step_time_s + alt.loss_s,
                                                       rel=1e-12, abs=1e-15)
    others = {x.name: x for x in small.tables if x.name != table}
    assert all(x == others[x.name] for x in forced.tables if x.name != table)


def test_a_binding_constraint_is_named_with_what_it_costs() -> None:
    p = _plan({"hot": {"sharding_types": ["table_wise"], "pinned_ranks": [3]}})
    ex = explain_table(p, "hot")
    assert ex.chosen.sharding_type == "table_wise"
    assert {x.rank for x in ex.chosen.placement.pieces} == {3}
    assert any(b.startswith("constraint: sharding_types table_wise") for b in ex.bounds)
    assert ex.best_unavailable is not None
    assert ex.best_unavailable.why_not.startswith(("constraint", "pin"))
    # what the explanation says lifting it would save is what evaluate gives
    lifted = evaluate(force(p, ex.best_unavailable.placement))
    assert lifted.summary.step_time_s == pytest.approx(ex.best_unavailable.makespan_s, rel=1e-12)
    assert lifted.summary.step_time_s < p.summary.step_time_s


def test_semantic_warnings() -> None:
    p = _plan({"wide": {"sharding_types": ["column_wise"]},
               "tiny": {"sharding_types": ["data_parallel"]}},
              bwd_comm_precision="fp8")
    wide = explain_table(p, "wide", confirm=False)
    assert any("rowwise_adagrad" in w for w in wide.warnings)
    tiny = explain_table(p, "tiny", confirm=False)
    assert any("quantized" in w and "all-reduce" in w for w in tiny.warnings)


def test_every_criteo_table_names_an_alternative_or_none() -> None:
    p = plan(fixture_request("criteo_dcnv2", hosts=1) | {"options": {"solver": "greedy"}})
    out = explain_all(p)
    assert set(out) == {t.name for t in p.tables}
    for ex in out.values():
        line = ex.summary_line()
        if ex.best_rejected is None:
            assert "no rejected alternative" in line
        else:
            assert ex.best_rejected.loss_s is not None and "on the step" in line
        assert ex.bounds


def test_cli(small: Plan, tmp_path) -> None:
    f = tmp_path / "p.json"
    f.write_text(small.model_dump_json())
    r = CliRunner().invoke(app, ["explain", str(f), "big"])
    assert r.exit_code == 0, r.output
    assert "best rejected alternative" in r.output and "what bound the choice" in r.output
    r = CliRunner().invoke(app, ["explain", str(f), "big", "--format", "json"])
    d = json.loads(r.output)
    assert d["table"] == "big" and d["best_rejected"]["evaluated"] is True
    r = CliRunner().invoke(app, ["explain", str(f), "nope"])
    assert r.exit_code == 2 and "no table 'nope'" in r.output


def test_the_hbm_cap_in_the_layout_is_named() -> None:
    """Three ~190 GiB tables on one host: the third goes to an HBM cache because the other
    two took the HBM; the explanation says the cap in this layout bound it."""
    tables = [{"name": f"t{i}", "num_embeddings": 400_000_000, "embedding_dim": 128,
               "pooling_factor": 2.0, "access_frequency": {"kind": "zipf", "alpha": 1.1}}
              for i in range(3)]
    p = plan({"model": small_model(tables, batch=512),
              "hardware": {"preset": "h100", "hosts": 1}, "options": {"solver": "greedy"}})
    cached = [t.name for t in p.tables if t.tier.value != "hbm"]
    assert cached
    ex = explain_table(p, cached[0])
    assert any(b.startswith("cap: does not fit next to the other tables") for b in ex.bounds)
    assert ex.best_rejected is not None and ex.best_rejected.loss_s is not None
    forced = evaluate(force(p, ex.best_rejected.placement))
    assert forced.summary.step_time_s == pytest.approx(ex.best_rejected.makespan_s, rel=1e-12)
