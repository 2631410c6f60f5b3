"""Finding any plan that fits, when the speed-first heuristic could not.

The greedy picks each table's fastest candidate that fits where it is cheapest; on tight
instances (tables that exactly fill HBM, tables only a slower tier can hold) it can paint
itself into a corner where a plan still exists. Before anyone is told "infeasible":
1. memory-first packing: tables by decreasing bytes, each in its leanest candidates first,
   pieces best-, first- or worst-fit decreasing by bytes over HBM, DDR and SSD;
2. a depth-first packing search over (table, candidate, GPU) with identical GPUs tried once
   and a capacity-sum cut, up to a node budget: exact-fit packings that CP-SAT's feasibility
   model did not settle in 20 s (18 tables filling 6 GPUs to the byte) fall in milliseconds;
3. CP-SAT on the feasibility model (caps and pins only, no objective): a plan, or a proof
   that none of the candidates' assignments fits.
All are deterministic (CP-SAT on a deterministic budget with one worker).
"""

import logging
from collections.abc import Callable
from typing import Literal

import numpy as np
from ortools.sat.python import cp_model

from planner.candidates import Candidate, Group, Scope
from planner.partition.assignment import Assignment, TableChoice
from planner.partition.cpsat import deterministic_solver, exact_model_size
from planner.partition.cpsat_model import ExtractionError, PartitionModel
from planner.partition.greedy import allowed_mask
from planner.partition.state import LoadState
from planner.problem import Problem

log = logging.getLogger("planner.feasibility")

# The feasibility model is built only up to this many variables (as the exact model).
FEASIBILITY_MAX_VARS = 60_000
# The least deterministic budget the feasibility model gets, whatever the (optimisation)
# time limit: a plan or a proof is worth a few seconds before "no plan found".
FEASIBILITY_MIN_S = 2.0

def _gpu_fits(state: LoadState, grp: Group, allowed: np.ndarray | None) -> np.ndarray:
    hw = state.hw
    ok = state.hbm + grp.hbm[0] <= hw.hbm_cap
    ok &= (state.ddr + grp.ddr[0] <= hw.ddr_cap)[state.host_of]
    ok &= (state.ssd + grp.ssd[0] <= hw.ssd_cap)[state.host_of]
    if allowed is not None:
        ok &= allowed
    return ok


FitRule = Literal["best", "first", "worst"]


def _place_by_bytes(state: LoadState, cand: Candidate, allowed: np.ndarray | None,
                    rule: FitRule) -> list[np.ndarray] | None:
    """Place the candidate's groups (applied to `state`): one-piece groups by bytes (best fit
    on the tightest HBM left, first fit, or worst fit on the most HBM left, which balances
    like LPT scheduling), host and world groups as the load state would."""
    placed = []
    for grp in cand.groups:
        if cand.scope is Scope.GPU:
            ok = _gpu_fits(state, grp, allowed)
            if not ok.any():
                return None
            if rule == "first":
                rank = int(np.argmax(ok))
            else:
                left = state.hw.hbm_cap - state.hbm - grp.hbm[0]
                if rule == "best":
                    rank = int(np.argmin(np.where(ok, left, np.iinfo(np.int64).max)))
                else:
                    rank = int(np.argmax(np.where(ok, left, np.iinfo(np.int64).min)))
            ranks = np.array([rank])
        else:
            found = state.choose(grp, cand.scope, allowed)
            if found is None:
                return None
            ranks = found
        state.apply(grp, ranks)
        placed.append(ranks)
    return placed


def _pack(problem: Problem, cands: list[list[Candidate]], lean_key: Callable[[Candidate], tuple],
          rule: FitRule) -> list[TableChoice] | None:
    state = LoadState.empty(problem, owner_side=False)
    lean = [min(c.total_bytes for c in cs) for cs in cands]
    order = sorted(range(len(cands)), key=lambda t: (-lean[t], t))
    choices: list[TableChoice | None] = [None] * len(cands)
    for t in order:
        allowed = allowed_mask(problem, t)
        for cand in sorted(cands[t], key=lean_key):
            trial = state.copy()
            ranks = _place_by_bytes(trial, cand, allowed, rule)
            if ranks is not None:
                state, choices[t] = trial, TableChoice(cand, ranks)
                break
        if choices[t] is None:
            return None
    return [c for c in choices if c is not None]


