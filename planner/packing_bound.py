"""A lower bound from packing the chosen candidates' pieces into the GPUs: dual feasible
functions over the candidate choice.

The average bound (planner/bounds.py) lets the work of the chosen candidates spread over the
GPUs as if it were fluid. It is not: each piece lands whole on one GPU. With 26 table-wise
pieces of about equal size on 8 GPUs some GPU holds four of them, which no average sees.

For a makespan M, each GPU carries its fixed seconds F and the pieces on it (their compute
plus communication; the owner side of the all-to-alls is at least zero), so the pieces on
one GPU have sizes s with sum s <= C = M - F. A dual feasible function f maps [0, 1] to
[0, 1] so that sum x <= 1 implies sum f(x) <= 1; hence over the whole cluster
    sum over the chosen pieces of f(s / C) <= W,
for every such f. Used here: the identity (the average bound again), Fekete and Schepers'
u_k(x) = floor((k + 1) x) / k (x itself where (k + 1) x is an integer; the lower of the
two is taken at a boundary, so rounding never overcounts) for k = 1.._K, and their
threshold functions (1 above 1 - e, 0 below e, x between) for e in _EPS. Every size is
scaled down by (1 - _SAFE) first, far more than the float error of a GPU's summed pieces.

The same holds for memory, whatever M: a GPU's pieces' HBM sums to at most its cap and a
host's pieces' DDR and SSD to theirs, so the same functions (but the identity, which the
totals below say) of each piece's bytes over its bin's cap sum to at most the number of
bins (two 2.15 GB pieces do not share a GPU with 3.5 GB of HBM, though the cluster's total
holds three).

M is impossible when no choice of one candidate per table (among those whose pieces all fit
under C) satisfies all these rows and the cluster's HBM, DDR and SSD totals together. The
LP relaxation of that choice (GLOP, the rows normalised to <= 1 + s, s minimised) finds
rows that cannot all hold; its duals y >= 0 are then checked here, in other arithmetic:
    sum_t min_c sum_r y_r A_r[t, c] > sum_r y_r b_r
proves that no choice satisfies every row (each choice that did would have its y-weighted
sum at most the right side), whatever GLOP's tolerances. Every M found so is below the
optimum; the bound is the largest found in a bisection above the bound already known.
Before the LP, each table's least-work candidate (then the memory-priced one) is tried: when
that choice breaks no packing row, M stands without an LP, and only those candidates' pieces
are read (the whole candidate set's only when an LP runs).

On several hosts (planner/nic_floor.py), at each M the candidates whose heaviest piece's GPU
cannot also carry its host's owner side are left out, and each piece's exposed seconds (its
seconds less its inter-host seconds) over what a GPU has above that floor give the same
functions' rows again; a heavy piece's least owner wait (NicFloor.deficit) is added to the
average row. Leaving candidates out or adding waits can break the average row for the
least-work choice, so the screen then reads that row too before M may stand.

Pipelined steps are not bounded here (a piece's compute side can be negative there): 0.
None of this reads the plan.
"""

import numpy as np
import scipy.sparse as sp
from ortools.linear_solver.python import model_builder as mb

from cost_models import fixed_floors
from planner.candidates import Candidate, Group, Scope
from planner.nic_floor import NicFloor, exposed_seconds
from planner.problem import Problem
from planner.refutation_search import largest_refuted
from planner.relaxation import cluster_caps

# Fekete-Schepers u_k for k = 1.._K, and threshold functions for these e.
_K = 16
_EPS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)
# Below this share of its bin every function but the identity is 0.
_SMALL = min(1 / (_K + 1), min(_EPS))
# Sizes are scaled by (1 - _SAFE) before any function: a margin over float rounding.
_SAFE = 1e-9
# No LP above this many pieces, or this many distinct (candidate, piece) pairs, in all (it
# evaluates every function on every pair).
_MAX_PIECES = 800_000
_MAX_PAIRS = 200_000
# Bisection's relative width and growth steps (planner/refutation_search.py).
_REL_TOL = 1e-4
_GROW_STEPS = 30
# A refutation needs the recomputed Lagrangian above the right side by this much (relative).
_MARGIN = 1e-9


