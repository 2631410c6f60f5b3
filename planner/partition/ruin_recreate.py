"""Ruin and recreate: take a few tables out of a whole plan and put them back, each with
whichever of its candidates and placements leaves the cluster's slowest GPU lowest.

The local search moves one piece at a time and stops where no single move lowers the
slowest GPU; on several hosts that is often a plateau (several GPUs at the makespan, or one
that waits on the owner side of the all-to-alls, which only a different mix of pieces on its
host mends). Here each round removes a handful of tables at once (some with a piece on the
slowest GPU, the rest drawn at random, data-parallel ones included, so a table can become a
replica or stop being one) and re-inserts them largest first, scoring every candidate of each
against the rest of the plan in place, owner side counted. A round is kept when the makespan
does not rise and either falls or the loads' soft maximum (sum of (load / makespan)^16) does:
so rounds can walk along a plateau toward fewer GPUs at the top, and the makespan never rises.

Deterministic: the random draws come from the request's seed, and the budget is counted in
deterministic seconds charged per tentative placement (`_PLACE_S` + `_PLACE_PER_GPU_S` per
GPU, measured on the 2-CPU reference machine), not read off a clock. It stops when the budget
is spent, the plan is within the target, or `patience` rounds in a row kept nothing (the
patience grows with the budget). Rounds run in the same order whatever the budget, so a
larger budget runs a longer prefix of the same rounds and never ends on a worse plan.
"""

import logging
from dataclasses import dataclass

import numpy as np

from planner.candidates import Candidate, Scope
from planner.partition.assignment import Assignment, TableChoice
from planner.partition.greedy import allowed_mask
from planner.partition.local_search import LocalSearch
from planner.partition.state import LoadState
from planner.problem import Problem

log = logging.getLogger("planner.ruin_recreate")

# Deterministic seconds charged per tentative placement of a candidate: a fixed part and a
# part per GPU (the load arrays it copies and scans). Timed on the 2-CPU reference machine
# (Python 3.11): 98-153 us a placement on 128 GPUs, 204 us on 1,024.
_PLACE_S = 90e-6
_PLACE_PER_GPU_S = 0.12e-6
# Tables taken out per round: 1 to 3 with a piece on the slowest GPU, 2 to 7 drawn at random.
_ON_SLOWEST = (1, 4)
_RANDOM = (2, 8)
# The soft maximum's exponent: high enough that the GPUs at the top dominate it; taken by
# squaring four times (np.power picks a CPU-specific kernel for x ** 16, whose last bits
# differ between machines: cost_models/portable_math.py).
_SOFT_SQUARINGS = 4
# A round that lowers the makespan is polished by the local search (at most `polish_steps`
# steps), charged per table (its setup and the loads rebuilt after it: 30-75 us a table
# measured), per step that moved something (1.7 ms a step over 1,535 steps on 10,000 tables
# and 1,024 GPUs) and for the last step, which tries everything and finds nothing (6.5-14.5
# ms measured on 100-1,000 tables and 128-1,024 GPUs). The search's own setup (the loads,
# the pins, the per-GPU index) is charged per table too.
_PER_TABLE_S = 75e-6
_POLISH_STEP_S = 2e-3
_POLISH_END_S = 12e-3
_REL_EPS = 1e-12
# Rounds in a row without one kept before the search stops: at least _PATIENCE, more with a
# larger budget (never fewer), so the rounds of a smaller budget stay a prefix of a larger
# one's.
_PATIENCE = 100
_PATIENCE_PER_S = 100


@dataclass(frozen=True)
class RecreateResult:
    assignment: Assignment
    rounds: int
    kept: int  # rounds kept (makespan or soft maximum lowered)
    improved: int  # rounds that lowered the makespan
    det_time: float  # deterministic seconds spent
    start_s: float
    end_s: float


def _score(load: np.ndarray) -> tuple[float, float]:
    top = float(load.max())
    if top <= 0:
        return top, 0.0
    soft = load / top
    for _ in range(_SOFT_SQUARINGS):
        soft = soft * soft
    return top, float(np.sum(soft))


def _index(tables_on: list[set[int]], t: int, ch: TableChoice, sign: int) -> None:
    if ch.cand.scope is Scope.WORLD:
        return
    for ranks in ch.ranks:
        for r in ranks.tolist():
            if sign > 0:
                tables_on[r].add(t)
            else:
                tables_on[r].discard(t)


def _tables_on(choices: list[TableChoice], w: int) -> list[set[int]]:
    """Per GPU, the tables with a piece on it (data-parallel and row-wise ones left out: they
    are on every GPU)."""
    tables_on: list[set[int]] = [set() for _ in range(w)]
    for t, ch in enumerate(choices):
        _index(tables_on, t, ch, 1)
    return tables_on


