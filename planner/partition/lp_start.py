"""A start built from the relaxation's candidate choices, with replicas placed first.

The LP relaxation of candidate choice (x[t,c] >= 0, sum_c x = 1; T at least the average
load, each chosen piece, and the memory caps summed over the cluster) was solved with GLOP on
400- to 1,000-table sets: its choices equal, table for table, the Lagrangian relaxation's
(argmin over c of work + lambda . memory at the bound's prices). `priced_choice` gets them
from the bound's prices in O(candidates), without the LP (GLOP took 18 s to build and solve at
10,000 tables).

The start: each table takes its chosen candidate; data-parallel and other world-scope tables
go first, since they need room on every GPU; then the rest largest first, each onto the least
loaded GPU or host that fits, falling back to the table's other candidates in order of work
when its choice does not fit.
"""

import itertools
from collections.abc import Iterator

import numpy as np

from planner.candidates import Candidate, Scope
from planner.partition.assignment import Assignment, TableChoice
from planner.partition.greedy import allowed_mask
from planner.partition.state import LoadState
from planner.problem import Problem


def priced_choice(cands: list[list[Candidate]], prices: tuple[float, float, float],
                  max_piece_s: float) -> list[int]:
    """Per table, the candidate with the least work + prices . (HBM, DDR, SSD bytes) among
    those whose largest piece is at most `max_piece_s` (the bound: no plan under it can hold
    a larger piece, as the LP's T >= max_piece * x says); the smallest piece where none is."""
    lam = np.asarray(prices, dtype=np.float64)
    out = []
    for cs in cands:
        mem = np.array([(c.hbm_total, c.ddr_total, c.ssd_total) for c in cs], dtype=np.float64)
        score = np.array([c.work for c in cs]) + mem @ lam
        piece = np.array([c.max_piece for c in cs])
        ok = piece <= max_piece_s
        out.append(int(np.argmin(np.where(ok, score, np.inf))) if ok.any()
                   else int(np.argmin(piece)))
    return out


def _by_work(cs: list[Candidate], picked: Candidate) -> Iterator[Candidate]:
    """The table's other candidates by work (sorted only once asked for)."""
    yield from sorted((c for c in cs if c is not picked), key=lambda c: c.work)


def lp_start(problem: Problem, cands: list[list[Candidate]], choice: list[int],
             owner_side: bool = False, spread_hosts: bool = False) -> Assignment | None:
    """Place each table's chosen candidate (`choice[t]` indexes cands[t]), world-scope
    (data-parallel, row-wise) tables first; a table whose choice no longer fits takes its
    next candidate by work. None if one fits nowhere."""
    state = LoadState(problem.hw, problem.model, owner_side=owner_side,
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
    note = (f"priced start: {kept} of {len(cands)} tables on the relaxation's choice, "
            "replicas placed first")
    return Assignment([c for c in choices if c is not None], "lp+lpt", "feasible", [note])
