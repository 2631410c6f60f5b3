"""The LP relaxation of candidate choice (planner/relaxation.py): its bound equals an LP
solved by another solver with other arithmetic (SciPy's HiGHS on the flat candidate list),
no memory price found by a grid beats its prices, and where memory binds its choices give
a start that fits and beats the memory-blind greedy."""

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import linprog

import planner.planning as planning
from benchmarks.tight_memory import request as _tight
from cost_models import ShardingType
from planner import plan
from planner.bounds import _dual, lagrangian_bound, lower_bound
from planner.partition import pipeline
from planner.partition.cpsat import makespan
from planner.partition.greedy import greedy
from planner.partition.lp_start import Relaxer, lp_start, relaxed_choices
from planner.partition.policy import DEFAULT_POLICY
from planner.planning import build_problem, candidates_for, resolve
from planner.relaxation import candidate_matrix, cluster_caps, memory_matrix

CASES = [_tight("hugectr_200", 1, "16GiB", "64GiB"), _tight("criteo_dcnv2", 1, "16GiB", "64GiB"),
         {"model": "hugectr_510", "hardware": {"preset": "h100", "hosts": 2}}]


def _setup(request: dict):
    problem = build_problem(resolve(request))
    cands, _ = candidates_for(problem)
    return problem, cands


def _highs(cands, caps: np.ndarray) -> float:
    """The same LP over a flat list of every candidate, by HiGHS."""
    flat = [(t, c) for t, cs in enumerate(cands) for c in cs]
    cost = np.array([c.work for _, c in flat])
    table = sp.csr_matrix((np.ones(len(flat)), ([t for t, _ in flat], range(len(flat)))))
    memory = np.array([[c.hbm_total, c.ddr_total, c.ssd_total] for _, c in flat]).T / 1e9
    res = linprog(cost, A_ub=memory, b_ub=caps / 1e9, A_eq=table, b_eq=np.ones(len(cands)),
                  bounds=(0, None), method="highs")
    assert res.status == 0
    return float(res.fun)


@pytest.mark.parametrize("request_", CASES, ids=lambda r: str(r["model"]))
def test_lp_bound_is_the_lp_optimum(request_) -> None:
    problem, cands = _setup(request_)
    work, mem = candidate_matrix(cands, "work"), memory_matrix(cands)
    caps = cluster_caps(problem.hw)
    value, prices = lagrangian_bound(work, mem, caps)
    assert value == pytest.approx(_highs(cands, caps), rel=1e-6)
    # No price on a grid around GLOP's does better: the dual is at its maximum.
    for k in range(3):
        for factor in (0.0, 0.5, 0.9, 1.1, 2.0):
            trial = prices.copy()
            trial[k] = trial[k] * factor if prices[k] > 0 else 1e-13 * factor
            assert _dual(work, mem, caps, trial) <= value * (1 + 1e-9)


@pytest.mark.parametrize("request_", CASES[:2], ids=lambda r: str(r["model"]))
def test_memory_binds_and_prices_tighten_the_bound(request_) -> None:
    problem, cands = _setup(request_)
    bound = lower_bound(problem, cands)
    assert bound.memory_priced and any(p > 0 for p in bound.prices)
    plain = float(candidate_matrix(cands, "work").min(axis=1).sum()) / problem.hw.world_size
    assert bound.average_s > plain * 1.05


def test_relaxed_start_fits_where_memory_binds() -> None:
    """zionex-like pressure on hugectr_200: the relaxation's choice at some fill is placed
    whole, fits every cap (the state refuses what does not), and starts below the greedy."""
    problem, cands = _setup(CASES[0])
    bound = lower_bound(problem, cands)
    starts = []
    for fill, choice in relaxed_choices(problem, cands, bound.value_s,
                                        DEFAULT_POLICY.relaxation_fills):
        start = lp_start(problem, cands, choice, fill=fill)
        if start is not None:
            starts.append((fill, makespan(problem, start.choices)))
    assert starts and min(f for f, _ in starts) < 1.0
    assert min(s for _, s in starts) < makespan(problem, greedy(problem, cands,
                                                                bound.prices).choices)


def test_smaller_pieces_mend_the_owner_side(monkeypatch) -> None:
    """hugectr_200 on 4 hosts: with pieces up to the bound, the GPUs holding one large
    compute-heavy piece wait on the owner side of the all-to-alls; the priced start's
    smaller-piece relaxations give a faster plan, and planning without them a slower one."""
    request = {"model": "hugectr_200", "hardware": {"preset": "h100", "hosts": 4}}
    with_shares = plan(request)
    monkeypatch.setattr(planning, "DEFAULT_POLICY",
                        dataclasses.replace(planning.DEFAULT_POLICY, piece_shares=(1.0,)))
    without = plan(request)
    assert with_shares.summary.step_time_s < without.summary.step_time_s * 0.97
    assert "pieces up to" in " ".join(with_shares.summary.decisions)