def ruin_and_recreate(problem: Problem, cands: list[list[Candidate]], start: Assignment,
                      budget_s: float, seed: int, target_s: float = 0.0,
                      polish_steps: int = 0) -> RecreateResult:
    """Rounds until `budget_s` deterministic seconds are spent or the makespan is at most
    `target_s`. Returns a new assignment (`start` is left as it is), never worse than it."""
    tables = len(cands)
    w = problem.hw.world_size
    place_s = _PLACE_S + _PLACE_PER_GPU_S * w
    rng = np.random.default_rng(seed)
    masks = [allowed_mask(problem, t) for t in range(tables)]
    least = [min(c.work for c in cs) for cs in cands]
    choices = list(start.choices)
    state = LoadState.of_choices(problem, choices)
    tables_on = _tables_on(choices, w)
    current = _score(state.load())
    start_s = current[0]
    rounds, kept, improved, idle = 0, 0, 0, 0
    spent = _PER_TABLE_S * tables
    patience = max(_PATIENCE, int(_PATIENCE_PER_S * budget_s))
    while spent < budget_s and current[0] > target_s and tables > 1 and idle < patience:
        rounds += 1
        idle += 1
        load = state.load()
        slowest = int(np.argmax(load))
        on_slowest = sorted(tables_on[slowest])
        picked: set[int] = set()
        if on_slowest:
            k = min(len(on_slowest), int(rng.integers(*_ON_SLOWEST)))
            picked.update(int(t) for t in rng.choice(on_slowest, size=k, replace=False))
        k = min(tables, int(rng.integers(*_RANDOM)))
        picked.update(int(t) for t in rng.choice(tables, size=k, replace=False))
        trial = state.copy()
        for t in picked:
            for grp, ranks in zip(choices[t].cand.groups, choices[t].ranks, strict=True):
                trial.apply(grp, ranks, -1)
        new: dict[int, TableChoice] = {}
        for t in sorted(picked, key=lambda t: (-least[t], t)):  # largest first
            best: tuple[tuple[float, float], LoadState, TableChoice] | None = None
            for cand in cands[t]:
                spent += place_s
                other = trial.copy()
                ranks = other.place(cand, masks[t])
                if ranks is None:
                    continue
                after = other.load()
                key = (float(after.max()), float(after.sum()))
                if best is None or key < best[0]:
                    best = (key, other, TableChoice(cand, ranks))
            if best is None:
                break
            trial, new[t] = best[1], best[2]
        if len(new) < len(picked):
            continue  # some table fit nowhere this time: the round is dropped
        score = _score(trial.load())
        if score[0] <= current[0] * (1 + _REL_EPS) and (
                score[0] < current[0] * (1 - _REL_EPS) or score[1] < current[1] - _REL_EPS):
            lowered = score[0] < current[0] * (1 - _REL_EPS)
            improved += lowered
            kept += 1
            idle = 0
            for t, ch in new.items():
                _index(tables_on, t, choices[t], -1)
                choices[t] = ch
                _index(tables_on, t, ch, 1)
            state, current = trial, score
            if polish_steps and lowered:
                # At most what the budget has left (one step at least). A larger budget's
                # polish runs on along the same steps from the same state, and a cut one
                # ends the search, so more budget still never ends worse.
                left = budget_s - spent - _PER_TABLE_S * tables - _POLISH_END_S
                search = LocalSearch(problem, cands, Assignment(choices, "", "", []))
                allowed = min(polish_steps, max(1, int(left / _POLISH_STEP_S)))
                polished = search.run(allowed)
                spent += (_PER_TABLE_S * tables + _POLISH_STEP_S * search.stats.steps
                          + (0.0 if search.stats.exhausted else _POLISH_END_S))
                if search.stats.exhausted and allowed < polish_steps:
                    spent = max(spent, budget_s)  # cut by the budget: the search ends here
                if search.stats.steps:
                    choices = list(polished.choices)
                    state = LoadState.of_choices(problem, choices)
                    current = _score(state.load())
                    tables_on = _tables_on(choices, w)
    log.info("ruin and recreate: %d rounds, %d kept, %d lowered the makespan (%.6g -> %.6g "
             "s), %.3g deterministic s", rounds, kept, improved, start_s, current[0], spent)
    notes = [*start.notes]
    if improved:
        notes.append(f"ruin and recreate: {improved} of {rounds} rounds lowered the makespan")
    solver = start.solver if start.solver.endswith("+lns") else f"{start.solver}+lns"
    out = Assignment(choices=choices, solver=solver if improved else start.solver,
                     status=start.status, notes=notes)
    return RecreateResult(out, rounds, kept, improved, round(spent, 9), start_s, current[0])
