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
           prices: tuple[float, float, float], owner_side: bool = False) -> Assignment:
    """`owner_side`: score half-built plans with the all-to-alls' owner side too (helps on
    some multi-host instances, hurts on others; planning.py tries both on small ones)."""
    last_error: InfeasibleError | None = None
    for factor in _PRICE_ESCALATION:
        lam = np.array(prices) * factor
        if factor > 1.0 and not lam.any():
            # No memory prices to raise: price HBM by the work it would take to offload it.
            lam = np.array([1.0, 0.1, 0.0]) * factor * _hbm_price_guess(problem, cands)
        try:
            choices = _greedy_pass(problem, cands, lam, owner_side)
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


def _greedy_pass(problem: Problem, cands: list[list[Candidate]],
                 lam: np.ndarray, owner_side: bool) -> list[TableChoice]:
    hw = problem.hw
    w = hw.world_size
    state = LoadState(hw, problem.model, owner_side=owner_side)
    min_work = [min(c.work for c in cs) for cs in cands]
    order = sorted(range(len(cands)), key=lambda t: (-min_work[t], t))
    remaining = float(sum(min_work))
    choices: list[TableChoice | None] = [None] * len(cands)
    for t in order:
        remaining -= min_work[t]
        allowed = allowed_mask(problem, t)
        best: tuple[tuple[float, float, float], LoadState, TableChoice] | None = None
        for cand in cands[t]:
            trial = state.copy()
            ranks = trial.place(cand, allowed)
            if ranks is None:
                continue
            load = trial.load()
            slowest, total = float(load.max()), float(load.sum())
            penalty = float(_mem_vector(cand) @ lam) / w
            score = (max(slowest, (total + remaining) / w) + penalty, slowest, total)
            if best is None or score < best[0]:
                best = (score, trial, TableChoice(cand, ranks))
        if best is None:
            name = problem.tables[t].name
            short = state.shortfall(cands[t][0], allowed)
            raise InfeasibleError(
                reason=(f"table '{name}' fits nowhere once the tables before it are placed: "
                        f"it needs {short.need:,} bytes of {short.cap}, at most {short.free:,} "
                        f"are free (short by {short.need - short.free:,} bytes)"),
                table=name, cap=short.cap, short_bytes=max(0, short.need - short.free),
            )
        state = best[1]
        choices[t] = best[2]
        log.debug("table %s -> %s", problem.tables[t].name, best[2].cand.label)
    return [c for c in choices if c is not None]