def test_smaller_pieces_try_every_fuller_fill(monkeypatch) -> None:
    """The smaller-piece relaxations run at the fill the best plan grew with and at each
    fuller one (zionex_12t x 16 h100 hosts packs pieces up to 60% of the bound at 97%, its
    whole-piece plan grew at 88%), never at an emptier one; the plan never gets worse."""
    problem, cands = _setup(_tight("hugectr_200", 2, "24GiB", "64GiB"))
    bound = lower_bound(problem, cands)
    start = greedy(problem, cands, bound.prices)
    seen: list[tuple[float, float]] = []
    grown = pipeline._grown

    def recording(*args, **kwargs):
        seen.append((args[7], args[8]))  # fill, share
        return grown(*args, **kwargs)

    monkeypatch.setattr(pipeline, "_grown", recording)
    monkeypatch.setattr(pipeline, "_waits", lambda *_: True)
    out = pipeline._smaller_pieces(problem, cands, bound, start, False, 0.93, DEFAULT_POLICY)
    fills = {f for f, _ in seen}
    assert fills and min(fills) >= 0.93 and max(fills) > 0.93
    assert {s for _, s in seen} <= set(DEFAULT_POLICY.piece_shares[1:])
    assert makespan(problem, out.choices) <= makespan(problem, start.choices)


def test_held_relaxation_keeps_split_tables_types() -> None:
    """_held holds exactly the tables the plan split (neither table-wise nor data-parallel)
    whose piece is over the cap, to their types; the relaxation under it chooses those
    types, and pieces over the cap only where the held type has none under it."""
    problem, cands = _setup(CASES[1])
    bound = lower_bound(problem, cands)
    start = greedy(problem, cands, bound.prices)
    cap = bound.value_s * DEFAULT_POLICY.piece_shares[-1]
    held = pipeline._held(cands, start, cap)
    split = [t for t, ch in enumerate(start.choices) if ch.cand.max_piece > cap
             and ch.cand.kind not in (ShardingType.TABLE_WISE, ShardingType.DATA_PARALLEL)]
    assert split and held is not None
    assert [t for t in range(len(cands)) if not held[t, :len(cands[t])].all()] == split
    relaxed = Relaxer(problem, cands).choose(cap, 1.0, held)
    assert relaxed is not None
    for t in split:
        picked = cands[t][relaxed.choice[t]]
        assert picked.kind is start.choices[t].cand.kind
        same = [c.max_piece for c in cands[t] if c.kind is picked.kind]
        assert picked.max_piece <= cap or picked.max_piece == min(same)
    assert pipeline._held(cands, start, float("inf")) is None


def test_smaller_pieces_run_each_cap_free_and_held(monkeypatch) -> None:
    """On 2 hosts, each cap's relaxation runs free and, where the best plan split tables
    with pieces over the cap, once more with exactly those held (one call per distinct
    choice to _grown, the held one flagged); without split tables over a cap, once."""
    problem, cands = _setup({"model": "criteo_dcnv2", "hardware": {"preset": "h100", "hosts": 2}})
    bound = lower_bound(problem, cands)
    start = greedy(problem, cands, bound.prices)
    masks: list[tuple[float, np.ndarray | None]] = []
    grown: list[bool] = []

    class Recording(Relaxer):
        def choose(self, max_piece_s, fill, held=None):
            masks.append((max_piece_s, held))
            return super().choose(max_piece_s, fill, held)

    def stub(*args, **kwargs):
        grown.append(kwargs.get("held", False))
        return args[4]  # best, unchanged

    monkeypatch.setattr(pipeline, "Relaxer", Recording)
    monkeypatch.setattr(pipeline, "_grown", stub)
    monkeypatch.setattr(pipeline, "_waits", lambda *_: True)
    out = pipeline._smaller_pieces(problem, cands, bound, start, False, 1.0, DEFAULT_POLICY)
    assert out is start
    held_caps = set()
    for cap, held in masks:
        split = {t for t, ch in enumerate(start.choices) if ch.cand.max_piece > cap
                 and ch.cand.kind not in (ShardingType.TABLE_WISE, ShardingType.DATA_PARALLEL)}
        if held is None:
            continue
        held_caps.add(cap)
        assert split == {t for t in range(len(cands)) if not held[t, :len(cands[t])].all()}
    caps = {cap for cap, _ in masks}
    assert caps == {bound.value_s * s for s in DEFAULT_POLICY.piece_shares[1:]}
    # The greedy split tables with pieces over every cap here but the first share's.
    assert len(held_caps) >= len(caps) - 1 and any(grown) and not all(grown)
