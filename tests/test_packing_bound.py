"""The packing bound (planner/packing_bound.py) against plans it never saw, and its functions
against packings built by hand.

Every plan of the candidate space must have a step time at or above it: its refutations
re-derived by SciPy's HiGHS over rows rebuilt here in exact fractions; exhaustively on a
small drawn instance (every candidate, every placement the scopes allow, scored by the loads
every step time comes from), by a random descent on drawn ones (benchmarks/bound_falsify.py
draws 800 more), and against our own plans. Memory is left out of the bound (memory=False)
wherever the plans it is held to ignore memory.
"""

import itertools
import json
from fractions import Fraction
from typing import Any

import numpy as np
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from benchmarks.bound_falsify import descent, every_placement, instance
from cost_models import fixed_floors
from planner import plan
from planner.bounds import lower_bound
from planner.candidates import Candidate
from planner.packing_bound import dff_rows, packing_bound
from planner.partition.assignment import TableChoice
from planner.partition.cpsat import makespan
from planner.partition.state import LoadState
from planner.planning import candidates_for, resolve
from planner.presets import fixture_text, preset_dict
from planner.problem import Problem, build_problem
from planner.replica_bound import replica_bound
from tests.test_owner_bound import requests
from tests.test_replica_bound import memory_free_setup

REL = 1e-9


def _setup(req: dict[str, Any]) -> tuple[Problem, list[list[Candidate]], float]:
    """The problem, its candidates and the memory-free bounds it must rise above (the
    replica bound's setup, then the replica bound)."""
    problem, cands, free = memory_free_setup(req)
    return problem, cands, max(free, replica_bound(problem, cands, free))


def test_below_the_exhaustive_optimum_and_close_to_it() -> None:
    """bound_falsify's seed 1, instance 22: 2 hosts of 4 GPUs, 2 tables, 10,800 plans. The
    other memory-free bounds are 0.85% under the best plan; the packing bound is within 0.2%
    of it, never above."""
    problem, cands, known = _setup(instance(1, 22))
    g, w = problem.hw.gpus_per_host, problem.hw.world_size
    options = [[TableChoice(c, p) for c in cs for p in every_placement(c, g, w)]
               for cs in cands]
    assert np.prod([len(o) for o in options]) == 10_800
    best = min(makespan(problem, list(choice)) for choice in itertools.product(*options))
    bound = packing_bound(problem, cands, known, memory=False)
    assert known < 0.992 * best
    assert best * 0.998 <= bound <= best * (1 + REL)


def _large_tables(rows: int, n: int = 3) -> dict[str, Any]:
    """One host of 2 GPUs with 4 GiB of HBM (3.5 usable), n table-wise tables of 2.15 GB
    each (4,000,000 rows) in HBM or DDR: each GPU holds one in HBM."""
    hw = preset_dict("h100")
    hw["hosts"], hw["gpus_per_host"] = 1, 2
    hw["gpu"].update(hbm_capacity_bytes="4GiB", hbm_reserved_bytes="0.5GiB")
    tabs = [{"name": f"t{i}", "num_embeddings": rows, "embedding_dim": 128,
             "pooling_factor": 20.0, "constraints": {"sharding_types": ["table_wise"],
                                                     "memory_tiers": ["hbm", "ddr"]}}
            for i in range(n)]
    return {"model": {"batch_size_per_gpu": 1024, "tables": tabs}, "hardware": hw}


def _ddr_tables(n: int) -> dict[str, Any]:
    """Two hosts of one GPU with 7 GiB of DDR each, n table-wise tables of 4.1 GB
    (8,000,000 rows) in DDR or SSD: each host holds one in DDR."""
    hw = preset_dict("h100")
    hw["hosts"], hw["gpus_per_host"] = 2, 1
    hw["host"].update(ddr_capacity_bytes="8GiB", ddr_reserved_bytes="1GiB")
    tabs = [{"name": f"t{i}", "num_embeddings": 8_000_000, "embedding_dim": 128,
             "pooling_factor": 20.0, "constraints": {"sharding_types": ["table_wise"],
                                                     "memory_tiers": ["ddr", "ssd"]}}
            for i in range(n)]
    return {"model": {"batch_size_per_gpu": 1024, "tables": tabs}, "hardware": hw}