# Candidate orders: fastest first (a fast plan if it fits), then leanest in HBM (slower tiers
# first), then leanest in all bytes.
_ORDERS: tuple[tuple[str, Callable[[Candidate], tuple]], ...] = (
    ("fastest candidate first", lambda c: (c.work, c.hbm_total)),
    ("least HBM first", lambda c: (c.hbm_total, c.total_bytes, c.work)),
    ("fewest bytes first", lambda c: (c.total_bytes, c.hbm_total, c.work)),
)


_RULES: tuple[FitRule, ...] = ("best", "first", "worst")


def memory_first(problem: Problem, cands: list[list[Candidate]]) -> Assignment | None:
    """A plan that fits, by bin packing on bytes; None if no order and fit rule finds one."""
    for label, key in _ORDERS:
        for rule in _RULES:
            choices = _pack(problem, cands, key, rule)
            if choices is not None:
                note = (f"memory-first packing ({label}, {rule} fit decreasing) found a plan "
                        "that fits")
                log.info(note)
                return Assignment(choices, "memory-first packing", "feasible", [note])
    return None


# Nodes of the bin-completion search (cheap: subsets of item sizes) and of the depth-first
# packing search (dear: a load-state copy each, 0.3-0.5 ms; 200,000 took over a minute and
# 20,000 took 10.7 s on a 40-table instance that has no fit), both deterministic.
SEARCH_NODES = 200_000
DFS_NODES = 4_000
# The search runs on models up to this many tables (its recursion is one level a table).
SEARCH_MAX_TABLES = 800


class _Search:
    """Depth-first: tables by decreasing least bytes, candidates leanest first, one-piece
    groups onto each distinct GPU state (tightest HBM first), other groups where the load
    state puts them. Cut: what the tables left need at least, per tier and in all, must fit
    in what is free."""

    def __init__(self, problem: Problem, cands: list[list[Candidate]]) -> None:
        self.p, self.cands = problem, cands
        lean = [min(c.total_bytes for c in cs) for cs in cands]
        self.order = sorted(range(len(cands)), key=lambda t: (-lean[t], t))
        # Suffix sums of the least HBM and the least bytes the tables from position i need.
        hbm = [min(c.hbm_total for c in cands[t]) for t in self.order]
        tot = [lean[t] for t in self.order]
        self.need_hbm = np.concatenate([np.cumsum(hbm[::-1])[::-1], [0]])
        self.need_all = np.concatenate([np.cumsum(tot[::-1])[::-1], [0]])
        # The smallest HBM piece any table from position i could still put on a GPU: a GPU
        # with less HBM free than that can take nothing more (its free HBM is waste).
        small = [min(int(g.hbm.min()) for c in cands[t] for g in c.groups) for t in self.order]
        self.min_piece = np.concatenate([np.minimum.accumulate(small[::-1])[::-1], [0]])
        self.masks = [allowed_mask(problem, t) for t in range(len(cands))]
        self.nodes = 0
        self.choices: list[TableChoice | None] = [None] * len(cands)

    def run(self) -> list[TableChoice] | None:
        state = LoadState.empty(self.p, owner_side=False)
        found = self._place(0, state)
        return [c for c in self.choices if c is not None] if found else None

    def _free(self, state: LoadState, i: int) -> tuple[int, int]:
        hw = self.p.hw
        left = hw.hbm_cap - state.hbm
        hbm = int(left[left >= self.min_piece[i]].sum())
        return hbm, hbm + int((hw.ddr_cap - state.ddr).sum() + (hw.ssd_cap - state.ssd).sum())

    def _place(self, i: int, state: LoadState) -> bool:
        if i == len(self.order):
            return True
        free_hbm, free_all = self._free(state, i)
        if self.need_all[i] > free_all or (self.need_hbm[i] > free_hbm
                                           and self.p.hw.ddr_cap + self.p.hw.ssd_cap == 0):
            return False
        t = self.order[i]
        for cand in sorted(self.cands[t], key=lambda c: (c.total_bytes, c.hbm_total,
                                                         sum(len(g) for g in c.groups),
                                                         c.work)):
            for trial, ranks in self._placements(state, cand, self.masks[t]):
                self.nodes += 1
                if self.nodes > DFS_NODES:
                    return False
                self.choices[t] = TableChoice(cand, ranks)
                if self._place(i + 1, trial):
                    return True
                if self.nodes > DFS_NODES:
                    return False
        self.choices[t] = None
        return False

    def _placements(self, state: LoadState, cand: Candidate, allowed: np.ndarray | None):
        """Each distinct way to put the candidate down: for a one-group GPU-scope candidate,
        one GPU per distinct (free HBM, host DDR, host SSD) state; otherwise the load
        state's own choice (pieces of one group land together)."""
        if cand.scope is Scope.GPU and len(cand.groups) == 1:
            grp = cand.groups[0]
            ok = _gpu_fits(state, grp, allowed)
            seen = set()
            hw = state.hw
            left = hw.hbm_cap - state.hbm
            for r in sorted(np.flatnonzero(ok).tolist(), key=lambda r: (int(left[r]), r)):
                h = int(state.host_of[r])
                key = (int(state.hbm[r]), int(state.ddr[h]), int(state.ssd[h]))
                if key in seen:
                    continue
                seen.add(key)
                trial = state.copy()
                ranks = np.array([r])
                trial.apply(grp, ranks)
                yield trial, [ranks]
            return
        trial = state.copy()
        placed = _place_by_bytes(trial, cand, allowed, "best")
        if placed is not None:
            yield trial, placed