def dff_rows(x: np.ndarray) -> np.ndarray:
    """(R, pairs) values of every dual feasible function at x (already scaled by 1 - _SAFE):
    the identity, u_k for k = 1.._K, then the threshold functions."""
    rows = [x]
    for k in range(1, _K + 1):
        rows.append(np.floor((k + 1) * x * (1 - _SAFE)) / k)
    for e in _EPS:
        rows.append(np.where(x > 1 - e, 1.0, np.where(x >= e, x, 0.0)))
    return np.vstack(rows)


def _piece_array(c: Candidate, nic_bw: float | None) -> np.ndarray:
    """(5, pieces): each piece's seconds (comp + comm), HBM, DDR and SSD bytes, and its
    exposed seconds (planner/nic_floor.py: seconds less inter-host seconds; 0 for a
    world-scope piece, whose share the NIC floor counts, and without `nic_bw`)."""
    def exposed(g: Group) -> np.ndarray:
        if nic_bw is None or c.scope is Scope.WORLD:
            return np.zeros(len(g))
        return exposed_seconds(g, nic_bw)

    return np.vstack([np.concatenate(parts) for parts in zip(
        *[(g.comp + g.comm, g.hbm, g.ddr, g.ssd, exposed(g)) for g in c.groups],
        strict=True)])


class _Pieces:
    """Some candidates' distinct pieces, flat: pair i is a piece of `size[i]` seconds and
    `mem[:, i]` (HBM, DDR, SSD) bytes that the `owner[i]`-th candidate has `count[i]` of."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.n = len(arrays)
        owner = np.repeat(np.arange(self.n), [a.shape[1] for a in arrays])
        keys = np.hstack(arrays)  # (5, pieces): seconds, HBM, DDR, SSD, exposed seconds
        order = np.lexsort((*keys[::-1], owner))  # by owner, then seconds, HBM, DDR, ...
        owner, keys = owner[order], keys[:, order]
        first = np.ones(len(owner), dtype=bool)
        first[1:] = (owner[1:] != owner[:-1]) | (keys[:, 1:] != keys[:, :-1]).any(axis=0)
        starts = np.flatnonzero(first)
        self.owner = owner[starts]
        self.size = keys[0, starts]
        self.mem = keys[1:4, starts]
        self.exposed = keys[4, starts]
        self.count = np.diff(np.append(starts, len(owner))).astype(float)
        # A negative size or byte count (no estimator gives one today) voids the argument.
        self.negative = bool((keys < 0).any())

    def summed(self, vals: np.ndarray) -> np.ndarray:
        """(R, candidates) rows of per-pair values (R, pairs) summed over each candidate's
        pieces."""
        vals = vals * self.count
        out = np.zeros((vals.shape[0], self.n))
        for r in range(vals.shape[0]):
            out[r] = np.bincount(self.owner, weights=vals[r], minlength=self.n)
        return out

    def time_rows(self, cap: float) -> np.ndarray:
        """(R, candidates) each function summed over each candidate's pieces at C = cap."""
        return self.summed(dff_rows(np.minimum(self.size / cap, 1.0) * (1 - _SAFE)))

    def exposed_rows(self, cap: float) -> np.ndarray:
        """(R, candidates) the functions but the identity of each piece's exposed seconds
        over `cap`, what a GPU has left for them above its NIC floor (planner/nic_floor.py),
        summed over each candidate's pieces."""
        return self.summed(dff_rows(np.minimum(self.exposed / cap, 1.0) * (1 - _SAFE))[1:])

    def memory_rows(self, bins: np.ndarray, caps: np.ndarray) -> np.ndarray:
        """(R, candidates) the functions of each piece's bytes over its bin's cap (HBM per
        GPU, DDR and SSD per host), over the bins' count, for the axes with a finite
        positive cap; rows that are zero everywhere left out. A GPU's pieces' HBM sums to at
        most its cap, a host's pieces' DDR and SSD to theirs (partition/state.py), so the
        same functions bound them."""
        rows = []
        for axis in range(3):
            if not (np.isfinite(caps[axis]) and caps[axis] > 0) or not self.mem[axis].any():
                continue
            x = np.minimum(self.mem[axis] / caps[axis], 1.0) * (1 - _SAFE)
            if x.max() < _SMALL:
                continue  # every function but the identity is 0 below both
            # Not the identity: the cluster's totals say what it would.
            summed = self.summed(dff_rows(x)[1:]) / bins[axis]
            rows.append(summed[summed.any(axis=1)])
        return np.vstack(rows) if rows else np.zeros((0, self.n))