def _best_that_fits(req: dict[str, Any]
                    ) -> tuple[Problem, list[list[Candidate]], float, int]:
    """The problem and candidates of `req`, the best of every plan that fits HBM, DDR and
    SSD (LoadState's bytes against the caps), scored, and how many plans there are in
    all."""
    problem = build_problem(resolve(req))
    cands, _ = candidates_for(problem)
    hw = problem.hw
    options = [[TableChoice(c, p) for c in cs
                for p in every_placement(c, hw.gpus_per_host, hw.world_size)] for cs in cands]
    fitting = []
    for choice in itertools.product(*options):
        state = LoadState.of_choices(problem, list(choice))
        if ((state.hbm <= hw.hbm_cap).all() and (state.ddr <= hw.ddr_cap).all()
                and (state.ssd <= hw.ssd_cap).all()):
            fitting.append(makespan(problem, list(choice)))
    return problem, cands, min(fitting), int(np.prod([len(o) for o in options]))


def test_memory_rows_below_the_exhaustive_optimum_that_fits() -> None:
    """The functions of the pieces' HBM over a GPU's cap: with one large piece per GPU, one
    of three tables goes to DDR, which the cluster's HBM totals do not say (any two fit
    them). Over all 64 plans, the best that fits: the bound is within 4% of it and never
    above it; without the memory rows it is far below. With two such tables both fit in
    HBM, one per GPU, and the bound must say no more than that (a bound that counted the
    GPUs' HBM as one bin would put a table in DDR)."""
    problem, cands, best, plans = _best_that_fits(_large_tables(4_000_000))
    assert plans == 64
    b = lower_bound(problem, cands)
    assert b.value_s == b.packing_s and best * 0.96 <= b.packing_s <= best * (1 + REL)
    assert max(b.average_s, b.balanced_s) < 0.2 * best
    assert packing_bound(problem, cands, b.average_s, memory=False) < 0.2 * best
    assert plan(_large_tables(4_000_000)).summary.step_time_s >= b.value_s
    problem, cands, best, _ = _best_that_fits(_large_tables(4_000_000, n=2))
    assert lower_bound(problem, cands).value_s <= best * (1 + REL)


def test_host_memory_rows_below_the_exhaustive_optimum_that_fits() -> None:
    """The same over hosts' DDR: two hosts of one GPU, each with 7 GiB of DDR, hold one 4.1
    GB table each in DDR. Three tables: the third goes to SSD, which the DDR totals do not
    say; the bound is within 20% of the best of the 512 plans that fit, 3.3x the average
    bound, never above it. Two tables: not above their best (a bound that counted the hosts'
    DDR as one bin would put one in SSD)."""
    problem, cands, best, plans = _best_that_fits(_ddr_tables(3))
    assert plans == 512
    b = lower_bound(problem, cands)
    assert b.value_s == b.packing_s and best * 0.8 <= b.packing_s <= best * (1 + REL)
    assert b.packing_s > 3 * b.average_s
    problem, cands, best, _ = _best_that_fits(_ddr_tables(2))
    assert lower_bound(problem, cands).value_s <= best * (1 + REL)


def test_proves_the_table_wise_plan_optimal() -> None:
    """criteo_kaggle on one h100 host: 26 table-wise pieces of nearly equal size on 8 GPUs, so
    some GPU holds four. The average bound was 0.78% under our plan; with the packing bound
    the plan is proven optimal, and the bound is no higher than the plan."""
    req = {"model": json.loads(fixture_text("criteo_kaggle")),
           "hardware": {"preset": "h100", "hosts": 1}}
    problem = build_problem(resolve(req))
    cands, _ = candidates_for(problem)
    b = lower_bound(problem, cands)
    assert b.packing_s > b.average_s * 1.007 and b.value_s == b.packing_s
    p = plan(req)
    assert b.packing_s <= p.summary.step_time_s * (1 + REL)
    assert p.summary.gap < 1e-4 and p.summary.status == "optimal"
    assert "packed whole" in p.summary.lower_bound_note


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(), st.integers(0, 2**31 - 1))
def test_below_every_plan_found(req: dict[str, Any], seed: int) -> None:
    problem, cands, known = _setup(req)
    bound = packing_bound(problem, cands, known, memory=False)
    if problem.model.pipelined:
        assert bound == 0.0  # a pipelined step is not the sum of its pieces' sides
        return
    for m in descent(problem, cands, seed, steps=200):
        assert bound <= m * (1 + REL), (bound, m)


