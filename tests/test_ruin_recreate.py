"""Ruin and recreate (planner/partition/ruin_recreate.py): never worse than its start, the same
plan for the same seed, more budget never worse, and its figures agree with loads recomputed
from scratch and with the independent checker."""

import itertools

from planner import plan
from planner.bounds import lower_bound
from planner.candidates import Candidate
from planner.check import check_plan
from planner.partition.assignment import Assignment
from planner.partition.cpsat import makespan
from planner.partition.pipeline import best_start
from planner.partition.ruin_recreate import ruin_and_recreate
from planner.planning import candidates_for, resolve
from planner.problem import Problem, build_problem
from tests.conftest import fixture_request


def _start(name: str, hosts: int) -> tuple[Problem, list[list[Candidate]], Assignment]:
    problem = build_problem(resolve(fixture_request(name, hosts)))
    cands, _ = candidates_for(problem)
    return problem, cands, best_start(problem, cands, lower_bound(problem, cands))


def test_lowers_a_multi_host_plateau_deterministically() -> None:
    # criteo_dcnv2 on 2 hosts: the heuristic stops 14.9% above the bound (every single move
    # or swap off the slowest GPU raises another GPU to it).
    problem, cands, start = _start("criteo_dcnv2", 2)
    before = makespan(problem, start.choices)
    ids = [id(ch) for ch in start.choices]
    steps, got = [], None
    for budget in (0.05, 0.2, 0.6):
        got = ruin_and_recreate(problem, cands, start, budget, seed=0)
        after = makespan(problem, got.assignment.choices)
        # Its own running figure is the loads recomputed from the choices alone.
        assert abs(after - got.end_s) <= 1e-9 * after
        assert got.start_s == before and after <= before * (1 + 1e-12)
        assert got.det_time <= budget + 0.01  # the last round may run over by its own work
        steps.append(after)
    assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(steps)), steps
    assert steps[-1] < before * 0.99, (before, steps)  # measured: 3.303 -> 3.234 ms
    again = ruin_and_recreate(problem, cands, start, 0.6, seed=0)
    assert got is not None
    assert [(ch.cand.label, [r.tolist() for r in ch.ranks]) for ch in again.assignment.choices] \
        == [(ch.cand.label, [r.tolist() for r in ch.ranks]) for ch in got.assignment.choices]
    assert [id(ch) for ch in start.choices] == ids  # the start is left as it was
    assert makespan(problem, start.choices) == before


def test_stops_at_the_target() -> None:
    problem, cands, start = _start("criteo_dcnv2", 2)
    before = makespan(problem, start.choices)
    got = ruin_and_recreate(problem, cands, start, 5.0, seed=0, target_s=before * 1.5)
    assert got.rounds == 0
    assert all(a is b for a, b in zip(got.assignment.choices, start.choices, strict=True))


def test_plan_with_it_passes_the_checker() -> None:
    p = plan(fixture_request("criteo_dcnv2", 2))
    assert "ruin and recreate" in p.summary.status
    assert check_plan(p).ok, check_plan(p).errors
    greedy = plan({**fixture_request("criteo_dcnv2", 2), "options": {"solver": "greedy"}})
    assert p.summary.step_time_s < greedy.summary.step_time_s