def _duals(a: np.ndarray, table: np.ndarray, tables: int) -> np.ndarray | None:
    """GLOP on: min s, one x per table summing to 1, each row a @ x <= 1 + s. The rows'
    duals (>= 0) where s > 0 at the optimum, else None (no row need fail)."""
    rows, n = a.shape
    ones = sp.csr_matrix((np.ones(n), (table, np.arange(n))), shape=(tables, n + 1))
    block = sp.hstack([sp.csr_matrix(a), sp.csr_matrix(-np.ones((rows, 1)))])
    matrix = sp.vstack([ones, block]).tocsr()
    model = mb.ModelBuilder()
    objective = np.zeros(n + 1)
    objective[n] = 1.0
    model.helper.fill_model_from_sparse_data(
        np.concatenate([np.zeros(n), [-1.0]]), np.concatenate([np.ones(n), [np.inf]]),
        objective, np.concatenate([np.ones(tables), np.full(rows, -np.inf)]),
        np.ones(tables + rows), matrix)
    solver = mb.ModelSolver("glop")
    if solver.solve(model) != mb.SolveStatus.OPTIMAL or solver.objective_value <= 0:
        return None
    duals = solver.dual_values(model.get_linear_constraints()[tables:]).to_numpy()
    return np.maximum(-duals, 0.0)


