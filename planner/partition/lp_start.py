"""A start built from the LP relaxation's candidate choices, with replicas placed first.

The relaxation (planner/relaxation.py) chooses candidates against the cluster's memory
summed over GPUs and hosts; where memory binds, its choice fills HBM and DDR to the byte and
rarely packs into per-GPU and per-host caps. So the choice is taken at several fills of the
caps, fullest first (the policy's `relaxation_fills`, partition/policy.py): zionex_12t on
4 h100 hosts, where the relaxation fills HBM and DDR, gives no plan at 1.0 and 97.0 ms at
0.97 after local search (bound 93.6 ms; the greedy's plan was 232.4 ms); on 16 hosts 0.88
packs best.

The start: each table takes its chosen candidate; data-parallel and other world-scope tables
go first, since they need room on every GPU; then the rest largest first, each onto the least
loaded GPU or host that fits, falling back to the table's other candidates in order of work
when its choice does not fit.
"""

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from planner.candidates import Candidate, Scope
from planner.partition.assignment import Assignment, TableChoice
from planner.partition.greedy import allowed_mask
from planner.partition.state import LoadState
from planner.problem import Problem
from planner.relaxation import (
    candidate_matrix,
    cluster_caps,
    memory_matrix,
    solve_relaxation,
)


@dataclass(frozen=True)
class RelaxedChoice:
    choice: list[int]  # per table, the index of its candidate
    binds: bool  # memory binds: the relaxation priced some memory


class Relaxer:
    """The relaxation's rounded choice under a limit on the largest piece and a fill of the
    cluster's memory; the candidate matrices built once."""

    def __init__(self, problem: Problem, cands: list[list[Candidate]]) -> None:
        self.work = candidate_matrix(cands, "work")
        self.maxp = candidate_matrix(cands, "max_piece")
        self.mem = memory_matrix(cands)
        self.caps = cluster_caps(problem.hw)

    def choose(self, max_piece_s: float, fill: float, held: np.ndarray | None = None
               ) -> RelaxedChoice | None:
        """Over the candidates whose largest piece is at most `max_piece_s` (a table with
        none keeps its smallest piece), among the `held` ones (T, C) if given, the caps
        times `fill`; None when nothing fits."""
        usable = self.maxp <= max_piece_s
        if held is not None:
            usable = usable & held
        none = ~usable.any(axis=1)
        maxp = self.maxp if held is None else np.where(held, self.maxp, np.inf)
        usable[none, maxp[none].argmin(axis=1)] = True
        relaxed = solve_relaxation(self.work, self.mem, self.caps * fill, usable)
        if relaxed is None:
            return None
        return RelaxedChoice([int(i) for i in relaxed.choice], bool(relaxed.prices.any()))


# Where no mix of candidates with pieces under the bound fits the memory, the cap on the
# largest piece is raised by these factors in turn (the last: no cap).
_CAP_GROWTH = (1.0, 1.01, 1.03, 1.1, 1.3, 2.0, float("inf"))


def relaxed_choices(problem: Problem, cands: list[list[Candidate]], max_piece_s: float,
                    fills: tuple[float, ...]) -> Iterator[tuple[float, list[int]]]:
    """(fill, choice) of the relaxation at each of `fills` (fullest first), pieces up to
    `max_piece_s`. Stops once memory no longer binds: a smaller fill then gives the same
    choice."""
    relaxer = Relaxer(problem, cands)
    for fill in fills:
        relaxed = None
        for growth in _CAP_GROWTH:
            # Pieces under the bound may fit no mix of memory (the bound itself is often the
            # largest makespan at which they do not: planner/capped_bound.py).
            relaxed = relaxer.choose(max_piece_s * growth, fill)
            if relaxed is not None:
                break
        if relaxed is None:
            return
        yield fill, relaxed.choice
        if not relaxed.binds:
            return


def _by_work(cs: list[Candidate], picked: Candidate) -> Iterator[Candidate]:
    """The table's other candidates by work (sorted only once asked for)."""
    yield from sorted((c for c in cs if c is not picked), key=lambda c: c.work)


def lp_start(problem: Problem, cands: list[list[Candidate]], choice: list[int],
             owner_side: bool = False, spread_hosts: bool = False, fill: float = 1.0,
             piece_share: float = 1.0, held: bool = False) -> Assignment | None:
    """Place each table's chosen candidate (`choice[t]` indexes cands[t]), world-scope
    (data-parallel, row-wise) tables first; a table whose choice no longer fits takes its
    next candidate by work. None if one fits nowhere."""
    state = LoadState.empty(problem, owner_side=owner_side,
                      spread_hosts=spread_hosts)
    picked = [cs[i] for cs, i in zip(cands, choice, strict=True)]
    first = sorted((t for t, c in enumerate(picked) if c.scope is Scope.WORLD),
                   key=lambda t: (-picked[t].hbm_total, t))
    rest = sorted((t for t, c in enumerate(picked) if c.scope is not Scope.WORLD),
                  key=lambda t: (-picked[t].work, t))
    choices: list[TableChoice | None] = [None] * len(cands)
    for t in first + rest:
        allowed = allowed_mask(problem, t)
        cand = picked[t]
        tried_first = [cand]
        if len(cand.groups) == 1:
            # One group: choosing its place changes nothing, so no trial copy is needed (and
            # where it does not fit, trying it again on a copy would not fit either).
            ranks = state.choose(cand.groups[0], cand.scope, allowed)
            if ranks is not None:
                state.apply(cand.groups[0], ranks)
                choices[t] = TableChoice(cand, [ranks])
                continue
            tried_first = []
        for cand in itertools.chain(tried_first, _by_work(cands[t], picked[t])):
            trial = state.copy()
            ranks = trial.place(cand, allowed)
            if ranks is not None:
                state, choices[t] = trial, TableChoice(cand, ranks)
                break
        if choices[t] is None:
            return None
    kept = sum(ch is not None and ch.cand is p for ch, p in zip(choices, picked, strict=True))
    pieces = f", pieces up to {piece_share:.0%} of the bound" if piece_share < 1 else ""
    pieces += ", the relaxation holding the split tables over it to their types" if held else ""
    note = (f"priced start: {kept} of {len(cands)} tables on the relaxation's choice at "
            f"{fill:.0%} of the cluster's memory{pieces}, replicas placed first")
    return Assignment([c for c in choices if c is not None], "lp+lpt", "feasible", [note])
