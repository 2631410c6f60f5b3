"""Largest-first greedy (LPT) that also picks each table's candidate, under memory caps.

Tables go in decreasing order of their cheapest candidate's work. For each, every candidate is
placed tentatively (each group onto the least loaded place that fits) and scored by the
makespan it would leave, projected with the work still to come:
    score = max(slowest GPU after, (all load after + cheapest work of the tables left) / W)
          + (lambda . memory of the candidate) / W
The projection keeps the first tables from spreading themselves thin (which only pays when
there is idle capacity at the end); the memory term, priced by the lower bound's Lagrange
multipliers, steers tables to slower tiers when HBM is scarce. If some table fits nowhere,
the pass is repeated with memory priced higher, and then it gives up with the shortfall.
"""

import logging

import numpy as np

from cost_models.portable_math import dot_last
from planner.candidates import Candidate
from planner.errors import InfeasibleError
from planner.partition.assignment import Assignment, TableChoice
from planner.partition.state import LoadState
from planner.problem import Problem

log = logging.getLogger("planner.greedy")

# Multipliers on the memory prices for the retries when a pass runs out of memory.
_PRICE_ESCALATION = (1.0, 4.0, 32.0, 1024.0)


def allowed_mask(problem: Problem, table: int) -> np.ndarray | None:
    pins = problem.tables[table].constraints.pinned_ranks
    if not pins:
        return None
    mask = np.zeros(problem.hw.world_size, dtype=bool)
    mask[list(pins)] = True
    return mask


def _mem_vector(c: Candidate) -> np.ndarray:
    return np.array([c.hbm_total, c.ddr_total, c.ssd_total], dtype=float)


def greedy(problem: Problem, cands: list[list[Candidate]],
           prices: tuple[float, float, float], owner_side: bool = False,
           spread_hosts: bool = False) -> Assignment:
    """`owner_side`: score half-built plans with the all-to-alls' owner side too (helps on
    some multi-host instances, hurts on others; the pipeline tries both on small ones)."""
    last_error: InfeasibleError | None = None
    for factor in _PRICE_ESCALATION:
        lam = np.array(prices) * factor
        if factor > 1.0 and not lam.any():
            # No memory prices to raise: price HBM by the work it would take to offload it.
            lam = np.array([1.0, 0.1, 0.0]) * factor * _hbm_price_guess(problem, cands)
        try:
            choices = _greedy_pass(problem, cands, lam, owner_side, spread_hosts)
        except InfeasibleError as err:
            log.info("greedy pass with memory prices x%g failed: %s", factor, err.reason)
            last_error = err
            continue
        notes = [] if factor == 1.0 else [f"memory priced x{factor:g} to fit"]
        return Assignment(choices=choices, solver="greedy", status="feasible", notes=notes)
    assert last_error is not None
    raise last_error


def _hbm_price_guess(problem: Problem, cands: list[list[Candidate]]) -> float:
    work = sum(min(c.work for c in cs) for cs in cands)
    return work / max(1, problem.hw.world_size * problem.hw.hbm_cap)


# Skip the candidates whose score cannot beat the best one's (see _greedy_pass); a switch
# for the tests, which compare the greedy with and without it.
_PRUNE = True
# Relative slack on that bound: its rounding is ~1e-15 of the loads.
_BOUND_SLACK = 1e-9


def _greedy_pass(problem: Problem, cands: list[list[Candidate]],
                 lam: np.ndarray, owner_side: bool, spread_hosts: bool = False
                 ) -> list[TableChoice]:
    hw = problem.hw
    w = hw.world_size
    state = LoadState.empty(problem, owner_side=owner_side, spread_hosts=spread_hosts)
    min_work = [min(c.work for c in cs) for cs in cands]
    order = sorted(range(len(cands)), key=lambda t: (-min_work[t], t))
    remaining = float(sum(min_work))
    choices: list[TableChoice | None] = [None] * len(cands)
    # A candidate's score is at least (the loads' sum after it + remaining) / W + its memory
    # price, and without the owner side or pipelining the loads' sum rises by exactly its
    # work (costs are never negative). Candidates are tried in the order of that bound, and
    # once it passes the best score found the rest cannot win: the winner is the least
    # (score, candidate index), as trying them in list order and keeping strict improvements
    # gives. At 10,000 tables on 1,024 GPUs this skips 71% of the tentative placements.
    prune = _PRUNE and not owner_side and not problem.model.pipelined
    for t in order:
        remaining -= min_work[t]
        allowed = allowed_mask(problem, t)
        pool = cands[t]
        penalties = [float(dot_last(_mem_vector(cand), lam)) / w for cand in pool]
        tries: range | list[int] = range(len(pool))
        bounds: list[float] = []
        if prune:
            base = float(state.load().sum()) + remaining
            if base >= 0 and all(c.comp_work >= 0 and c.comm_work >= 0 for c in pool):
                bounds = [(base + c.work) / w + pen - _BOUND_SLACK * (
                    (base + c.work) / w + abs(pen)) for c, pen in zip(pool, penalties,
                                                                        strict=True)]
                tries = sorted(range(len(pool)), key=lambda i: (bounds[i], i))
        best: tuple[tuple[float, float, float], int, LoadState, TableChoice] | None = None
        for i in tries:
            if bounds and best is not None and bounds[i] > best[0][0]:
                break
            cand = pool[i]
            trial = state.copy()
            ranks = trial.place(cand, allowed)
            if ranks is None:
                continue
            load = trial.load()
            slowest, total = float(load.max()), float(load.sum())
            score = (max(slowest, (total + remaining) / w) + penalties[i], slowest, total)
            if best is None or (score, i) < (best[0], best[1]):
                best = (score, i, trial, TableChoice(cand, ranks))
        if best is None:
            name = problem.tables[t].name
            short = state.shortfall(cands[t][0], allowed)
            raise InfeasibleError(
                reason=(f"table '{name}' fits nowhere once the tables before it are placed: "
                        f"it needs {short.need:,} bytes of {short.cap}, at most {short.free:,} "
                        f"are free (short by {short.need - short.free:,} bytes)"),
                table=name, cap=short.cap, short_bytes=max(0, short.need - short.free),
            )
        state = best[2]
        choices[t] = best[3]
        log.debug("table %s -> %s", problem.tables[t].name, best[3].cand.label)
    return [c for c in choices if c is not None]