class _Space:
    """The candidates flat (each table's in its own order) with what a test of M reads:
    work, largest piece, memory; their pieces read on demand."""

    def __init__(self, problem: Problem, cands: list[list[Candidate]], memory: bool,
                 prices: np.ndarray | None, nic: bool) -> None:
        hw = problem.hw
        self.cands = cands
        self.flat = [c for cs in cands for c in cs]
        # On several hosts: candidates ruled out by their heaviest piece's GPU's NIC floor
        # (planner/nic_floor.py), per makespan; `nic_used` records whether any was.
        self.nic = NicFloor(problem, cands, memory) if nic else None
        self.nic_used: set[float] = set()
        self.nic_bw = hw.eff_nic_bw if self.nic is not None and self.nic.active else None
        self.emax = (self.nic.flat_mask(self.nic.emax, cands) if self.nic_bw is not None
                     else np.zeros(len(self.flat)))
        self.tables = len(cands)
        self.table = np.repeat(np.arange(len(cands)), [len(cs) for cs in cands])
        self.work = np.array([c.work for c in self.flat])
        self.maxp = np.array([c.max_piece for c in self.flat])
        self.mem = np.array([(c.hbm_total, c.ddr_total, c.ssd_total) for c in self.flat],
                            dtype=float)
        # Each candidate's largest piece's bytes, or more (a host's DDR and SSD: the
        # candidate's total), over its bin's cap: below _SMALL every function but the
        # identity is 0.
        most = np.column_stack([[float(c.max_piece_hbm) for c in self.flat], self.mem[:, 1:]])
        self.gpus = hw.world_size
        self.memory = memory
        self.prices = (np.zeros(3) if prices is None or not memory
                       else np.asarray(prices, dtype=float))
        self.bins = np.array([hw.world_size, hw.hosts, hw.hosts], dtype=float)
        self.bin_caps = np.array([hw.hbm_cap, hw.ddr_cap, hw.ssd_cap], dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.mem_share = np.nan_to_num(
                (most / self.bin_caps).max(axis=1) if memory else np.zeros(len(most)),
                nan=0.0)
        # The screen's choices: least work, then least memory-priced work.
        self.keys = [self.work] + ([self.work + self.mem @ self.prices]
                                   if self.prices.any() else [])
        caps = cluster_caps(hw)
        self.finite = np.flatnonzero(np.isfinite(caps) & (caps > 0))
        self.caps = caps[self.finite]
        self._arrays: dict[int, np.ndarray] = {}
        self._all: tuple[_Pieces, np.ndarray, int] | None = None
        self._all_read = False

    def _array(self, i: int) -> np.ndarray:
        if i not in self._arrays:
            self._arrays[i] = _piece_array(self.flat[i], self.nic_bw)
        return self._arrays[i]

    def _fixed_rows(self, pieces: _Pieces, idx: np.ndarray) -> tuple[np.ndarray, int]:
        """The rows that do not depend on M for candidates idx (pieces' own order): the
        memory functions, then the cluster's totals; and how many are the former."""
        if not self.memory:
            return np.zeros((0, len(idx))), 0
        packing = pieces.memory_rows(self.bins, self.bin_caps)
        return np.vstack([packing, (self.mem[idx][:, self.finite] / self.caps).T]), len(packing)

    def _everything(self) -> tuple[_Pieces, np.ndarray, int] | None:
        """Every candidate's pieces and fixed rows, read once; None above the limits."""
        if not self._all_read:
            self._all_read = True
            if sum(len(g) for c in self.flat for g in c.groups) <= _MAX_PIECES:
                pieces = _Pieces([self._array(i) for i in range(len(self.flat))])
                if len(pieces.size) <= _MAX_PAIRS:
                    self._all = (pieces, *self._fixed_rows(pieces, np.arange(len(self.flat))))
        return self._all

    def _picked(self, key: np.ndarray, allowed: np.ndarray) -> np.ndarray:
        """Per table, its allowed candidate with the least key (the first on ties)."""
        idx = np.flatnonzero(allowed)
        order = idx[np.lexsort((key[idx], self.table[idx]))]  # by table, then by key
        head = np.ones(len(order), dtype=bool)
        head[1:] = self.table[order[1:]] != self.table[order[:-1]]
        return order[head]

    def _exposed(self, pieces: _Pieces, room: float) -> np.ndarray:
        """The exposed-seconds rows over each GPU's room above its NIC floor (none without
        one): every GPU's non-replica pieces' e sum to at most `room`."""
        if room <= 0:
            return np.zeros((0, pieces.n))
        return pieces.exposed_rows(room) / self.gpus

    def refuted(self, m: float, fixed: float) -> bool:
        """Whether no choice of candidates can have makespan m (module docstring)."""
        cap = m - fixed
        if cap <= 0:
            return True
        allowed = self.maxp <= cap
        ruled = np.zeros(len(allowed), dtype=bool)
        room = 0.0  # what each GPU has left above its NIC floor (0: no exposed rows)
        wait = np.zeros(len(allowed))  # each candidate's heavy piece's least owner wait
        if self.nic is not None and self.nic.active:
            ruled = self.nic.flat_mask(
                self.nic.excluded(m, self.nic.class_mask(allowed, self.cands)), self.cands)
            room = self.nic.room if np.isfinite(self.nic.room) else 0.0
            wait = self.nic.flat_mask(self.nic.deficit, self.cands)
            if ruled.any() or wait[allowed & ~ruled].any():
                allowed &= ~ruled
                self.nic_used.add(m)
        if len(np.unique(self.table[allowed])) < self.tables:
            return True  # some table has no candidate whose pieces fit under C
        # When a table's least-work (then memory-priced) candidate keeps every packing row,
        # M is left unrefuted without the LP: a shortcut that only gives up (the LP might
        # still refute M by weighing the packing rows against the work and the cluster's
        # memory totals, which that choice breaks; it costs 0.5 s on 43,000 candidates).
        for key in self.keys:
            pick = self._picked(key, allowed)
            # The average row (the identity) holds for the least-work choice at the bound
            # already proven, but not once candidates are ruled out: then it is read too.
            over = bool(ruled.any() or wait.any()) and float(
                (self.work[pick] + wait[pick]).sum()) > self.gpus * cap
            # Only the candidates with a piece of at least _SMALL of its bin add to a packing
            # row.
            pick = pick[(self.maxp[pick] >= _SMALL * cap) | (self.mem_share[pick] >= _SMALL)
                        | ((room > 0) & (self.emax[pick] >= _SMALL * room))]
            if not len(pick):
                if over:
                    continue
                return False
            if sum(len(g) for i in pick for g in self.flat[i].groups) > _MAX_PIECES:
                return False  # too many to read: M left unrefuted
            pieces = _Pieces([self._array(int(i)) for i in pick])
            if pieces.negative:
                return False  # the functions are defined on [0, 1]: no claim
            timed = pieces.time_rows(cap) / self.gpus
            fixed_rows, packing = self._fixed_rows(pieces, pick)
            rows = np.vstack([timed[1:], self._exposed(pieces, room), fixed_rows[:packing]])
            if not over and not (rows.sum(axis=1) > 1.0).any():
                return False
        everything = self._everything()
        if everything is None:
            return False
        pieces, fixed_rows, _ = everything
        if pieces.negative:
            return False
        timed = pieces.time_rows(cap)
        timed[0] += wait / cap  # the average row: the heavy pieces' GPUs' owner waits too
        a = np.vstack([timed / self.gpus, self._exposed(pieces, room), fixed_rows])[:, allowed]
        table = self.table[allowed]
        y = _duals(a, table, self.tables)
        if y is None:
            return False
        least = np.full(self.tables, np.inf)
        np.minimum.at(least, table, y @ a)
        return float(least.sum()) > float(y.sum()) * (1 + _MARGIN)


def packing_bound(problem: Problem, cands: list[list[Candidate]], known_s: float,
                  prices: np.ndarray | None = None, memory: bool = True, nic: bool = True
                  ) -> float:
    """The largest makespan found refuted above `known_s` (a bound already proven); 0 where
    it refutes nothing above it or the step is pipelined. `prices` (HBM, DDR, SSD per
    byte), where given, pick a choice that may show a makespan possible without the LP (a
    shortcut only). Without `memory` the memory rows are left out (a bound on plans that
    ignore memory, which benchmarks/bound_falsify.py draws). With `nic`, candidates whose
    heaviest piece's GPU cannot also carry its host's NIC floor are left out at each
    makespan (planner/nic_floor.py)."""
    return packing_bound_detail(problem, cands, known_s, prices, memory, nic)[0]


def packing_bound_detail(problem: Problem, cands: list[list[Candidate]], known_s: float,
                         prices: np.ndarray | None = None, memory: bool = True,
                         nic: bool = True) -> tuple[float, bool]:
    """packing_bound's value, and whether the NIC floor ruled a candidate out at it."""
    if problem.model.pipelined or known_s <= 0:
        return 0.0, False
    space = _Space(problem, cands, memory, prices, nic)
    hw = problem.hw
    fixed = fixed_floors(problem.estimator.fixed(), False, hw.constants.pipeline_overlap)[0]
    found = largest_refuted(lambda m: space.refuted(m, fixed), known_s, _GROW_STEPS, _REL_TOL)
    if found is None or not found[1]:
        # Not refuted at all, or every makespan tried refuted: no choice of candidates fits
        # the memory rows at all, which is the infeasibility certificates' business, not a
        # bound's. No claim either way.
        return 0.0, False
    if found[0] <= known_s:
        return 0.0, False
    return found[0], found[0] in space.nic_used