class _BinCompletion:
    """Bin completion (Korf) for one-piece HBM candidates: GPUs are filled one at a time,
    each with a subset of the tables left, fullest subsets first, the waste of every GPU
    bounded by the total slack. Where table-by-table search thrashes on exact fits (24
    tables filling 4 GPUs to the byte: no fit in 3M nodes), this finds one in thousands."""

    def __init__(self, problem: Problem, items: list[Candidate], masks: list[np.ndarray]):
        self.cap = problem.hw.hbm_cap
        self.w = problem.hw.world_size
        self.items = items
        self.size = [c.max_piece_hbm for c in items]
        self.masks = masks
        self.order = sorted(range(len(items)), key=lambda i: (-self.size[i], i))
        self.nodes = 0
        self.rank_of: dict[int, int] = {}

    def run(self) -> dict[int, int] | None:
        slack = self.w * self.cap - sum(self.size)
        if slack < 0:
            return None
        return self.rank_of if self._bin(0, list(self.order), slack) else None

    def _bin(self, r: int, left: list[int], slack: int) -> bool:
        if not left:
            return True
        if r == self.w:
            return False
        here = [i for i in left if self.masks[i][r]]
        for subset, fill in self._subsets(here, slack):
            waste = self.cap - fill
            for i in subset:
                self.rank_of[i] = r
            taken = set(subset)
            rest = [i for i in left if i not in taken]
            if self._bin(r + 1, rest, slack - waste):
                return True
            if self.nodes > SEARCH_NODES:
                return False
        return False

    def _subsets(self, cand: list[int], slack: int):
        """Subsets of `cand` (sizes decreasing) whose waste on one GPU is at most `slack`,
        fullest found first; equal sizes are tried in one order only."""
        out: list[int] = []

        def walk(k: int, fill: int):
            self.nodes += 1
            if self.nodes > SEARCH_NODES:
                return
            if k == len(cand):
                if self.cap - fill <= slack:
                    yield list(out), fill
                return
            i = cand[k]
            if fill + self.size[i] <= self.cap:
                out.append(i)
                yield from walk(k + 1, fill + self.size[i])
                out.pop()
            # Excluding i: skip the next items of the same size (same subsets otherwise).
            j = k + 1
            while j < len(cand) and self.size[cand[j]] == self.size[i]:
                j += 1
            if self.cap - fill - sum(self.size[x] for x in cand[j:]) <= slack:
                yield from walk(j, fill)

        yield from walk(0, 0)


