"""The plan's array layout (planner/piece_layout.py): its JSON, hash and pydantic tables are
what the per-model path writes, and bad pieces are refused as before."""

import json

import pytest

from planner import plan
from planner.errors import BadInputError
from planner.hashing import canonical_json, plan_hash_of
from planner.piece_layout import from_plan_layout
from planner.plan_build import gpu_totals
from planner.plan_model import Plan, PlanLayout
from planner.planning import build_problem, evaluate
from tests.conftest import fixture_request


@pytest.fixture(scope="module")
def rm2() -> Plan:
    return plan(fixture_request("deeprecsys_rm2", 2))


def test_tables_json_is_the_canonical_json(rm2: Plan) -> None:
    arrays = from_plan_layout(rm2)
    dumped = [t.model_dump(mode="json") for t in rm2.tables]
    assert arrays.tables_json() == canonical_json({"x": dumped})[len('{"x":'):-1]
    assert [t.model_dump() for t in arrays.tables()] == [t.model_dump() for t in rm2.tables]
    assert arrays.tables() == list(rm2.tables)


def test_plan_hash_and_evaluate_agree(rm2: Plan) -> None:
    assert plan_hash_of(rm2.model_dump(mode="json")) == rm2.plan_hash
    again = evaluate(PlanLayout(request=rm2.request, tables=rm2.tables))
    assert again.gpus == rm2.gpus
    assert again.tables == rm2.tables


def test_bad_pieces_are_refused_in_plan_order(rm2: Plan) -> None:
    problem = build_problem(rm2.request)
    d = json.loads(rm2.model_dump_json())
    d["tables"][2]["pieces"][0]["rank"] = 10_000
    d["tables"][3]["name"] = "nope"
    with pytest.raises(BadInputError) as err:
        gpu_totals(PlanLayout.model_validate({k: d[k] for k in ("request", "tables")}), problem)
    assert err.value.field == "tables[2].pieces[0].rank"
    d["tables"][1]["name"] = "nope2"
    with pytest.raises(BadInputError) as err:
        gpu_totals(PlanLayout.model_validate({k: d[k] for k in ("request", "tables")}), problem)
    assert err.value.field == "tables[1].name"


def test_candidate_figures_equal_plan_build_costing(rm2: Plan) -> None:
    """gpu_totals takes piece figures from the candidates when it has them: the same numbers
    as its own costing, to the bit."""
    from planner.plan_build import shape_figures
    from planner.planning import candidates_for

    problem = build_problem(rm2.request)
    cands, _ = candidates_for(problem)
    for t, cs in zip(problem.tables, cands, strict=True):
        for c in cs:
            assert c.figures is not None
            for (rows, cols), fig in c.figures.items():
                assert fig == tuple(shape_figures(problem, t, c.kind, c.tier, c.cache_ratio,
                                               rows, cols))