def _exact_fff(x: Fraction, k: int) -> Fraction:
    """Fekete and Schepers' u_k in exact arithmetic."""
    v = (k + 1) * x
    return x if v.denominator == 1 else Fraction(int(v), k)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.fractions(0, 1), min_size=1, max_size=12),
       st.lists(st.integers(1, 17), min_size=1, max_size=12))
def test_the_functions_never_pass_one_on_a_packing(parts: list[Fraction],
                                                   ks: list[int]) -> None:
    """Any sizes that fill at most one GPU, among them the exact fractions 1/(k+1) where u_k
    jumps: every function's sum stays at most 1, and each is at most the exact u_k."""
    sizes = [Fraction(1, k + 1) for k in ks] + parts
    total = sum(sizes)
    sizes = [s / total for s in sizes] if total > 1 else sizes  # a packing: sum <= 1
    x = np.array([float(s) for s in sizes]) * (1 - 1e-9)
    rows = dff_rows(x)
    assert (rows.sum(axis=1) <= 1.0 + 1e-12).all()
    for k in range(1, 17):
        assert all(float(_exact_fff(s, k)) >= v - 1e-15 for s, v in zip(sizes, rows[k],
                                                                          strict=True))


def test_pipelined_is_not_bounded() -> None:
    req = instance(1, 22)
    req["model"]["pipelined"] = True
    problem, cands, known = _setup(req)
    assert packing_bound(problem, cands, known) == 0.0


def _highs_feasible(problem: Problem, cands: list[list[Candidate]], m: float) -> bool:
    """Whether some mix of candidates keeps, at makespan m, the average work and the piece
    counts u_k (k = 1..16, Fekete and Schepers) under the GPUs: an LP built here from the
    candidates' groups (Fractions for the jumps) and solved by SciPy's HiGHS, not GLOP."""
    hw = problem.hw
    cap = m - fixed_floors(problem.estimator.fixed(), False, hw.constants.pipeline_overlap)[0]
    flat = [(t, c) for t, cs in enumerate(cands) for c in cs if c.max_piece <= cap]
    rows = []
    for _, c in flat:
        sizes = [Fraction(float(a)) + Fraction(float(b)) for g in c.groups
                 for a, b in zip(g.comp, g.comm, strict=True)]
        x = [s / Fraction(cap) for s in sizes]
        rows.append([float(sum(x))] + [float(sum(_exact_fff(v, k) for v in x))
                                       for k in range(1, 17)])
    a = np.array(rows).T / hw.world_size
    table = sp.csr_matrix((np.ones(len(flat)), ([t for t, _ in flat], range(len(flat)))),
                          shape=(len(cands), len(flat)))
    res = linprog(np.zeros(len(flat)), A_ub=a, b_ub=np.ones(len(a)), A_eq=table,
                  b_eq=np.ones(len(cands)), bounds=(0, None), method="highs")
    assert res.status in (0, 2)
    return res.status == 0


def test_highs_agrees_where_it_refutes() -> None:
    """criteo_kaggle on 1 and 2 h100 hosts, memory left out: HiGHS finds no mix of
    candidates that fits 0.1% under the bound (rows rebuilt here in exact fractions), and
    finds one 0.1% over it (the LP is a relaxation, so that is no plan, only no refutation)."""
    for hosts in (1, 2):
        req = {"model": json.loads(fixture_text("criteo_kaggle")),
               "hardware": {"preset": "h100", "hosts": hosts}}
        problem = build_problem(resolve(req))
        cands, _ = candidates_for(problem)
        b = lower_bound(problem, cands)
        bound = packing_bound(problem, cands, b.average_s, memory=False)
        assert bound > b.average_s * 1.007
        assert not _highs_feasible(problem, cands, bound * 0.999)
        assert _highs_feasible(problem, cands, bound * 1.001)