def _bin_completion(problem: Problem, cands: list[list[Candidate]]) -> list[TableChoice] | None:
    """Bin completion when every table has a one-piece HBM-only candidate (its leanest)."""
    items = []
    for cs in cands:
        one = [c for c in cs if c.scope is Scope.GPU and len(c.groups) == 1
               and c.ddr_total == 0 and c.ssd_total == 0]
        if not one:
            return None
        items.append(min(one, key=lambda c: (c.hbm_total, c.work)))
    w = problem.hw.world_size
    masks = []
    for t in range(len(cands)):
        m = allowed_mask(problem, t)
        masks.append(np.ones(w, dtype=bool) if m is None else m)
    search = _BinCompletion(problem, items, masks)
    rank_of = search.run()
    log.info("bin completion: %s after %d nodes", "a fit" if rank_of else "no fit",
             search.nodes)
    if rank_of is None:
        return None
    return [TableChoice(c, [np.array([rank_of[i]])]) for i, c in enumerate(items)]


def packing_search(problem: Problem, cands: list[list[Candidate]]) -> Assignment | None:
    """A plan that fits found by bin completion or the depth-first search, or None (none,
    or the node budgets spent)."""
    if len(cands) > SEARCH_MAX_TABLES:
        return None
    completed = _bin_completion(problem, cands)
    if completed is not None:
        note = "bin completion over one-piece HBM candidates found a plan that fits"
        return Assignment(completed, "bin completion", "feasible", [note])
    search = _Search(problem, cands)
    choices = search.run()
    if choices is None:
        log.info("packing search: no fit within %d nodes (%d tried)", DFS_NODES,
                 search.nodes)
        return None
    note = f"depth-first packing search found a plan that fits ({search.nodes:,} nodes)"
    log.info(note)
    return Assignment(choices, "packing search", "feasible", [note])


Status = Literal["feasible", "infeasible", "unknown", "too large"]


def _feasibility_model(problem: Problem, cands: list[list[Candidate]]) -> PartitionModel:
    hw = problem.hw
    work = sum(min(c.work for c in cs) for cs in cands)
    unit = max(work, 1e-12) / 1e7
    model = PartitionModel(problem, cands, list(range(len(cands))),
                           np.ones(hw.world_size, dtype=bool), LoadState.empty(problem),
                           unit, allow_world=True)
    model.model.clear_objective()
    return model


def cpsat_feasible(problem: Problem, cands: list[list[Candidate]], budget: float, seed: int
                   ) -> tuple[Status, Assignment | None, int]:
    """CP-SAT on caps and pins alone: (status, a plan when feasible, the model's variables)."""
    size = exact_model_size(problem, cands)
    if size > FEASIBILITY_MAX_VARS:
        return "too large", None, size
    model = _feasibility_model(problem, cands)
    solver = deterministic_solver(budget, seed)
    status = solver.solve(model.model)
    log.info("feasibility model (%d variables): %s in %.3g det s", model.num_vars,
             solver.status_name(status), solver.deterministic_time)
    if status == cp_model.INFEASIBLE:
        return "infeasible", None, model.num_vars
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return "unknown", None, model.num_vars
    try:
        chosen = model.extract(solver)
    except ExtractionError:
        return "unknown", None, model.num_vars
    choices = [chosen[t] for t in range(len(cands))]
    note = f"CP-SAT's feasibility model ({model.num_vars:,} variables) found a plan that fits"
    return "feasible", Assignment(choices, "cp-sat feasibility", "feasible", [note]), \
        model.num_vars


def feasibility_status(problem: Problem, budget: float) -> Status:
    """Re-prove a `cp-sat` infeasibility certificate from the problem alone."""
    from planner.candidates import enumerate_candidates

    cands = [enumerate_candidates(problem, t, slow_tiers=True) for t in problem.tables]
    if not all(cands):
        return "infeasible"
    return cpsat_feasible(problem, cands, budget, seed=0)[0]
