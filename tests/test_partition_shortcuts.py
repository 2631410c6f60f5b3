"""The partitioner's shortcuts pick what the plain loops pick: the greedy's bound on a
candidate's score (greedy._PRUNE) and the local search's vectorized screen of moves
(LocalSearch._move_screen), with and without pins, pipelining and several hosts."""

import json

import numpy as np
import pytest

import planner.partition.greedy as greedy_mod
from planner.bounds import lower_bound
from planner.candidates import Group
from planner.partition.greedy import greedy
from planner.partition.local_search import LocalSearch, local_search
from planner.partition.lp_start import lp_start, relaxed_choices
from planner.partition.policy import DEFAULT_POLICY
from planner.partition.state import LoadState
from planner.planning import build_problem, candidates_for, resolve
from planner.presets import fixture_text


def _model(name: str, pipelined: bool = False, pins: bool = False) -> dict:
    model = json.loads(fixture_text(name))
    model["pipelined"] = pipelined
    if pins:
        for i, t in enumerate(model["tables"][:12]):
            t["constraints"] = {"pinned_ranks": [i % 4, 4 + i % 3]}
    return model


CASES = [("hugectr_200", 1, False, False), ("hugectr_200", 2, True, False),
         ("criteo_dcnv2", 4, False, True), ("deeprecsys_rm2", 2, False, False),
         ("hugectr_510", 2, False, True)]


def _setup(name: str, hosts: int, pipelined: bool, pins: bool):
    req = resolve({"model": _model(name, pipelined, pins),
                   "hardware": {"preset": "h100", "hosts": hosts}})
    problem = build_problem(req)
    cands, _ = candidates_for(problem)
    return problem, cands, lower_bound(problem, cands)


def _key(a) -> list:
    return [(id(c.cand), [np.asarray(r).tolist() for r in c.ranks]) for c in a.choices]


@pytest.mark.parametrize(("name", "hosts", "pipelined", "pins"), CASES)
def test_greedy_bound_changes_nothing(monkeypatch, name, hosts, pipelined, pins) -> None:
    problem, cands, bound = _setup(name, hosts, pipelined, pins)
    for owner in (False, True):
        monkeypatch.setattr(greedy_mod, "_PRUNE", True)
        fast = greedy(problem, cands, bound.prices, owner_side=owner)
        monkeypatch.setattr(greedy_mod, "_PRUNE", False)
        plain = greedy(problem, cands, bound.prices, owner_side=owner)
        assert _key(fast) == _key(plain) and fast.notes == plain.notes


@pytest.mark.parametrize(("name", "hosts", "pipelined", "pins"), CASES)
def test_move_screen_changes_nothing(monkeypatch, name, hosts, pipelined, pins) -> None:
    problem, cands, bound = _setup(name, hosts, pipelined, pins)
    starts = [greedy(problem, cands, bound.prices)]
    for fill, choice in relaxed_choices(problem, cands, bound.value_s,
                                        DEFAULT_POLICY.relaxation_fills):
        start = lp_start(problem, cands, choice, fill=fill)
        if start is not None:
            starts.append(start)
    for a in starts:
        fast = local_search(problem, cands, _copy(a), 2000)
        monkeypatch.setattr(LocalSearch, "_move_screen",
                            lambda self, s, on_s, deficit, limit: on_s)
        plain = local_search(problem, cands, _copy(a), 2000)
        monkeypatch.undo()
        assert _key(fast) == _key(plain) and fast.notes == plain.notes


def _copy(a):
    from planner.partition.assignment import Assignment, TableChoice

    return Assignment([TableChoice(c.cand, [np.array(r) for r in c.ranks]) for c in a.choices],
                      a.solver, a.status, list(a.notes))


@pytest.mark.parametrize("hosts", [1, 4])
def test_world_group_apply_matches_add_at(hosts) -> None:
    """LoadState.apply's whole-array path for a piece-per-rank group (data-parallel,
    row-wise) leaves every array bit for bit as np.add.at's element-by-element additions
    do, on the way in and out, over a state that already holds pieces: random groups whose
    floats span many magnitudes, so any change in the order of the additions shows."""
    problem, _, _ = _setup("hugectr_200", hosts, False, False)
    w = problem.hw.world_size
    rng = np.random.default_rng(7)

    def floats(*shape: int) -> np.ndarray:
        return rng.random(shape) * 10.0 ** rng.integers(-12, 3, size=shape)

    def ints() -> np.ndarray:
        return rng.integers(0, 2**40, size=w)

    groups = [Group(np.zeros((w, 4), dtype=np.int64), floats(w), floats(w), ints(), ints(),
                    ints(), floats(w, 3), floats(w, 3)) for _ in range(5)]
    state = LoadState.empty(problem)
    ref = {k: np.array(getattr(state, k), copy=True)
           for k in ("comp", "comm", "hbm", "inter", "ddr", "ssd", "rate")}
    ranks = np.arange(w)
    hosts_of = ranks // problem.hw.gpus_per_host
    for sign in (1, 1, -1):
        for grp in groups:
            state.apply(grp, ranks, sign)
            for name in ref:
                idx = hosts_of if name in ("ddr", "ssd", "rate") else ranks
                np.add.at(ref[name], idx, sign * getattr(grp, name))
            for name, arr in ref.items():
                assert np.array_equal(getattr(state, name), arr), name
